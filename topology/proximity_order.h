// Proximity-aware rank order: rack, then host (server), then NUMA node and
// device (GPU), then original rank. Rings that follow it cross each rack
// boundary and each host boundary only twice (out and back), the fewest a
// ring can. A pure function of the keys, so every rank that holds the same
// all-gathered keys derives the same order.
#pragma once

#include <string>
#include <vector>

namespace attn {

struct ProximityKey {
  std::string rack;    // rack key (never "": unknown racks get a per-host key)
  std::string host;    // host key
  int numa = -1;       // NUMA node on the host
  std::string device;  // GPU bus id ("" none)
};

// keys[r] belongs to rank r. Racks come in the order of their lowest rank,
// hosts within a rack likewise, then ranks of a host by (NUMA node, device,
// rank). Returns the ranks in that order.
std::vector<int> proximityOrder(const std::vector<ProximityKey>& keys);

// Groups along an order: consecutive runs of the same host / rack.
struct ProximityGroups {
  std::vector<std::vector<int>> hosts;  // ranks of each host, in proximity order
  std::vector<std::vector<int>> racks;  // ranks of each rack, in proximity order
  std::vector<int> hostLeaders;         // first rank of each host
  std::vector<int> hostOf;              // rank -> index in hosts
  std::vector<int> rackOf;              // rank -> index in racks
};
ProximityGroups proximityGroups(const std::vector<ProximityKey>& keys,
                                const std::vector<int>& order);

}  // namespace attn
