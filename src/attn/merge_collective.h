// The decode-context-parallel merge as one collective
// (attnMergeAttnReduceScatter, attnMergeAttnAllGather): every rank holds a
// partial attention result (O, natural-log LSE) for the same query rows
// over its own share of the keys. Rank r ends with the exact merge for its
// share of the heads, [headBegin(r), headBegin(r + 1)), or (all-gather)
// every rank with all of them.
//
// Merge on receive: each rank sends every peer that peer's heads of its
// partial (O in the call's dtype, then LSE), and folds each peer's slice
// into an fp32 accumulator the moment it arrives (kernels/cpu/merge.h), so
// nothing waits for the slowest peer but the last fold. Each rank sends
// (n-1)/n of its partial once; vLLM's all-gather of LSEs plus a
// reduce-scatter of corrected outputs moves the outputs as much and the
// LSEs n times over. The all-gather variant then gathers the merged heads.
#pragma once

#include <cstdint>

#include "attncomm.h"

struct attnComm;

namespace attn {

struct MergeShape {
  int64_t rows = 0;  // query rows, the same on every rank
  int heads = 0;     // all heads (each rank's partial has them all)
  int headDim = 0;
  attnDataType_t dtype = attnFloat32;  // of O; LSEs are fp32
};

// First head of rank r's share: r * heads / n (contiguous, balanced; a
// rank gets none when heads < n).
inline int mergeHeadBegin(int r, int heads, int n) { return static_cast<int>(int64_t(r) * heads / n); }

// Host memory, on the calling thread. part: [rows, heads, D] O and [rows,
// heads] LSE. Reduce-scatter: out [rows, mine, D], lse [rows, mine] or
// null. All-gather: out [rows, heads, D], lse [rows, heads] or null; `out`
// and `lse` may alias the partial (in place).
attnResult_t mergeReduceScatter(attnComm* comm, const MergeShape& s, const void* outPart, const float* lsePart,
                                void* out, float* lse);
attnResult_t mergeAllGather(attnComm* comm, const MergeShape& s, const void* outPart, const float* lsePart,
                            void* out, float* lse);

}  // namespace attn
