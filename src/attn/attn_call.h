// One attnRingAttention call as the algorithms see it: this rank's shard,
// every rank's row counts, the fp32 accumulator, and the block kernel (the
// built-in CPU kernel or the engine's own through attnCommSetAttnKernel).
#pragma once

#include <chrono>
#include <vector>

#include "attncomm.h"
#include "kernels/cpu/attention.h"
#include "src/attn/attn_state.h"
#include "src/attn/visibility.h"
#include "src/attn/wire.h"
#include "src/core/comm.h"

namespace attn {

// Rows of queries or keys with their sequence offsets and positions.
struct RowsRef {
  const void* t0 = nullptr;  // Q, or K
  const void* t1 = nullptr;  // V (KV only)
  int32_t rows = 0;
  const int32_t* offsets = nullptr;  // [numSeqs+1], starting at 0
  const int32_t* pos = nullptr;
  static RowsRef of(const BlockView& v) { return {v.t0, v.t1, v.rows, v.offsets, v.pos}; }
};

struct AttnCall {
  attnComm* comm = nullptr;
  AttnState* state = nullptr;
  attnAttnConfig_t cfg = ATTN_ATTN_CONFIG_INITIALIZER;
  int numSeqs = 0;
  RowsRef q, kv;                   // this rank's shard
  std::vector<int32_t> qOffsets, kvOffsets;  // rebased to start at 0
  std::vector<int32_t> zeroPos;              // q/kv positions of a call without them
  std::vector<int64_t> qRowsOf, kvRowsOf;    // every rank's counts
  size_t qRowBytes = 0;                      // one row of Q (and of K: same heads x D)
  size_t kRowBytes = 0, vRowBytes = 0;       // one row of K, of V (Dv may differ: MLA)
  std::vector<float> accO, accLse;           // fp32 accumulator for q rows
  RankVisibility vis;                        // which ranks a window hides from which
  AttnCallStats stats;

  RowBytes qRow() const { return RowBytes::one(qRowBytes); }
  RowBytes kvRow() const { return RowBytes::two(kRowBytes, vRowBytes); }

  // Folds attention of `qs` over `kvs` into (o, lse), a [qs.rows, Hq, Dv]
  // accumulator.
  attnResult_t accumulate(const RowsRef& qs, const RowsRef& kvs, float* o, float* lse);
  // Writes the partial of `qs` over `kvs` into fresh (o, lse).
  attnResult_t partial(const RowsRef& qs, const RowsRef& kvs, float* o, float* lse);
  // Merge-on-receive of a partial for all of this rank's query rows.
  attnResult_t fold(const float* o, const float* lse);

  // Bytes of a partial result (O fp32 and lse) for `rows` query rows.
  size_t partialBytes(int64_t rows) const {
    return static_cast<size_t>(rows) * cfg.num_q_heads * (cfg.head_dim_v + 1) * sizeof(float);
  }
};

// Per-peer slices of one buffer (AttnState::outgoing), each 64-byte aligned.
struct PeerSlots {
  std::vector<size_t> offset;  // by peer
  size_t total = 0;
  explicit PeerSlots(int n) : offset(n, 0) {}
  void add(int peer, size_t bytes) {
    offset[peer] = total;
    total += (bytes + 63) & ~size_t(63);
  }
};

using Clock = std::chrono::steady_clock;
inline double usSince(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

// The kernel problem of `qs` against `kvs`: one segment per sequence (rows
// of sequence i against keys of sequence i, from the host offsets in
// `qs`/`kvs`), written to *segs; every pointer is taken as given (device
// pointers for the CUDA kernels, then point segments at a device copy).
cpu::AttnProblem problemOf(const AttnCall& c, const RowsRef& qs, const RowsRef& kvs,
                           std::vector<cpu::AttnSegment>* segs);

// How a block of rank `origin`'s rows (its queries, or with `kv` its keys
// and values), as many as its card announced, must arrive from `from`
// (under a window, a KV block may carry fewer: packVisibleKv).
BlockExpect cardBlock(const AttnCall& c, int from, int origin, bool kv);
// This rank's KV block packed into `out` (room for all its rows), with only
// the rows the queries of `readers` may see when a window is active (all
// rows otherwise). Returns the block's bytes.
size_t packVisibleKv(const AttnCall& c, const std::vector<int>& readers, char* out);
// The same from a rank the block may have come through (a ring): any
// origin, at most 2^31 - 1 rows; the caller compares them with the
// origin's card.
BlockExpect anyCardBlock(const AttnCall& c, int from, bool kv);

// The algorithms (one file each).
attnResult_t runPassKv(AttnCall& c);
attnResult_t runPassQ(AttnCall& c);
attnResult_t runShipQ(AttnCall& c);
attnResult_t runHeadParallel(AttnCall& c);
attnResult_t runAllGatherKv(AttnCall& c);

// The largest kernel of the call on one rank, in multiply-adds (every
// rank's query rows against every rank's key rows, the larger of each):
// what decides whether a progress thread is worth starting (progress_thread.h).
double largestKernelMacs(const AttnCall& c);

}  // namespace attn
