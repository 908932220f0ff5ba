// Device kernels of attncomm, callable from host C++ code: the CUDA twins of
// kernels/cpu (same problem structs, same conventions), so src/attn can run
// either. Every function only enqueues work on `stream` (stream-ordered, no
// host synchronisation); arguments are checked on the host and a bad one
// returns attnInvalidArgument with a message (kernels::fail, kernel_status.h), a failed launch
// attnUnhandledCudaError naming the CUDA error.
//
// All tensor, position, segment and index pointers are device-accessible
// (device memory, or managed / mapped host memory). The problem structs
// themselves (AttnProblem, AttnPartialRef arrays) are read on the host at
// the call and need not outlive it.
//
// This header needs only the CUDA runtime API header (no nvcc): host code
// compiled by the C++ compiler may include it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "attncomm.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/merge.h"
#include "kernels/cpu/pack.h"

namespace attn::cuda {

// ---- attention (attention.cu) -----------------------------------------------
// Contract of kernels/cpu/attention.h: THD tensors (q [nq, Hq, D], k
// [nk, Hkv, D], v [nk, Hkv, Dv], o [nq, Hq, Dv]; Dv = cpu::valueDim(p),
// MLA heads), fp32 / fp16 / bf16, GQA (query head h reads kv head
// h / (Hq / Hkv)), causal on global positions (key j visible to query i iff
// k_pos[j] <= q_pos[i]; positions may be in any order), segments for
// variable-length batches, sliding windows on the same positions
// (window_left / window_right, cpu::visibleSpan), softcap on the scaled
// scores, O fp32 normalised, LSE fp32 natural log, a row that sees no key
// O = 0 and LSE = -inf. head_dim 1..256, head_dim_v 0 (head_dim) or 1..256.
//
// Device-side differences, all because the host must not read device data:
//  - q_pos, k_pos, k_rows (paged K/V) and segments are device pointers;
//  - segment ranges are clamped to [0, nq) / [0, nk) on the device (a bad
//    range computes less, it never reads out of bounds); query ranges of
//    different segments must not overlap (rows of an overlap are computed
//    by whichever CTA writes last).

// Tile counts, added to by the kernel with atomics (device memory; zero it
// yourself). One tile = one (query tile, q head) x one key tile.
struct AttnCudaStats {
  unsigned long long tiles_full;     // computed without the mask (every pair visible)
  unsigned long long tiles_masked;   // computed with the causal / window mask
  unsigned long long tiles_skipped;  // every (query, key) pair masked: not loaded, not computed
};

struct AttnCudaExec {
  cudaStream_t stream = nullptr;
  AttnCudaStats* stats = nullptr;  // optional, device pointer
  bool force_generic = false;      // tests: use the SIMT path even where tensor cores apply
  bool force_wmma = false;         // tests, perf: the WMMA kernel where the mma.sync one applies
  // Key chunks per segment (split-K, flash-decoding: chunks run by CTAs of
  // their own, partials merged). 0: chosen by the launcher, which splits
  // only a grid under one wave of the device's multiprocessors with long
  // segments (decode); n >= 1: exactly n (at most 32).
  int key_splits = 0;
};

// The attention kernels. Tensor cores take fp16/bf16, head dims (Q/K, V)
// 64/64, 128/128, 256/256 or 192/128 (MLA), sm_80+, 16-byte aligned tensors; mma (mma.sync, scores in registers) is
// the first choice, WMMA where mma's shared memory does not fit or when
// asked for; SIMT takes everything else.
enum class AttnCudaKernel { mma, wmma, simt };
inline const char* attnCudaKernelName(AttnCudaKernel k) {
  return k == AttnCudaKernel::mma ? "mma" : k == AttnCudaKernel::wmma ? "wmma" : "simt";
}

// Which kernel a problem runs on and its tile shape (tests use it to predict
// tile counts).
struct AttnCudaPlan {
  AttnCudaKernel kernel;
  bool tensor_cores;  // mma or wmma: softmax weights rounded to the input type
  int block_q;        // query rows per CTA
  int block_k;        // keys per tile
  int heads_per_block;  // q heads of one kv head per CTA (mma packs GQA groups; else 1)
};
[[nodiscard]] attnResult_t attentionPlan(const cpu::AttnProblem& p, const AttnCudaExec& ex,
                                         AttnCudaPlan* plan);

// O and LSE of softmax(scale * Q K^T + mask) V; rows outside every segment
// get O = 0, LSE = -inf.
[[nodiscard]] attnResult_t attentionPartial(const cpu::AttnProblem& p, float* o, float* lse,
                                            const AttnCudaExec& ex);

// Folds this call's keys into (o_acc, lse_acc) in the kernel's epilogue
// (merge-on-receive without materialising the partial). Rows that see none
// of these keys are left untouched. Start from initAccumulator.
[[nodiscard]] attnResult_t attentionAccumulate(const cpu::AttnProblem& p, float* o_acc,
                                               float* lse_acc, const AttnCudaExec& ex);

// O = 0, LSE = -inf for rows x heads rows of head_dim (an attention
// result's: its V head dim, cpu::valueDim).
[[nodiscard]] attnResult_t initAccumulator(float* o, float* lse, int64_t rows, int heads,
                                           int head_dim, cudaStream_t stream);

// ---- merge (merge.cu) -------------------------------------------------------
// Contract of kernels/cpu/merge.h. parts is a host array of device pointers;
// any number of parts (more than kMergeMaxPartsPerLaunch are folded in
// successive launches, which is the same merge).
constexpr int kMergeMaxPartsPerLaunch = 8;

[[nodiscard]] attnResult_t mergePartials(float* o_acc, float* lse_acc,
                                         const cpu::AttnPartialRef* parts, int nparts,
                                         size_t rows, int head_dim, cudaStream_t stream);
[[nodiscard]] attnResult_t foldPartial(float* o_acc, float* lse_acc,
                                       const cpu::AttnPartialRef& part, size_t rows,
                                       int head_dim, cudaStream_t stream);
// Partial token row i folds into accumulator token row acc_rows[i] (device
// array), each token row being `heads` rows of head_dim. Indices outside
// [0, acc_tokens) are skipped.
[[nodiscard]] attnResult_t foldPartialRows(float* o_acc, float* lse_acc,
                                           const cpu::AttnPartialRef& part,
                                           const int32_t* acc_rows, size_t ntokens,
                                           size_t acc_tokens, int heads, int head_dim,
                                           cudaStream_t stream);

// ---- pack / unpack (pack.cu) ------------------------------------------------
// dst row i = src row idx[i] (gather), dst row idx[i] = src row i (scatter);
// idx is a device array. `bound` is the number of rows of the indexed
// tensor (src for gather, dst for scatter): indices outside [0, bound) are
// skipped, so a bad index cannot fault the device.
[[nodiscard]] attnResult_t gatherRows(void* dst, const void* src, const int32_t* idx, size_t n,
                                      size_t bound, size_t row_bytes, cudaStream_t stream);
[[nodiscard]] attnResult_t scatterRows(void* dst, const void* src, const int32_t* idx, size_t n,
                                       size_t bound, size_t row_bytes, cudaStream_t stream);
// Contract of kernels/cpu/pack.h gatherKeyTable: the row table and the
// positions of paged keys, from a device array of blocks and the pool's
// positions on the device; one block of threads per pool block.
[[nodiscard]] attnResult_t gatherKeyTable(int64_t* rows, int32_t* pos, const cpu::KeyBlock* blocks,
                                          size_t nblocks, int block_tokens, const int32_t* slot_pos,
                                          size_t slot_bound, cudaStream_t stream);

// ---- reductions and conversions (reduce.cu) ---------------------------------
// Contract of kernels/cpu/reduce.h: all 8 types; integers wrap; floating
// max/min propagate NaN; fp16/bf16 combine in fp32 and round to nearest
// even; attnAvg combines as attnSum (finish with divideInPlace).
[[nodiscard]] attnResult_t reduceInto(void* dst, const void* src, size_t count,
                                      attnDataType_t type, attnRedOp_t op, cudaStream_t stream);
[[nodiscard]] attnResult_t reduce2(void* dst, const void* a, const void* b, size_t count,
                                   attnDataType_t type, attnRedOp_t op, cudaStream_t stream);
[[nodiscard]] attnResult_t divideInPlace(void* dst, size_t count, attnDataType_t type, int n,
                                         cudaStream_t stream);
// fp32 <-> fp16 / bf16 / fp32 (round to nearest even), as kernels/cpu/convert.h.
[[nodiscard]] attnResult_t convertToFloat(float* dst, const void* src, attnDataType_t type,
                                          size_t count, cudaStream_t stream);
[[nodiscard]] attnResult_t convertFromFloat(void* dst, attnDataType_t type, const float* src,
                                            size_t count, cudaStream_t stream);

// ---- LSE conventions (lse.cu) ------------------------------------------------
// dst = natural * (base2 ? log2(e) : 1), token-major [rows, heads] as
// `natural` or head-major [heads, rows]; head-major needs dst != natural.
[[nodiscard]] attnResult_t writeLse(float* dst, const float* natural, int64_t rows, int heads, bool base2,
                                    bool head_major, cudaStream_t stream);

// ---- attention sinks (sinks.cu) ------------------------------------------------
// Contract of kernels/cpu/sinks.h, in place: o [rows, heads, head_dim] fp32
// normalised, lse [rows, heads] fp32 natural log, token-major, sinks [heads]
// fp32 (device pointer): lse' = log(exp(lse) + exp(sink_h)) with the maximum
// subtracted (lse = -inf gives lse' = sink_h and O = 0), O *= exp(lse - lse').
[[nodiscard]] attnResult_t applySinks(float* o, float* lse, int64_t rows, int heads, int head_dim,
                                      const float* sinks, cudaStream_t stream);

// ---- errors -----------------------------------------------------------------
// attnSuccess, or attnUnhandledCudaError with "cuda: <what>: <name> (<text>)"
// recorded by kernels::fail.
[[nodiscard]] attnResult_t cudaResult(cudaError_t err, const char* what);

}  // namespace attn::cuda
