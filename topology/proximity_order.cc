#include "topology/proximity_order.h"

#include <algorithm>
#include <map>

namespace attn {

std::vector<int> proximityOrder(const std::vector<ProximityKey>& keys) {
  const int n = int(keys.size());
  // Rank of first appearance of each rack and (rack, host): groups keep the
  // order of their lowest rank, so rank 0's rack and host come first.
  std::map<std::string, int> rackFirst;
  std::map<std::pair<std::string, std::string>, int> hostFirst;
  for (int r = 0; r < n; ++r) {
    rackFirst.emplace(keys[r].rack, r);
    hostFirst.emplace(std::make_pair(keys[r].rack, keys[r].host), r);
  }
  std::vector<int> order(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) order[size_t(r)] = r;
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    const ProximityKey &ka = keys[size_t(a)], &kb = keys[size_t(b)];
    int ra = rackFirst[ka.rack], rb = rackFirst[kb.rack];
    if (ra != rb) return ra < rb;
    int ha = hostFirst[{ka.rack, ka.host}], hb = hostFirst[{kb.rack, kb.host}];
    if (ha != hb) return ha < hb;
    if (ka.numa != kb.numa) return ka.numa < kb.numa;
    if (ka.device != kb.device) return ka.device < kb.device;
    return a < b;
  });
  return order;
}

ProximityGroups proximityGroups(const std::vector<ProximityKey>& keys,
                                const std::vector<int>& order) {
  ProximityGroups g;
  g.hostOf.assign(keys.size(), -1);
  g.rackOf.assign(keys.size(), -1);
  for (size_t i = 0; i < order.size(); ++i) {
    int r = order[i];
    const ProximityKey& k = keys[size_t(r)];
    bool newRack = i == 0 || keys[size_t(order[i - 1])].rack != k.rack;
    bool newHost = newRack || keys[size_t(order[i - 1])].host != k.host;
    if (newRack) g.racks.emplace_back();
    if (newHost) {
      g.hosts.emplace_back();
      g.hostLeaders.push_back(r);
    }
    g.racks.back().push_back(r);
    g.hosts.back().push_back(r);
    g.rackOf[size_t(r)] = int(g.racks.size()) - 1;
    g.hostOf[size_t(r)] = int(g.hosts.size()) - 1;
  }
  return g;
}

}  // namespace attn
