// The attention merges on device memory: attnMergeAttnStates on a stream
// (the merge kernels of kernels/cuda), and the merge collectives of
// merge_collective.h on a device communicator. Plain C++ (no CUDA
// headers), so the front door can call it; defined only in CUDA builds.
#pragma once

#include <cstdint>

#include "attncomm.h"
#include "src/attn/merge_collective.h"

struct attnComm;

namespace attn {

#if ATTN_HAVE_CUDA
// attnMergeAttnStatesLse's contract on device (or managed) memory, enqueued
// on `stream`; the caller's thread does not wait.
attnResult_t mergeStatesOnDevice(int n, const void* const* outs, const float* const* lses, void* out, float* lse,
                                 int64_t rows, int heads, int headDim, attnDataType_t dtype, attnLseBase_t base,
                                 attnLseLayout_t layout, attnStream_t stream);
// A merge collective on a device communicator, ordered on `stream` (run by
// its proxy thread: the partial staged to pinned host memory, merged on
// receive there, the result copied back).
attnResult_t enqueueMergeCollective(attnComm* comm, attnStream_t stream, bool allGather, const MergeShape& s,
                                    const void* outPart, const float* lsePart, void* out, float* lse);
#endif

}  // namespace attn
