#include "src/coll/algo_select.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "src/coll/coll_algorithms.h"
#include "src/core/comm.h"
#include "src/core/settings.h"
#include "src/core/error.h"
#include "src/core/log.h"
#include "topology/fabric_model.h"

namespace attn {

namespace {

double rateAt(const std::vector<double>& v, size_t i) {
  return v.empty() ? 1e9 : v[std::min(i, v.size() - 1)];
}

}  // namespace

// The setting parsers take their names from the tables (coll_algorithms.h).
attnResult_t readAlgoSetting(AlgoSetting* out) {
  return readAlgoSettingFrom(Setting::kAlgo, allGatherAlgorithms(), out);
}

attnResult_t readAllToAllSetting(AllToAllSetting* out) {
  return readAlgoSettingFrom(Setting::kAllToAll, allToAllSchedules(), out);
}

attnResult_t readReduceSetting(ReduceSetting* out) {
  return readAlgoSettingFrom(Setting::kReduceAlgo, reduceAlgorithms(), out);
}

attnResult_t readAllReduceSetting(AllReduceSetting* out) {
  return readAlgoSettingFrom(Setting::kAllReduceAlgo, allReduceAlgorithms(), out);
}

attnResult_t readBroadcastSetting(BroadcastSetting* out) {
  return readAlgoSettingFrom(Setting::kBroadcastAlgo, broadcastAlgorithms(), out);
}

// The choosers: a named algorithm (the setting's value less one), else the
// table's auto pick.
ReduceAlgo chooseReduceAlgo(ReduceSetting s, int nranks, bool singleCopy, size_t bytes) {
  if (nranks < 2) return ReduceAlgo::kChain;  // one rank: a copy
  if (s != ReduceSetting::kAuto) return static_cast<ReduceAlgo>(int(s) - 1);
  AutoInputs in;
  in.nranks = nranks;
  in.singleCopy = singleCopy;
  in.bytes = bytes;
  return autoPick(reduceAlgorithms(), in).algo;
}

BroadcastAlgo chooseBroadcastAlgo(BroadcastSetting s, int nranks, bool peersAreProcesses, size_t bytes,
                                  size_t stageMax) {
  if (s != BroadcastSetting::kAuto) return static_cast<BroadcastAlgo>(int(s) - 1);
  AutoInputs in;
  in.nranks = nranks;
  in.peersAreProcesses = peersAreProcesses;
  in.bytes = bytes;
  in.limit = stageMax;
  return autoPick(broadcastAlgorithms(), in).algo;
}

AllReduceAlgo chooseAllReduceAlgo(AllReduceSetting s, int nranks, bool singleCopy, size_t bytes) {
  if (nranks < 2) return AllReduceAlgo::kDoubling;  // one rank: a copy
  if (s != AllReduceSetting::kAuto) return static_cast<AllReduceAlgo>(int(s) - 1);
  AutoInputs in;
  in.nranks = nranks;
  in.singleCopy = singleCopy;
  in.bytes = bytes;
  return autoPick(allReduceAlgorithms(), in).algo;
}

AllToAllSchedule chooseAllToAllSchedule(AllToAllSetting s, bool allShm, size_t maxBlock) {
  if (s != AllToAllSetting::kAuto) return static_cast<AllToAllSchedule>(int(s) - 1);
  AutoInputs in;
  in.allShm = allShm;
  in.maxBlock = maxBlock;
  return autoPick(allToAllSchedules(), in).algo;
}

TierRates defaultTierRates() {
  TierRates r;
  r.bytesPerSec = {8e9, 1.25e9, 1.25e9};
  r.latencySec = {2e-6, 30e-6, 30e-6};
  return r;
}

double flatRingSeconds(const Hierarchy& h, size_t totalBytes, const TierRates& rates) {
  const int n = h.nranks;
  if (n <= 1) return 0;
  // The ring is paced by the slowest boundary it crosses: the outermost
  // tier with more than one group (boundary index = tier + 1).
  size_t slow = 0;
  for (size_t t = 0; t < h.groupsPerTier.size(); ++t)
    if (h.groupsPerTier[t] > 1) slow = t + 1;
  const double blk = static_cast<double>(totalBytes) / n;
  return (n - 1) * (blk / rateAt(rates.bytesPerSec, slow) + rateAt(rates.latencySec, slow));
}

double hierSeconds(const Hierarchy& h, size_t totalBytes, const TierRates& rates) {
  if (!h.regular) return std::numeric_limits<double>::infinity();
  if (h.nranks <= 1) return 0;
  const double blk = static_cast<double>(totalBytes) / h.nranks;
  double t = 0, sharers = 1;
  for (int k = 0; k < h.levels(); ++k) {
    // Every rank of a level-k subgroup runs its own rail over the same
    // boundary, so they share its rate.
    const size_t b = static_cast<size_t>(h.tierOfLevel[k]);
    t += slicesAbove(h, k) * (h.shape[k] - 1) *
         (blk * sharers / rateAt(rates.bytesPerSec, b) + rateAt(rates.latencySec, b));
    sharers *= h.shape[k];
  }
  return t;
}

namespace {
AutoInputs modelInputs(const Hierarchy& h, size_t totalBytes, const TierRates& rates) {
  AutoInputs in;
  in.nranks = h.nranks;
  in.bytes = totalBytes;
  in.hier = &h;
  in.rates = &rates;
  return in;
}
}  // namespace

CollAlgo chooseAlgo(AlgoSetting s, const Hierarchy& h, size_t totalBytes, const TierRates& rates) {
  // kDirect is all-gather's alone; the others run the ring under it. Hier
  // needs a regular hierarchy, even when named.
  if (s == AlgoSetting::kRing || s == AlgoSetting::kDirect || !h.regular) return CollAlgo::kRing;
  if (s == AlgoSetting::kHier) return CollAlgo::kHier;
  return autoPick(reduceScatterAlgorithms(), modelInputs(h, totalBytes, rates)).algo;
}

size_t readStageMaxBlock() {
  static_assert(settingDefault(Setting::kStageMax) == int64_t(kStageMaxBlock));
  return static_cast<size_t>(settingInt<Setting::kStageMax>());  // >= 0
}

CollAlgo chooseAllGatherAlgo(AlgoSetting s, const Hierarchy& h, bool singleCopy, size_t maxBlock,
                             size_t totalBytes, const TierRates& rates, size_t directMax) {
  if (s == AlgoSetting::kDirect) return CollAlgo::kDirect;
  if (s != AlgoSetting::kAuto) return chooseAlgo(s, h, totalBytes, rates);
  AutoInputs in = modelInputs(h, totalBytes, rates);
  in.singleCopy = singleCopy;
  in.maxBlock = maxBlock;
  in.limit = directMax;
  return autoPick(allGatherAlgorithms(), in).algo;
}

TierRates tierRatesFor(const attnComm* comm) {
  // The fabric model's tiers (defaults per transport, the init probe, or
  // ATTN_TOPO_FILE), where it has a figure; our defaults elsewhere.
  TierRates r = defaultTierRates();
  if (!comm || !comm->fabric) return r;
  const Tier tiers[] = {Tier::kHost, Tier::kRack, Tier::kCluster};
  for (int i = 0; i < 3; ++i) {
    const TierLink& l = comm->fabric->tiers[static_cast<int>(tiers[i])];
    if (l.bandwidth > 0) r.bytesPerSec[i] = l.bandwidth;
    if (l.bandwidth > 0 && l.latency >= 0) r.latencySec[i] = l.latency;
  }
  return r;
}

CollTopo& collTopo(attnComm* comm) {
  // Every collective asks: once made, this is one acquire load, not a lock.
  std::call_once(comm->collTopoOnce, [comm] {
    auto t = std::make_shared<CollTopo>();
    const int n = comm->nranks;
    std::vector<TierKeys> keys(n);
    for (int r = 0; r < n; ++r) keys[r] = {comm->peers[r].rackHash, comm->peers[r].hostHash};
    std::vector<int> order = comm->topoOrder;
    if (static_cast<int>(order.size()) != n) {
      order.resize(n);
      for (int r = 0; r < n; ++r) order[r] = r;
    }
    t->hier = buildHierarchy(keys, order);
    t->ring.ranks = order;
    t->ring.pos = static_cast<int>(std::find(order.begin(), order.end(), comm->rank) - order.begin());
    t->rates = tierRatesFor(comm);
    // Every rank sees the same hosts, and a link's transport is the same at
    // both ends, so every rank reaches the same answer.
    t->singleCopy = n > 1;
    for (int r = 0; r < n; ++r) {
      if (r == comm->rank) continue;
      const bool shm = std::strcmp(comm->engine->transportName(r), "shm") == 0;
      if (!shm) t->allShm = false;
      if (!shm || comm->peers[r].hostHash != comm->peers[comm->rank].hostHash) t->singleCopy = false;
    }
    // Every rank knows every pid, so this too is the same on every rank.
    t->peersAreProcesses = t->singleCopy;
    for (int r = 0; r < n; ++r)
      if (r != comm->rank && comm->peers[r].pid == comm->peers[comm->rank].pid)
        t->peersAreProcesses = false;
    ATTN_INFO(kLogColl, "hierarchy %s; ring in proximity order", t->hier.describe().c_str());
    comm->collTopo = std::move(t);
  });
  return *comm->collTopo;
}

CollAlgo pickAlgo(attnComm* comm, AlgoSetting s, int collIndex, const char* coll,
                  size_t totalBytes, size_t maxBlock) {
  const CollTopo& t = collTopo(comm);
  const bool allGather = collIndex == 0;
  const size_t directMax =
      t.peersAreProcesses ? std::max(kDirectMaxBlock, readStageMaxBlock()) : kDirectMaxBlock;
  CollAlgo a = allGather ? chooseAllGatherAlgo(s, t.hier, t.singleCopy, maxBlock, totalBytes,
                                               t.rates, directMax)
                         : chooseAlgo(s, t.hier, totalBytes, t.rates);
  unsigned bit = 1u << (collIndex * 3 + static_cast<int>(a));
  if (!(comm->collTopo->logged & bit)) {
    comm->collTopo->logged |= bit;
    const char* why = s == AlgoSetting::kRing     ? "ATTN_ALGO=ring"
                      : s == AlgoSetting::kDirect ? "ATTN_ALGO=direct"
                      : a == CollAlgo::kDirect && maxBlock <= kAllGatherDirectSmallMax
                          ? "small blocks: each straight to every peer, one message time"
                      : a == CollAlgo::kDirect    ? "one host, single-copy shm, blocks within the direct limit"
                      : !t.hier.regular           ? "hierarchy irregular"
                      : s == AlgoSetting::kHier   ? "ATTN_ALGO=hier"
                      : !t.hier.worthwhile()      ? "single tier"
                                                  : "cost model";
    const char* name = findAlgo(allGatherAlgorithms(), a)->title;
    ATTN_INFO(kLogColl, "%s: %s (%s; %s; model for %zu bytes: ring %.3g s, hier %.3g s)", coll, name,
              why, t.hier.describe().c_str(), totalBytes, flatRingSeconds(t.hier, totalBytes, t.rates),
              hierSeconds(t.hier, totalBytes, t.rates));
  }
  return a;
}

AllToAllSchedule pickAllToAllSchedule(attnComm* comm, AllToAllSetting s, size_t maxBlock) {
  const CollTopo& t = collTopo(comm);
  const AllToAllSchedule a = chooseAllToAllSchedule(s, t.allShm, maxBlock);
  const unsigned bit = 1u << static_cast<int>(a);
  if (!(comm->collTopo->loggedAllToAll & bit)) {
    comm->collTopo->loggedAllToAll |= bit;
    ATTN_INFO(kLogColl, "AllToAll: %s (%s; largest block %zu bytes)",
              findAlgo(allToAllSchedules(), a)->title,
              s != AllToAllSetting::kAuto ? settingName(Setting::kAllToAll)
              : t.allShm                  ? "every peer by shm"
                                          : "some peer not by shm",
              maxBlock);
  }
  return a;
}

ReduceAlgo pickReduceAlgo(attnComm* comm, ReduceSetting s, size_t bytes) {
  const CollTopo& t = collTopo(comm);
  const ReduceAlgo a = chooseReduceAlgo(s, comm->nranks, t.singleCopy, bytes);
  const unsigned bit = 1u << static_cast<unsigned>(a);
  if (!(comm->collTopo->loggedReduce & bit)) {
    comm->collTopo->loggedReduce |= bit;
    const char* name = findAlgo(reduceAlgorithms(), a)->title;
    const char* why = s != ReduceSetting::kAuto      ? settingName(Setting::kReduceAlgo)
                      : a == ReduceAlgo::kDirect      ? "small message, few ranks on one host over shm"
                      : a == ReduceAlgo::kTree        ? "small message"
                      : t.singleCopy                  ? "one host, single-copy shm"
                                                      : "not all peers on this host by shm";
    ATTN_INFO(kLogColl, "Reduce: %s (%s; %zu bytes)", name, why, bytes);
  }
  return a;
}

AllReduceAlgo pickAllReduceAlgo(attnComm* comm, AllReduceSetting s, size_t bytes) {
  const CollTopo& t = collTopo(comm);
  const AllReduceAlgo a = chooseAllReduceAlgo(s, comm->nranks, t.singleCopy, bytes);
  const unsigned bit = 1u << static_cast<unsigned>(a);
  if (!(comm->collTopo->loggedAllReduce & bit)) {
    comm->collTopo->loggedAllReduce |= bit;
    ATTN_INFO(kLogColl, "AllReduce: %s (%s; %zu bytes)",
              findAlgo(allReduceAlgorithms(), a)->title,
              s != AllReduceSetting::kAuto ? settingName(Setting::kAllReduceAlgo)
              : a == AllReduceAlgo::kDoubling ? "small message"
                                             : "large message",
              bytes);
  }
  return a;
}

BroadcastAlgo pickBroadcastAlgo(attnComm* comm, BroadcastSetting s, size_t bytes) {
  const CollTopo& t = collTopo(comm);
  const BroadcastAlgo a = chooseBroadcastAlgo(s, comm->nranks, t.peersAreProcesses, bytes, readStageMaxBlock());
  const unsigned bit = 1u << static_cast<unsigned>(a);
  if (!(comm->collTopo->loggedBroadcast & bit)) {
    comm->collTopo->loggedBroadcast |= bit;
    ATTN_INFO(kLogColl, "Broadcast: %s (%s; %zu bytes)",
              findAlgo(broadcastAlgorithms(), a)->title,
              s != BroadcastSetting::kAuto   ? settingName(Setting::kBroadcastAlgo)
              : bytes <= kBroadcastSmallMax  ? (a == BroadcastAlgo::kTree ? "small message, many ranks"
                                                                          : "small message, few ranks")
              : a == BroadcastAlgo::kDirect  ? "processes of one host, single-copy shm"
                                             : "peers not processes of one host, or past ATTN_STAGE_MAX",
              bytes);
  }
  return a;
}

std::vector<Block> blocksByRing(const Ring& ring, const std::vector<Block>& byRank) {
  std::vector<Block> out(ring.size());
  for (int i = 0; i < ring.size(); ++i) out[i] = byRank[ring.ranks[i]];
  return out;
}

}  // namespace attn
