// NCCL_TOPO_FILE / ATTN_NCCL_TOPO_FILE: a file from the cloud image or the
// user, parsed by libxml2 and walked into a MachineView. No input may crash,
// loop or allocate without bound; what parses must respect the bounds, have
// one distance per NIC and GPU, pair, lay over a live view, and describe.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "topology/local_view.h"
#include "topology/nccl_topo_xml.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1 << 16)) return 0;  // files are read whole; size is not the point
  const std::string text(reinterpret_cast<const char*>(data), size);
  attn::MachineView file;
  std::string err;
  if (!attn::parseNcclTopoXml(text, "fuzz.xml", &file, &err)) {
    if (err.rfind("fuzz.xml:", 0) != 0 || err.find('\n') != std::string::npos) std::abort();
    return 0;
  }
  using L = attn::NcclTopoLimits;
  if (file.gpus.size() > size_t(L::kMaxGpus) || file.nics.size() > size_t(L::kMaxNics) ||
      file.numa.size() > size_t(L::kMaxNuma))
    std::abort();
  for (const attn::NicInfo& n : file.nics) {
    if (n.hopsToGpu.size() != file.gpus.size()) std::abort();
    for (int h : n.hopsToGpu)
      if (h < 0 || h > 2 * L::kMaxDepth + 2) std::abort();
  }
  std::vector<int> pairs = attn::pairGpusWithNics(file);
  for (int p : pairs)
    if (p >= int(file.nics.size())) std::abort();

  // Over a small live view, as discovery does.
  attn::MachineView live;
  live.source = "sysfs";
  live.numa = {{0, {0, 1}}};
  live.gpus = {{"0000:17:00.0", "10de:2330", 0}};
  live.nics.resize(1);
  live.nics[0].busId = "0000:18:00.0";
  live.nics[0].netdev = "eth0";
  live.nics[0].hopsToGpu = {2};
  attn::overlayNcclTopo(file, &live);
  for (const attn::NicInfo& n : live.nics)
    if (n.hopsToGpu.size() != live.gpus.size()) std::abort();
  attn::LocalView v;
  v.machine = live;
  v.gpu = live.gpus.empty() ? -1 : 0;
  (void)attn::describeLocalView(v);
  return 0;
}
