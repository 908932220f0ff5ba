#include <cstring>
#include <sstream>

#include "topology/fabric_print.h"
#include "topology/json.h"

namespace attn {

namespace {
const char* const kTierColor[kTierCount] = {"darkgreen", "blue", "orange", "red"};
}

std::string fabricAsGraphviz(const FabricModel& m) {
  std::ostringstream o;
  // DOT strings quote like JSON strings ("..." with \" and \\ escaped).
  o << "graph attncomm_topology {\n  graph [fontname=\"Helvetica\", compound=true];\n"
    << "  node [shape=box, style=rounded, fontname=\"Helvetica\", fontsize=10];\n";
  const ProximityGroups& g = m.groups();
  for (size_t k = 0; k < g.racks.size(); ++k) {
    const RankPlace& first = m.ranks[size_t(g.racks[k][0])];
    o << "  subgraph cluster_rack" << k << " {\n    label=" << jsonQuote("rack " + (first.rack.empty() ? std::string("(none)") : first.rack))
      << "; style=dashed; color=gray40;\n";
    for (size_t h = 0; h < g.hosts.size(); ++h) {
      if (g.rackOf[size_t(g.hosts[h][0])] != int(k)) continue;
      const RankPlace& hp = m.ranks[size_t(g.hosts[h][0])];
      o << "    subgraph cluster_host" << h << " {\n      label=" << jsonQuote("host " + hp.host.substr(0, hp.host.find('/')))
        << "; style=rounded; color=gray20;\n";
      for (int r : g.hosts[h]) {
        const LocalSummary& s = m.ranks[size_t(r)].local;
        // Real newlines: jsonQuote turns them into DOT's \n escape.
        std::string label = "rank " + std::to_string(r) + " (topo " + std::to_string(m.topoRank(r)) + ")\nNUMA " +
                            std::to_string(s.numaNode);
        if (s.gpuBusId[0]) label += "\nGPU " + std::string(s.gpuBusId, strnlen(s.gpuBusId, sizeof(s.gpuBusId)));
        if (s.bestNic[0])
          label += "\nNIC " + std::string(s.bestNic, strnlen(s.bestNic, sizeof(s.bestNic))) +
                   (s.rdmaNicCount ? " (RDMA)" : "");
        o << "      r" << r << " [label=" << jsonQuote(label) << "];\n";
      }
      o << "    }\n";
    }
    o << "  }\n";
  }
  // The proximity ring; each edge coloured by the tier it crosses.
  const auto& ord = m.order();
  if (ord.size() > 1) {
    for (size_t i = 0; i < ord.size(); ++i) {
      int a = ord[i], b = ord[(i + 1) % ord.size()];
      if (ord.size() == 2 && i == 1) break;
      Tier t = m.tierBetween(a, b);
      o << "  r" << a << " -- r" << b << " [color=" << kTierColor[int(t)] << ", label=\"" << tierName(t)
        << "\", fontsize=8];\n";
    }
  }
  o << "  legend [shape=note, fontsize=9, label=\"tiers\\l";
  for (int i = 0; i < kTierCount; ++i)
    o << tierName(Tier(i)) << " (" << kTierColor[i] << "): " << formatBandwidth(m.tiers[i].bandwidth) << ", "
      << formatLatency(m.tiers[i].latency) << "\\l";
  o << "\"];\n}\n";
  return o.str();
}

}  // namespace attn
