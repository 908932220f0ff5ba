// The library's internal entry to the standard collectives on host memory:
// arguments already validated by the C API (src/api/api_coll.cc), no handle
// check, no queueing, no signature exchange. The C API's host path runs it
// after its signature exchange; a device backend that stages through
// pinned host memory (src/device/backends/staging_backend.cc) runs it on its
// proxy thread. Neither re-enters the public API.
#pragma once

#include <cstddef>
#include <vector>

#include "attncomm.h"
#include "src/coll/algo_select.h"
#include "src/coll/signature.h"

struct attnComm;

namespace attn {

// The algorithm settings a collective runs with, read once at the call on
// the caller's thread (ATTN_ALGO and friends, algo_select.h) so a queued or
// staged run uses what was set when it was called.
struct CollSettings {
  AlgoSetting algo = AlgoSetting::kAuto;
  AllReduceSetting allReduce = AllReduceSetting::kAuto;
  BroadcastSetting broadcast = BroadcastSetting::kAuto;
  ReduceSetting reduce = ReduceSetting::kAuto;
  AllToAllSetting allToAll = AllToAllSetting::kAuto;
};
// Reads the settings `kind` uses; an invalid value fails with its text set.
attnResult_t readCollSettings(CollKind kind, CollSettings* out);

// One collective, as the C API names it (counts in elements).
struct CollArgs {
  CollKind kind = CollKind::kBarrier;
  const void* send = nullptr;
  void* recv = nullptr;  // null on a reduce's non-root ranks
  size_t count = 0;      // per rank, as the C API counts it
  attnDataType_t type = attnUint8;
  attnRedOp_t op = attnSum;
  int root = -1;
  // kAllToAllv: nranks entries each, copied (a queued call outlives the
  // caller's arrays).
  std::vector<size_t> sendcounts, sdispls, recvcounts, rdispls;
};

// Runs `a` on this rank of `comm` over the host transports; returns when
// this rank's part is done.
attnResult_t runHostCollective(attnComm* comm, const CollArgs& a, const CollSettings& s);

}  // namespace attn
