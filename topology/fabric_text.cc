#include <cstdio>
#include <cstring>
#include <sstream>

#include "topology/fabric_print.h"

namespace attn {

std::string formatBandwidth(double b) {
  char buf[32];
  if (b >= 1e9) std::snprintf(buf, sizeof(buf), "%.2f GB/s", b / 1e9);
  else std::snprintf(buf, sizeof(buf), "%.1f MB/s", b / 1e6);
  return buf;
}

std::string formatLatency(double s) {
  char buf[32];
  if (s < 1e-3) std::snprintf(buf, sizeof(buf), "%.1f us", s * 1e6);
  else std::snprintf(buf, sizeof(buf), "%.2f ms", s * 1e3);
  return buf;
}

namespace {
std::string shortHost(const std::string& host) { return host.substr(0, host.find('/')); }
std::string field(const char* s, size_t cap) {
  std::string v(s, strnlen(s, cap));
  return v.empty() ? "-" : v;
}
}  // namespace

std::string fabricToText(const FabricModel& m) {
  std::ostringstream o;
  const ProximityGroups& g = m.groups();
  o << "attncomm topology: " << m.nranks() << " rank(s), " << g.hosts.size() << " host(s), "
    << g.racks.size() << " rack(s)\n";
  long pairs[kTierCount];
  m.pairCounts(pairs);
  o << "tiers (bandwidth, latency, source; rank pairs at that tier):\n";
  for (int i = 0; i < kTierCount; ++i) {
    const TierLink& t = m.tiers[i];
    char line[256];
    std::snprintf(line, sizeof(line), "  %-8s %12s %10s  %-32s %ld pair(s)\n", tierName(Tier(i)),
                  formatBandwidth(t.bandwidth).c_str(), formatLatency(t.latency).c_str(),
                  t.source.c_str(), pairs[i]);
    o << line;
  }
  o << "ranks in proximity order (rack, host, NUMA node, GPU):\n";
  char head[256];
  std::snprintf(head, sizeof(head), "  %4s %4s  %-12s %-20s %4s %5s %-14s %-12s %8s %4s\n", "topo", "rank",
                "rack", "host", "numa", "cpus", "gpu", "nic", "Gbit/s", "rdma");
  o << head;
  for (int r : m.order()) {
    const RankPlace& p = m.ranks[size_t(r)];
    const LocalSummary& s = p.local;
    char line[320];
    std::snprintf(line, sizeof(line), "  %4d %4d  %-12s %-20s %4d %5d %-14s %-12s %8.1f %4s\n", m.topoRank(r), r,
                  p.rack.empty() ? "-" : p.rack.c_str(), shortHost(p.host).c_str(), s.numaNode, s.boundCpus,
                  field(s.gpuBusId, sizeof(s.gpuBusId)).c_str(), field(s.bestNic, sizeof(s.bestNic)).c_str(),
                  s.bestNicGbps, s.rdmaNicCount > 0 ? "yes" : "no");
    o << line;
  }
  o << "host leaders:";
  for (int r : g.hostLeaders) o << " " << r;
  o << "\n";
  if (!m.localText.empty()) {
    o << "local view of rank " << m.selfRank << ":\n";
    std::istringstream in(m.localText);
    for (std::string line; std::getline(in, line);) o << "  " << line << "\n";
  }
  return o.str();
}

}  // namespace attn
