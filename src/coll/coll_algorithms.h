// The host collectives' algorithms, one named table per collective
// (coll_algorithms.cc). A row says how the ATTN_* setting spells the
// algorithm, the function that runs it on a communicator, and when auto
// picks it; the setting parsers, the auto choosers (algo_select.cc) and the
// dispatch (run_algo.cc) all read the rows. Adding an algorithm: its file
// in src/coll/ with a run function of its collective's signature below,
// one row in its table, and its name in src/core/settings.def (a
// static_assert checks the two agree, so the settings docs stay right).
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "attncomm.h"
#include "src/coll/algo_select.h"
#include "src/core/error.h"
#include "src/core/settings.h"

struct attnComm;

namespace attn {

// What the auto choice weighs; the same on every rank of a communicator, so
// every rank picks the same row.
struct AutoInputs {
  int nranks = 1;
  bool singleCopy = false;         // CollTopo::singleCopy
  bool peersAreProcesses = false;  // CollTopo::peersAreProcesses
  bool allShm = true;              // CollTopo::allShm (this rank's links)
  size_t bytes = 0;                // the whole message (all ranks' blocks together)
  size_t maxBlock = 0;             // all-gather: the largest rank block
  size_t limit = 0;                // all-gather: its direct limit; broadcast: ATTN_STAGE_MAX
  const Hierarchy* hier = nullptr;
  const TierRates* rates = nullptr;
};

template <typename Algo, typename Run>
struct AlgoRow {
  const char* name;   // as the ATTN_* setting spells it
  Algo algo;          // its setting's enumerator is algo + 1 (auto is 0)
  Run run;
  const char* title;  // for the log
  // Auto runs the first row, in table order, where this holds (the last
  // row's always does).
  bool (*autoFits)(const AutoInputs&);
};

// Run functions, one signature per collective (coll_runners.h has them).
// All-gather in place in `buf` (this rank's block filled); byRank[r] is rank r's block.
using AllGatherRun = attnResult_t (*)(attnComm* comm, char* buf, const std::vector<Block>& byRank, size_t esz);
// Reduce-scatter of `in` into `out`, this rank's block; gets attnAvg as
// attnSum (reduceScatterWith divides).
using ReduceScatterRun = attnResult_t (*)(attnComm* comm, const char* in, char* out,
                                          const std::vector<Block>& byRank, attnDataType_t type, attnRedOp_t op);
// Broadcast of `bytes` from `root`; on the root `buf` holds them.
using BroadcastRun = attnResult_t (*)(attnComm* comm, int root, char* buf, size_t bytes, size_t esz);
// Reduce of `count` elements to the root's `out` (attnAvg divided there).
using ReduceRun = attnResult_t (*)(attnComm* comm, int root, const char* in, char* out, size_t count,
                                   attnDataType_t type, attnRedOp_t op);
// All-reduce of `count` elements (attnAvg divided); `s` is ATTN_ALGO's value.
using AllReduceRun = attnResult_t (*)(attnComm* comm, AlgoSetting s, const char* in, char* out, size_t count,
                                      attnDataType_t type, attnRedOp_t op);
// All-to-all's schedule is an argument of pairwiseAllToAllv: no function.
using AllToAllRun = std::nullptr_t;

using AllGatherRow = AlgoRow<CollAlgo, AllGatherRun>;
using ReduceScatterRow = AlgoRow<CollAlgo, ReduceScatterRun>;
using BroadcastRow = AlgoRow<BroadcastAlgo, BroadcastRun>;
using ReduceRow = AlgoRow<ReduceAlgo, ReduceRun>;
using AllReduceRow = AlgoRow<AllReduceAlgo, AllReduceRun>;
using AllToAllRow = AlgoRow<AllToAllSchedule, AllToAllRun>;

// The tables. ATTN_ALGO's names are all-gather's (reduce-scatter has no
// direct row: the ring runs under that name).
std::span<const AllGatherRow> allGatherAlgorithms();
std::span<const ReduceScatterRow> reduceScatterAlgorithms();
std::span<const BroadcastRow> broadcastAlgorithms();
std::span<const ReduceRow> reduceAlgorithms();
std::span<const AllReduceRow> allReduceAlgorithms();
std::span<const AllToAllRow> allToAllSchedules();

// Reads the enum setting `s` whose names are `namesByAlgo` (index = algo):
// *index 0 for auto (unset, empty or "auto"), else algo + 1. Another value
// is attnInvalidArgument listing the names, auto last.
attnResult_t readAlgoName(Setting s, const std::vector<const char*>& namesByAlgo, int* index);

template <typename Row>
std::vector<const char*> namesByAlgo(std::span<const Row> rows) {
  std::vector<const char*> names(rows.size());
  for (const Row& r : rows) names[size_t(r.algo)] = r.name;
  return names;
}

// The setting's value (kAuto first) from a table's names.
template <typename T, typename Row>
attnResult_t readAlgoSettingFrom(Setting s, std::span<const Row> rows, T* out) {
  int index = 0;
  ATTN_CHECK(readAlgoName(s, namesByAlgo(rows), &index));
  *out = static_cast<T>(index);
  return attnSuccess;
}

// The row of `a`; nullptr when the table has none.
template <typename Row, typename Algo>
const Row* findAlgo(std::span<const Row> rows, Algo a) {
  for (const Row& r : rows)
    if (r.algo == a) return &r;
  return nullptr;
}

// Auto's pick: the first row that fits.
template <typename Row>
const Row& autoPick(std::span<const Row> rows, const AutoInputs& in) {
  for (const Row& r : rows)
    if (r.autoFits(in)) return r;
  return rows.back();
}

}  // namespace attn
