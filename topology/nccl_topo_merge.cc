// An NCCL topology file laid over the discovered machine. On a cloud VM the
// PCI scan sees a flat virtual tree (every GPU and NIC its own root), so the
// file's tree decides NUMA placement and GPU-NIC distances; the live scan
// still knows device names (mlx5_0, ib0), link rates and cores.
#include <map>

#include "topology/nccl_topo_xml.h"

namespace attn {

namespace {

int liveNicFor(const NicInfo& f, const MachineView& live, std::vector<bool>* used) {
  for (size_t i = 0; i < live.nics.size(); ++i) {
    const NicInfo& n = live.nics[i];
    if ((*used)[i]) continue;
    bool sameBus = !f.busId.empty() && n.busId == f.busId;
    bool sameName = f.busId.empty() && !f.name().empty() &&
                    (n.rdmaDevice == f.name() || n.netdev == f.name());
    if (sameBus || sameName) {
      (*used)[i] = true;
      return int(i);
    }
  }
  return -1;
}

}  // namespace

void overlayNcclTopo(const MachineView& file, MachineView* live) {
  MachineView m;
  m.source = live->source.empty() ? file.source : live->source + " + " + file.source;
  m.cores = live->cores;
  m.pus = live->pus;
  m.rdmaNote = live->rdmaNote;
  m.warnings = live->warnings;

  // NUMA nodes: the file's; a node without an affinity keeps the live CPUs.
  m.numa = file.numa.empty() ? live->numa : file.numa;
  for (NumaInfo& n : m.numa)
    for (const NumaInfo& l : live->numa)
      if (n.cpus.empty() && l.os == n.os) n.cpus = l.cpus;

  // GPUs: the file's (live names by bus id), then live ones it does not list.
  std::map<std::string, size_t> liveGpu;
  for (size_t i = 0; i < live->gpus.size(); ++i) liveGpu[live->gpus[i].busId] = i;
  std::vector<int> fromLive;  // merged GPU -> live GPU index, -1 from the file only
  for (const GpuInfo& g : file.gpus) {
    m.gpus.push_back(g);
    auto it = liveGpu.find(g.busId);
    fromLive.push_back(it == liveGpu.end() ? -1 : int(it->second));
    if (it != liveGpu.end()) {
      m.gpus.back().name = live->gpus[it->second].name;
      liveGpu.erase(it);
    }
  }
  const size_t fileGpus = file.gpus.size();
  for (size_t i = 0; i < live->gpus.size(); ++i)
    if (liveGpu.count(live->gpus[i].busId)) {
      m.gpus.push_back(live->gpus[i]);
      fromLive.push_back(int(i));
    }

  // Hops: the file's between its own devices, the live scan's between live ones.
  auto hopsFor = [&](const NicInfo* f, const NicInfo* l, NicInfo* out) {
    out->hopsToGpu.assign(m.gpus.size(), -1);
    for (size_t g = 0; g < m.gpus.size(); ++g) {
      if (f && g < fileGpus && g < f->hopsToGpu.size()) out->hopsToGpu[g] = f->hopsToGpu[g];
      else if (l && fromLive[g] >= 0 && size_t(fromLive[g]) < l->hopsToGpu.size())
        out->hopsToGpu[g] = l->hopsToGpu[size_t(fromLive[g])];
    }
  };
  std::vector<bool> used(live->nics.size(), false);
  for (const NicInfo& f : file.nics) {
    NicInfo n = f;
    int li = liveNicFor(f, *live, &used);
    const NicInfo* l = li >= 0 ? &live->nics[size_t(li)] : nullptr;
    if (l) {
      // The live names win: they are what verbs and sockets open.
      if (!l->rdmaDevice.empty()) n.rdmaDevice = l->rdmaDevice;
      if (!l->netdev.empty()) n.netdev = l->netdev;
      if (n.busId.empty()) n.busId = l->busId;
      if (l->rateGbps > 0) n.rateGbps = l->rateGbps;
      if (!l->linkLayer.empty()) n.linkLayer = l->linkLayer;
      n.activePorts = l->activePorts;
      n.rdma = l->rdma;
    }
    hopsFor(&f, l, &n);
    m.nics.push_back(n);
  }
  for (size_t i = 0; i < live->nics.size(); ++i) {
    if (used[i]) continue;
    NicInfo n = live->nics[i];
    hopsFor(nullptr, &live->nics[i], &n);
    m.nics.push_back(n);
  }
  *live = std::move(m);
}

}  // namespace attn
