#include "topology/fabric_model.h"

#include <algorithm>
#include <cstring>

namespace attn {

namespace {
const char* const kTierNames[kTierCount] = {"device", "host", "rack", "cluster"};
// Rack key of a host without a rack id: its own rack. The \x01 keeps it
// apart from any rack name a user can type.
const char kOwnRackPrefix[] = "\x01host:";
}  // namespace

const char* tierName(Tier t) {
  int i = int(t);
  return i >= 0 && i < kTierCount ? kTierNames[i] : "?";
}

bool parseTierName(const std::string& s, Tier* out) {
  for (int i = 0; i < kTierCount; ++i)
    if (s == kTierNames[i]) {
      *out = Tier(i);
      return true;
    }
  return false;
}

Tier FabricModel::tierBetween(int a, int b) const {
  const RankPlace &x = ranks[size_t(a)], &y = ranks[size_t(b)];
  if (x.host == y.host) {
    bool sameGpu = x.local.gpuBusId[0] != '\0' &&
                   std::strncmp(x.local.gpuBusId, y.local.gpuBusId, sizeof(x.local.gpuBusId)) == 0;
    return sameGpu ? Tier::kDevice : Tier::kHost;
  }
  if (!x.rack.empty() && x.rack == y.rack) return Tier::kRack;
  return Tier::kCluster;
}

ProximityKey FabricModel::keyOf(int r) const {
  const RankPlace& p = ranks[size_t(r)];
  ProximityKey k;
  k.host = p.host;
  k.rack = p.rack.empty() ? kOwnRackPrefix + p.host : p.rack;
  k.numa = p.local.numaNode;
  k.device.assign(p.local.gpuBusId, strnlen(p.local.gpuBusId, sizeof(p.local.gpuBusId)));
  return k;
}

void FabricModel::finalize() {
  std::vector<ProximityKey> keys;
  for (int r = 0; r < nranks(); ++r) keys.push_back(keyOf(r));
  order_ = proximityOrder(keys);
  groups_ = proximityGroups(keys, order_);
  topoRank_.assign(ranks.size(), -1);
  for (size_t i = 0; i < order_.size(); ++i) topoRank_[size_t(order_[i])] = int(i);
}

bool FabricModel::representativePair(Tier t, int* a, int* b) const {
  if (order_.empty()) return false;
  int first = order_[0];
  for (int r : order_)
    if (r != first && tierBetween(first, r) == t) {
      *a = first;
      *b = r;
      return true;
    }
  return false;
}

void FabricModel::pairCounts(long counts[kTierCount]) const {
  for (int i = 0; i < kTierCount; ++i) counts[i] = 0;
  for (int a = 0; a < nranks(); ++a)
    for (int b = a + 1; b < nranks(); ++b) counts[int(tierBetween(a, b))]++;
}

void applyDefaultTiers(FabricModel* m, const TransportSet& t) {
  // Figures are round numbers for a current server, not measurements: the
  // probe or a file replaces them when they matter.
  const TierLink shm{8e9, 1e-6, "default shm"};
  const TierLink loopback{2.5e9, 15e-6, "default tcp (loopback)"};
  double slowestGbps = 0;
  bool allRdma = !m->ranks.empty();
  for (const RankPlace& p : m->ranks) {
    double g = p.local.bestNicGbps;
    if (g > 0 && (slowestGbps == 0 || g < slowestGbps)) slowestGbps = g;
    allRdma = allRdma && p.local.rdmaNicCount > 0;
  }
  TierLink net;
  if (t.ucx && allRdma) {
    double gbps = slowestGbps > 0 ? slowestGbps : 100.0;
    net = {gbps * 1e9 / 8 * 0.9, 3e-6, "default ucx (RDMA)"};
  } else {
    double gbps = slowestGbps > 0 ? slowestGbps : 10.0;
    net = {gbps * 1e9 / 8 * 0.9, 25e-6, "default tcp"};
  }
  const TierLink& local = t.shm ? shm : loopback;
  m->tiers[int(Tier::kDevice)] = local;
  m->tiers[int(Tier::kHost)] = local;
  m->tiers[int(Tier::kRack)] = net;
  m->tiers[int(Tier::kCluster)] = {net.bandwidth / 2, net.latency * 2, net.source + ", 2:1 spine"};
}

}  // namespace attn
