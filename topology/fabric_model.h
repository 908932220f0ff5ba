// The fabric model of a communicator: where every rank sits (rack, host,
// NUMA node, GPU, NICs — from the all-gathered LocalSummary), the tier
// between any two ranks, and each tier's bandwidth and latency.
//
// Tiers, nearest first: kDevice (same host and same GPU) < kHost (same host)
// < kRack (different hosts, same known rack) < kCluster (anything else; a
// host without a rack id is its own rack). Figures start from defaults per
// transport (applyDefaultTiers), may be measured by the init probe
// (ATTN_TOPO_PROBE=1) and overridden from a file (fabric_json.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "topology/local_view.h"
#include "topology/proximity_order.h"

namespace attn {

enum class Tier : int { kDevice = 0, kHost = 1, kRack = 2, kCluster = 3 };
constexpr int kTierCount = 4;
const char* tierName(Tier t);                          // "device", "host", ...
bool parseTierName(const std::string& s, Tier* out);

struct TierLink {
  double bandwidth = 0;  // bytes per second
  double latency = 0;    // seconds
  std::string source;    // "default tcp", "probe", "file", ...
  bool fromFile = false;  // set by an override file: the probe leaves it alone
};

struct RankPlace {
  int rank = -1;
  int64_t pid = 0;
  std::string host;  // host id (ATTN_HOSTID, else hostname/boot id)
  std::string rack;  // rack id ("" unknown)
  LocalSummary local{};
};

// Which transports serve the tiers (for the defaults).
struct TransportSet {
  bool shm = false;
  bool tcp = false;
  bool ucx = false;  // RDMA through UCX, used when every host has an RDMA NIC
};

class FabricModel {
 public:
  std::vector<RankPlace> ranks;  // ranks[r].rank == r
  TierLink tiers[kTierCount];
  std::string localText;         // the owning rank's LocalView description ("" none)
  int selfRank = -1;             // the owning rank (-1: loaded from a file)

  int nranks() const { return int(ranks.size()); }
  Tier tierBetween(int a, int b) const;
  const TierLink& link(Tier t) const { return tiers[int(t)]; }
  // Keys of the proximity order ("" racks become a per-host key).
  ProximityKey keyOf(int r) const;
  // Recomputes order and groups from the ranks; call after changing them.
  void finalize();
  const std::vector<int>& order() const { return order_; }
  const ProximityGroups& groups() const { return groups_; }
  int topoRank(int r) const { return topoRank_[size_t(r)]; }
  // A pair of ranks at tier t (the first rank in proximity order and the
  // nearest rank at that tier from it), or false when no pair is that far.
  bool representativePair(Tier t, int* a, int* b) const;
  // Number of unordered rank pairs at each tier.
  void pairCounts(long counts[kTierCount]) const;

 private:
  std::vector<int> order_;
  std::vector<int> topoRank_;
  ProximityGroups groups_;
};

// Fills every tier from the transport that serves it: shm within a host
// (TCP loopback without shm), UCX/RDMA between hosts when allowed and every
// rank has an RDMA NIC, else TCP at the slowest best-NIC rate (10 Gbit/s
// when unknown). kCluster assumes a 2:1 oversubscribed spine: half the rack
// bandwidth, twice the latency.
void applyDefaultTiers(FabricModel* m, const TransportSet& transports);

}  // namespace attn
