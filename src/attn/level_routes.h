// Who carries whose keys in attnLevelAttention: a tree per sender over the
// hosts and racks of the fabric model, so each block crosses each slow
// boundary once (CSPS's hierarchical exchange). From sender s to rank r:
//   - same host: straight to r;
//   - same rack, other host: to r's host relay for s, which passes it on;
//   - other rack: to r's rack relay for s, which passes it to its host
//     mates and to one relay per other host of its rack, which pass it on.
// Relays are spread over a group's ranks by sender (member s % size).
#pragma once

#include <string>
#include <vector>

namespace attn {

class LevelRoutes {
 public:
  LevelRoutes() = default;
  // hostOf / rackOf: ids per rank ("" rack: the host is its own rack).
  LevelRoutes(const std::vector<std::string>& hostOf, const std::vector<std::string>& rackOf);

  int nranks() const { return static_cast<int>(host_.size()); }
  // The rank r receives s's block from (s itself, or a relay). r != s.
  int parent(int s, int r) const;
  // The rank s sends r's copy to: r, or the relay whose subtree holds r.
  int firstHop(int s, int r) const;
  // The ranks x passes s's block on to (empty for most).
  std::vector<int> children(int s, int x) const;

 private:
  std::vector<int> host_, rack_;                       // group index of each rank
  std::vector<std::vector<int>> hostMembers_, rackMembers_;  // ascending ranks
};

}  // namespace attn
