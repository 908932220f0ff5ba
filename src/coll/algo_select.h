// Which algorithm runs all-gather / reduce-scatter / all-reduce: the flat
// ring in proximity order, the hierarchical (rail) one, or (all-gather
// only) the direct one.
//
// ATTN_ALGO=ring|hier|direct|auto (default auto), read at every call so a
// launcher or perf binary may set it before any collective. auto compares a
// simple cost model of ring and hier (bytes over the slowest boundary each
// crosses, plus per-step latency) using per-tier rates from the
// communicator's fabric model (topology/), through tierRatesFor().
//
// Direct all-gather: every rank reads every peer's block at once (one step,
// no forwarding). It moves the same bytes as the ring, but only pays off
// where the receiver copies straight out of the sender's buffer (shm: CMA
// or memcpy), so no rank waits for a block to be forwarded to it: auto picks
// it when every rank is on one host, every link is shm and blocks are at
// most kDirectMaxBlock (beyond that the ring is as fast and gentler on the
// caches). Over TCP it measured no better than the ring.
//
// Staged direct all-gather: when the peers are other processes that read
// shareable memory through a mapping (shm transport, ATTN_SHM_MAP), a rank
// whose block is in ordinary memory first copies it into a shareable
// staging buffer kept on the communicator. One local memcpy then replaces
// N-1 process_vm_readv reads by N-1 memcpy reads, which is worth it because
// every peer reads the same block (all-to-all sends each block once, so
// staging it only adds a copy: measured slower). auto then keeps the direct
// algorithm for blocks up to ATTN_STAGE_MAX (default kStageMaxBlock;
// beyond it the ring measured as fast).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "attncomm.h"
#include "src/coll/coll.h"
#include "src/coll/hierarchy.h"
#include "src/core/shareable_memory.h"

struct attnComm;

