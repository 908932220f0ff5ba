#include "topology/local_view.h"

#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <sstream>

#include "topology/nccl_topo_xml.h"

namespace attn {

namespace {

std::vector<int> currentBinding() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

int numaOfCpu(const MachineView& m, int cpu) {
  for (const NumaInfo& n : m.numa)
    if (std::find(n.cpus.begin(), n.cpus.end(), cpu) != n.cpus.end()) return n.os;
  return -1;
}

// RDMA first (the fast path), then the NIC paired with the rank's GPU, then
// nearest to that GPU, then on the rank's NUMA node, then the fastest link;
// ties by position (PCI order).
int pickBestNic(const LocalView& v) {
  int best = -1;
  std::vector<int> pairs = pairGpusWithNics(v.machine);
  int paired = v.gpu >= 0 ? pairs[size_t(v.gpu)] : -1;
  auto better = [&](const NicInfo& a, const NicInfo& b) {
    if (a.rdma != b.rdma) return a.rdma;
    bool pa = paired >= 0 && &a == &v.machine.nics[size_t(paired)];
    bool pb = paired >= 0 && &b == &v.machine.nics[size_t(paired)];
    if (pa != pb) return pa;
    if (v.gpu >= 0) {
      int ha = a.hopsToGpu.size() > size_t(v.gpu) ? a.hopsToGpu[v.gpu] : -1;
      int hb = b.hopsToGpu.size() > size_t(v.gpu) ? b.hopsToGpu[v.gpu] : -1;
      if (ha != hb) return ha >= 0 && (hb < 0 || ha < hb);
    }
    bool la = a.numaNode >= 0 && a.numaNode == v.numaNode;
    bool lb = b.numaNode >= 0 && b.numaNode == v.numaNode;
    if (la != lb) return la;
    return a.rateGbps > b.rateGbps;
  };
  for (size_t i = 0; i < v.machine.nics.size(); ++i)
    if (best < 0 || better(v.machine.nics[i], v.machine.nics[size_t(best)])) best = int(i);
  return best;
}

void copyText(char* dst, size_t cap, const std::string& s) {
  std::memset(dst, 0, cap);
  std::strncpy(dst, s.c_str(), cap - 1);
}

}  // namespace

MachineView discoverMachine(const DiscoveryOptions& opts) {
  MachineView m;
  bool hwloc = discoverWithHwloc(&m);
  if (!hwloc) {
    m = MachineView{};
    discoverWithSysfs(&m);
  }
  // hwloc falls back to this machine, silently, when it cannot load the file.
  if (!opts.hwlocXmlFile.empty() && (!hwloc || (m.thisSystem && !opts.hwlocThisSystem)))
    m.warnings.push_back("HWLOC_XMLFILE=" + opts.hwlocXmlFile + ": hwloc could not load it" +
                         (hwloc ? "" : " (no hwloc in this build)") + "; topology discovered from " +
                         m.source + " on this machine instead");
  if (!opts.ncclTopoFile.empty()) {
    MachineView file;
    std::string err;
    if (loadNcclTopoFile(opts.ncclTopoFile, &file, &err))
      overlayNcclTopo(file, &m);
    else
      m.warnings.push_back(opts.ncclTopoVar + " not used: " + err);
  }
  discoverVerbs(&m);
  return m;
}

const MachineView& machineView(const DiscoveryOptions& opts) {
  static std::once_flag once;
  static MachineView m;
  std::call_once(once, [&] { m = discoverMachine(opts); });
  return m;
}

bool LocalView::hasRdma() const {
  for (const NicInfo& n : machine.nics)
    if (n.rdma) return true;
  return false;
}

LocalView discoverLocalView(const DiscoveryOptions& opts) {
  LocalView v;
  v.machine = machineView(opts);
  v.boundCpus = currentBinding();
  std::set<int> nodes;
  for (int c : v.boundCpus) {
    int n = numaOfCpu(v.machine, c);
    if (n >= 0) nodes.insert(n);
  }
  if (nodes.size() == 1) {
    v.numaNode = *nodes.begin();
    v.numaBound = true;
  } else {
    int cpu = sched_getcpu();  // unbound: where the thread runs now
    v.numaNode = cpu >= 0 ? numaOfCpu(v.machine, cpu) : -1;
    if (v.numaNode < 0 && !v.machine.numa.empty()) v.numaNode = v.machine.numa[0].os;
    v.numaBound = v.machine.numa.size() == 1 && !v.boundCpus.empty();
  }
  for (size_t g = 0; g < v.machine.gpus.size() && v.gpu < 0; ++g)
    if (v.machine.gpus[g].numaNode == v.numaNode) v.gpu = int(g);
  if (v.gpu < 0 && !v.machine.gpus.empty()) v.gpu = 0;
  v.bestNic = pickBestNic(v);
  return v;
}

LocalSummary summarize(const LocalView& v) {
  LocalSummary s;
  std::memset(&s, 0, sizeof(s));
  s.numaNode = v.numaNode;
  s.numaNodes = int32_t(v.machine.numa.size());
  s.boundCpus = int32_t(v.boundCpus.size());
  s.cores = v.machine.cores;
  s.gpuCount = int32_t(v.machine.gpus.size());
  s.nicCount = int32_t(v.machine.nics.size());
  for (const NicInfo& n : v.machine.nics) s.rdmaNicCount += n.rdma ? 1 : 0;
  s.numaBound = v.numaBound ? 1 : 0;
  if (v.gpu >= 0) copyText(s.gpuBusId, sizeof(s.gpuBusId), v.machine.gpus[size_t(v.gpu)].busId);
  if (v.bestNic >= 0) {
    const NicInfo& n = v.machine.nics[size_t(v.bestNic)];
    copyText(s.bestNic, sizeof(s.bestNic), n.name());
    s.bestNicGbps = n.rateGbps;
  }
  return s;
}

std::string cpuListString(const std::vector<int>& cpus) {
  std::vector<int> c = cpus;
  std::sort(c.begin(), c.end());
  std::string out;
  for (size_t i = 0; i < c.size();) {
    size_t j = i;
    while (j + 1 < c.size() && c[j + 1] == c[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(c[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(c[j]);
    }
    i = j + 1;
  }
  return out;
}

std::vector<int> parseCpuList(const std::string& s) {
  std::vector<int> cpus;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) {
    int a = 0, b = 0;
    if (part.find('-') != std::string::npos) {
      if (std::sscanf(part.c_str(), "%d-%d", &a, &b) == 2 && a >= 0 && b >= a && b - a < 65536)
        for (int c = a; c <= b; ++c) cpus.push_back(c);
    } else if (std::sscanf(part.c_str(), "%d", &a) == 1 && a >= 0) {
      cpus.push_back(a);
    }
  }
  return cpus;
}

std::string describeLocalView(const LocalView& v) {
  const MachineView& m = v.machine;
  std::ostringstream o;
  o << "machine (" << m.source << "): " << m.cores << " cores, " << m.pus << " PUs, "
    << m.numa.size() << " NUMA node(s)\n";
  for (const NumaInfo& n : m.numa)
    o << "  NUMA node " << n.os << ": cpus " << cpuListString(n.cpus) << "\n";
  o << "this rank: cpus " << cpuListString(v.boundCpus) << ", NUMA node " << v.numaNode
    << (v.numaBound ? "" : " (not bound to one node)") << "\n";
  if (m.gpus.empty()) o << "GPUs: none\n";
  for (size_t g = 0; g < m.gpus.size(); ++g)
    o << "  GPU " << g << ": " << m.gpus[g].busId << " " << m.gpus[g].name << ", NUMA node "
      << m.gpus[g].numaNode << (int(g) == v.gpu ? "  <- this rank" : "") << "\n";
  if (m.nics.empty()) o << "NICs: none\n";
  for (size_t i = 0; i < m.nics.size(); ++i) {
    const NicInfo& n = m.nics[i];
    o << "  NIC " << i << ": " << n.name();
    if (!n.netdev.empty() && n.netdev != n.name()) o << " (" << n.netdev << ")";
    o << " pci " << (n.busId.empty() ? "-" : n.busId) << ", NUMA node " << n.numaNode;
    if (n.rateGbps > 0) o << ", " << n.rateGbps << " Gbit/s";
    else o << ", rate unknown";
    o << (n.rdma ? ", RDMA " + n.linkLayer + " (" + std::to_string(n.activePorts) + " active port(s))"
                 : ", no RDMA");
    if (v.gpu >= 0 && size_t(v.gpu) < n.hopsToGpu.size() && n.hopsToGpu[size_t(v.gpu)] >= 0)
      o << ", " << n.hopsToGpu[size_t(v.gpu)] << " PCI hop(s) to this rank's GPU";
    o << (n.numaNode >= 0 && n.numaNode == v.numaNode ? ", local to this rank's NUMA node" : "");
    o << (int(i) == v.bestNic ? "  <- best" : "") << "\n";
  }
  if (!v.hasRdma())
    o << "RDMA: " << (m.rdmaNote.empty() ? "no RDMA devices" : m.rdmaNote) << "\n";
  std::vector<int> pairs = pairGpusWithNics(m);
  if (!m.gpus.empty()) o << "GPU-NIC pairs:\n";
  for (size_t g = 0; g < m.gpus.size(); ++g) {
    o << "  GPU " << m.gpus[g].busId << " -> ";
    if (pairs[g] < 0) {
      o << "no NIC, NUMA node " << m.gpus[g].numaNode << "\n";
      continue;
    }
    const NicInfo& n = m.nics[size_t(pairs[g])];
    int h = g < n.hopsToGpu.size() ? n.hopsToGpu[g] : -1;
    std::string bus = n.busId.empty() ? "-" : n.busId;
    o << "NIC " << (n.name() == n.busId ? "pci " + bus : n.name() + " (pci " + bus + ")") << ", NUMA node "
      << m.gpus[g].numaNode << ", " << (h >= 0 ? std::to_string(h) + " PCI hop(s)" : "no PCI path known") << "\n";
  }
  for (const std::string& w : m.warnings) o << "warning: " << w << "\n";
  return o.str();
}

}  // namespace attn
