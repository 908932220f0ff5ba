#include "src/attn/level_routes.h"

#include <algorithm>

namespace attn {
namespace {

// Group index of each id, and each group's members in rank order.
void groupBy(const std::vector<std::string>& ids, std::vector<int>* of,
             std::vector<std::vector<int>>* members) {
  std::vector<std::string> seen;
  of->resize(ids.size());
  for (size_t r = 0; r < ids.size(); ++r) {
    auto it = std::find(seen.begin(), seen.end(), ids[r]);
    (*of)[r] = static_cast<int>(it - seen.begin());
    if (it == seen.end()) {
      seen.push_back(ids[r]);
      members->emplace_back();
    }
    (*members)[(*of)[r]].push_back(static_cast<int>(r));
  }
}

int pick(const std::vector<int>& members, int sender) {
  return members[static_cast<size_t>(sender) % members.size()];
}

}  // namespace

LevelRoutes::LevelRoutes(const std::vector<std::string>& hostOf, const std::vector<std::string>& rackOf) {
  groupBy(hostOf, &host_, &hostMembers_);
  std::vector<std::string> racks(hostOf.size());
  for (size_t r = 0; r < hostOf.size(); ++r)
    racks[r] = rackOf[r].empty() ? "host:" + hostOf[r] : "rack:" + rackOf[r];
  groupBy(racks, &rack_, &rackMembers_);
}

int LevelRoutes::parent(int s, int r) const {
  if (host_[s] == host_[r]) return s;
  const int hostRelay = pick(hostMembers_[host_[r]], s);
  if (rack_[s] == rack_[r]) return r == hostRelay ? s : hostRelay;
  const int rackRelay = pick(rackMembers_[rack_[r]], s);
  if (r == rackRelay) return s;
  if (host_[r] == host_[rackRelay]) return rackRelay;
  return r == hostRelay ? rackRelay : hostRelay;
}

int LevelRoutes::firstHop(int s, int r) const {
  for (int x = r;;) {  // at most three steps up: host relay, rack relay, s
    const int p = parent(s, x);
    if (p == s) return x;
    x = p;
  }
}

std::vector<int> LevelRoutes::children(int s, int x) const {
  std::vector<int> out;
  for (int r = 0; r < nranks(); ++r)
    if (r != s && r != x && parent(s, r) == x) out.push_back(r);
  return out;
}

}  // namespace attn