namespace attn {

enum class AlgoSetting { kAuto, kRing, kHier, kDirect };
enum class CollAlgo { kRing, kHier, kDirect };
constexpr size_t kDirectMaxBlock = size_t(2) << 20;
// All-gather of small blocks over any transport: every block straight to
// every peer (one message time) instead of a ring's n - 1 in a row
// (perf/RESULTS.md section 16).
constexpr size_t kAllGatherDirectSmallMax = size_t(4) << 10;
constexpr int kAllGatherDirectMaxRanks = 16;
constexpr size_t kStageMaxBlock = size_t(32) << 20;
// ATTN_STAGE_MAX in bytes (0: never stage); kStageMaxBlock when unset.
size_t readStageMaxBlock();

// Parses ATTN_ALGO (unset or empty: auto). Unknown value: attnInvalidArgument.
attnResult_t readAlgoSetting(AlgoSetting* out);

// Rate and per-message latency of each boundary, innermost first:
// [0] between ranks of one host, [1] between hosts (of a rack), [2] between
// racks. Missing outer entries repeat the last one.
struct TierRates {
  std::vector<double> bytesPerSec;
  std::vector<double> latencySec;
};
// Defaults (shared memory, 10 Gbit/s hosts, 10 Gbit/s racks) for tiers the
// fabric model has no figure for.
TierRates defaultTierRates();

// Modelled seconds to all-gather (or reduce-scatter) `totalBytes` (all
// ranks' blocks together) with each algorithm.
double flatRingSeconds(const Hierarchy& h, size_t totalBytes, const TierRates& rates);
double hierSeconds(const Hierarchy& h, size_t totalBytes, const TierRates& rates);
// The algorithm to run (kHier only when the hierarchy is regular and
// worthwhile; an explicit "hier" on an irregular one runs the ring).
CollAlgo chooseAlgo(AlgoSetting s, const Hierarchy& h, size_t totalBytes, const TierRates& rates);

// All-gather: the direct algorithm where `s` asks for it, or auto finds
// single-copy links (`singleCopy`) and blocks of at most `directMax`
// (kDirectMaxBlock, or the staging limit where staging applies); else
// chooseAlgo's answer.
CollAlgo chooseAllGatherAlgo(AlgoSetting s, const Hierarchy& h, bool singleCopy, size_t maxBlock,
                             size_t totalBytes, const TierRates& rates,
                             size_t directMax = kDirectMaxBlock);

// Per-communicator view used by the collectives, built on first use from
// comm->peers (rack, host keys) and comm->topoOrder.
struct CollTopo {
  Hierarchy hier;
  Ring ring;           // flat ring in proximity order
  TierRates rates;
  bool singleCopy = false;  // one host, shm to every peer (see direct all-gather)
  bool peersAreProcesses = false;  // singleCopy, and no peer is a thread of this process
  bool allShm = true;       // this rank reaches every peer by shm (all-to-all schedule)
  unsigned logged = 0;  // (collective, algorithm) pairs already logged
  unsigned loggedAllToAll = 0;  // all-to-all schedules already logged
  unsigned loggedReduce = 0;    // reduce algorithms already logged
  unsigned loggedAllReduce = 0;  // all-reduce algorithms already logged
  unsigned loggedBroadcast = 0;  // broadcast algorithms already logged
  // The staged direct all-gather's copy of this rank's block: peers keep
  // their mapping of it from call to call. Collectives on one communicator
  // run one at a time, so one buffer serves them all.
  ShareableBuffer staging;
};
CollTopo& collTopo(attnComm* comm);
// Rates for this communicator: the fabric model's tiers (host, rack,
// cluster), defaults where it has none.
TierRates tierRatesFor(const attnComm* comm);

// Picks the algorithm of one call (logs each new choice once per
// communicator at INFO, COLL). `collIndex` says which collective (only
// all-gather may run direct); `coll` is a short name for the log;
// `maxBlock` the largest rank block (all-gather's direct choice).
enum CollIndex { kAllGatherIdx = 0, kReduceScatterIdx = 1, kAllReduceIdx = 2, kReduceIdx = 3 };
CollAlgo pickAlgo(attnComm* comm, AlgoSetting s, int collIndex, const char* coll,
                  size_t totalBytes, size_t maxBlock = 0);

// All-to-all(v) schedule (coll.h): ATTN_ALLTOALL=concurrent|stepped|auto
// (default auto). auto steps when this rank reaches some peer by a
// transport other than shm and its largest block is at least
// kSteppedMinBlock: over loopback TCP, 4 ranks on 2 cores, one pair per
// step measured 5-15% faster than all at once (perf/RESULTS.md §1); over
// shm the concurrent schedule was faster.
enum class AllToAllSetting { kAuto, kConcurrent, kStepped };
constexpr size_t kSteppedMinBlock = size_t(256) << 10;
attnResult_t readAllToAllSetting(AllToAllSetting* out);
AllToAllSchedule chooseAllToAllSchedule(AllToAllSetting s, bool allShm, size_t maxBlock);
// The schedule for this rank of `comm` (logs each new choice once at INFO).
AllToAllSchedule pickAllToAllSchedule(attnComm* comm, AllToAllSetting s, size_t maxBlock);

// Blocks listed by rank, reordered by ring position.
std::vector<Block> blocksByRing(const Ring& ring, const std::vector<Block>& byRank);

// The public collectives' bodies (src/coll/run_algo.cc): pick the algorithm
// (`coll` names the call in the log) and run it. byRank[r] = rank r's block.
// all-gather: in place in `buf`, this rank's block filled on entry.
attnResult_t runAllGather(attnComm* comm, AlgoSetting s, const char* coll, char* buf,
                          const std::vector<Block>& byRank, size_t elemSize);
// reduce-scatter: `out` (may alias this rank's block of `in`) gets op over
// all ranks of this rank's block.
attnResult_t runReduceScatter(attnComm* comm, AlgoSetting s, const char* coll, const char* in,
                              char* out, const std::vector<Block>& byRank, attnDataType_t type,
                              attnRedOp_t op);
// The same, by algorithm `a` (its row of coll_algorithms.h's table; a
// reduce-scatter asked for direct runs the ring). attnAvg divides.
attnResult_t allGatherWith(attnComm* comm, CollAlgo a, char* buf, const std::vector<Block>& byRank,
                           size_t elemSize);
attnResult_t reduceScatterWith(attnComm* comm, CollAlgo a, const char* in, char* out,
                               const std::vector<Block>& byRank, attnDataType_t type, attnRedOp_t op);
// Broadcast: ATTN_BROADCAST_ALGO=tree|chain|direct|auto (default auto),
// read at every call. tree: a binomial tree over the proximity order,
// ceil(log2 n) message steps. chain: pipelined along the ring in rank order
// from the root. direct: the root sends to every rank at once, one message
// step (between processes of one host its data staged into shareable
// memory, so the N-1 reads are memcpy from mappings in parallel). auto,
// where each measured fastest (perf/RESULTS.md §1, Broadcast): up to
// kBroadcastSmallMax bytes direct between at most kBroadcastDirectMaxRanks
// ranks and the tree beyond (the root's n-1 sends grow with n, the tree's
// steps with log2 n); above it direct where the staged all-gather would be
// (peersAreProcesses) up to ATTN_STAGE_MAX; else the chain.
enum class BroadcastSetting { kAuto, kTree, kChain, kDirect };
enum class BroadcastAlgo { kTree, kChain, kDirect };
constexpr size_t kBroadcastSmallMax = size_t(32) << 10;
constexpr int kBroadcastDirectMaxRanks = 16;
attnResult_t readBroadcastSetting(BroadcastSetting* out);
BroadcastAlgo chooseBroadcastAlgo(BroadcastSetting s, int nranks, bool peersAreProcesses, size_t bytes,
                                  size_t stageMax);
// The choice for this communicator (logs each new one once at INFO).
BroadcastAlgo pickBroadcastAlgo(attnComm* comm, BroadcastSetting s, size_t bytes);
// broadcast of `bytes` from `root` by pickBroadcastAlgo's algorithm: on
// the root `buf` holds them on entry.
attnResult_t runBroadcast(attnComm* comm, BroadcastSetting s, int root, char* buf, size_t bytes,
                          size_t elemSize);
// Reduce: ATTN_REDUCE_ALGO=direct|tree|chain|scatter|auto (default auto),
// read at every call. direct: every rank sends its input to the root, which
// folds them all (one message step). tree: a binomial tree over the
// proximity order, log2(n) message steps. chain: the pipelined chain along
// the proximity ring, turned so that it ends at the root. scatter: a
// reduce-scatter (the all-reduce's algorithm) and a gather of the slices to
// the root. auto, where each measured fastest (perf/RESULTS.md §1, Reduce),
// between 3+ ranks: direct up to kReduceDirectMax bytes between at most
// kReduceDirectMaxRanks ranks of one host over single-copy shm; the tree up
// to kReduceTreeMax bytes; above it scatter up to kReduceScatterMax bytes on
// one host over shm; else the chain.
enum class ReduceSetting { kAuto, kTree, kChain, kScatter, kDirect };
enum class ReduceAlgo { kTree, kChain, kScatter, kDirect };
constexpr size_t kReduceDirectMax = size_t(128) << 10;
constexpr int kReduceDirectMaxRanks = 16;
constexpr size_t kReduceTreeMax = size_t(256) << 10;
constexpr size_t kReduceScatterMin = kReduceTreeMax + 1;
constexpr size_t kReduceScatterMax = size_t(2) << 20;
attnResult_t readReduceSetting(ReduceSetting* out);
ReduceAlgo chooseReduceAlgo(ReduceSetting s, int nranks, bool singleCopy, size_t bytes);
// The choice for this communicator (logs each new one once at INFO).
ReduceAlgo pickReduceAlgo(attnComm* comm, ReduceSetting s, size_t bytes);
// reduce of `count` elements to `root`; `out` is the root's (ignored
// elsewhere); attnAvg divides there.
attnResult_t runReduce(attnComm* comm, ReduceSetting s, int root, const char* in, char* out, size_t count,
                       attnDataType_t type, attnRedOp_t op);
// All-reduce: ATTN_ALLREDUCE_ALGO=doubling|scatter|auto (default auto), read
// at every call. doubling: recursive doubling over the proximity order,
// ceil(log2 n) steps that each move the whole buffer (small messages: the
// cost is the number of steps). scatter: a reduce-scatter then an
// all-gather, each by ATTN_ALGO's algorithm (large messages: each rank
// moves 2(n-1)/n of the buffer). auto, where each measured fastest
// (perf/RESULTS.md §1, All-reduce): doubling up to kAllReduceDoublingShmMax
// bytes on one host over single-copy shm, up to kAllReduceDoublingMax
// elsewhere (tcp), else scatter.
enum class AllReduceSetting { kAuto, kDoubling, kScatter };
enum class AllReduceAlgo { kDoubling, kScatter };
constexpr size_t kAllReduceDoublingShmMax = size_t(32) << 10;
constexpr size_t kAllReduceDoublingMax = size_t(256) << 10;
attnResult_t readAllReduceSetting(AllReduceSetting* out);
AllReduceAlgo chooseAllReduceAlgo(AllReduceSetting s, int nranks, bool singleCopy, size_t bytes);
// The choice for this communicator (logs each new one once at INFO).
AllReduceAlgo pickAllReduceAlgo(attnComm* comm, AllReduceSetting s, size_t bytes);
// all-reduce of `count` elements by the algorithm pickAllReduceAlgo names;
// `s` is ATTN_ALGO for the scatter one. attnAvg divides at the end
// (doubling) or each rank's share in between (scatter).
attnResult_t runAllReduce(attnComm* comm, AllReduceSetting ar, AlgoSetting s, const char* in, char* out,
                          size_t count, attnDataType_t type, attnRedOp_t op);

}  // namespace attn
