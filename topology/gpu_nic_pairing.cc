// Which NIC each GPU should use: the one NCCL would pair with it. Nearest in
// the PCI tree wins (two hops: the same switch); without PCI distances (sysfs,
// or a NIC outside the tree) a NIC on the GPU's NUMA node.
#include "topology/local_view.h"

namespace attn {

std::vector<int> pairGpusWithNics(const MachineView& m) {
  std::vector<int> pair(m.gpus.size(), -1);
  std::vector<int> load(m.nics.size(), 0);
  for (size_t g = 0; g < m.gpus.size(); ++g) {
    // Distance class: PCI hops when known, then "same NUMA node", else none.
    auto distance = [&](const NicInfo& n) -> long {
      int h = g < n.hopsToGpu.size() ? n.hopsToGpu[g] : -1;
      if (h >= 0) return h;
      if (n.numaNode >= 0 && n.numaNode == m.gpus[g].numaNode) return 1L << 20;
      return -1;
    };
    int best = -1;
    long bestDist = -1;
    for (size_t i = 0; i < m.nics.size(); ++i) {
      long d = distance(m.nics[i]);
      if (d < 0) continue;
      if (best >= 0) {
        const NicInfo& a = m.nics[i];
        const NicInfo& b = m.nics[size_t(best)];
        if (d != bestDist) {
          if (d > bestDist) continue;
        } else if (a.rdma != b.rdma) {
          if (!a.rdma) continue;
        } else if (load[i] != load[size_t(best)]) {
          if (load[i] > load[size_t(best)]) continue;
        } else if (a.rateGbps <= b.rateGbps) {
          continue;  // ties keep the first in PCI order
        }
      }
      best = int(i);
      bestDist = d;
    }
    pair[g] = best;
    if (best >= 0) ++load[size_t(best)];
  }
  return pair;
}

}  // namespace attn
