// Blocked CPU attention with log-sum-exp, the compute step of ring attention.
//
// Tensors are packed "THD": rows x heads x head_dim, the rows of several
// sequences back to back. Q is [nq, Hq, D]; K and V are [nk, Hkv, D], all of
// one dtype (fp32, fp16 or bf16). Query head h reads kv head h / (Hq / Hkv)
// (GQA). A segment says which key rows a run of query rows may attend to; with
// `causal`, key j is visible to query i only if k_pos[j] <= q_pos[i] (global
// token positions, so shards of one sequence mask correctly); a sliding
// window bounds it on either side, and softcap caps scores (AttnProblem).
//
// V may have a head dim of its own (Dv, MLA): V is [nk, Hkv, Dv].
// Results are O [nq, Hq, Dv] fp32, normalised, and LSE [nq, Hq] fp32, the
// natural log of the softmax denominator over the keys seen. A query that
// sees no key gets O = 0 and LSE = -inf (never NaN), which merges as "no
// contribution" (see merge.h).
//
// Work is split in tiles of up to 256 (query row, head) pairs of one kv head
// (so each K/V tile is read once for many queries) by 64 keys, with online
// softmax. A tile whose keys are all in the future of all its queries is
// skipped without reading its keys or values; in a partly masked tile, the
// leading groups of 16 rows that no key reaches are skipped too.
#pragma once

#include <cstdint>

#include "attncomm.h"

namespace attn::cpu {

class WorkerPool;

constexpr int kAttnMaxHeadDim = 256;

// One sequence: query rows [q_begin, q_end) attend to key rows
// [k_begin, k_end) only. Either range may be empty. Query ranges of different
// segments must not overlap (their outputs are written concurrently).
struct AttnSegment {
  int32_t q_begin, q_end, k_begin, k_end;
};

struct AttnProblem {
  const void* q = nullptr;  // [nq, num_q_heads, head_dim]
  const void* k = nullptr;  // [nk, num_kv_heads, head_dim]
  const void* v = nullptr;  // [nk, num_kv_heads, valueDim(p)]
  attnDataType_t dtype = attnFloat32;  // attnFloat32, attnFloat16 or attnBfloat16
  int32_t nq = 0, nk = 0;
  int32_t num_q_heads = 0, num_kv_heads = 0;  // num_q_heads % num_kv_heads == 0
  int32_t head_dim = 0;                       // of Q and K, 1 .. kAttnMaxHeadDim
  // Of V and O (MLA-shaped heads, DeepSeek's 192 / 128): 1 ..
  // kAttnMaxHeadDim, 0: head_dim. O is [nq, num_q_heads, valueDim(p)].
  int32_t head_dim_v = 0;
  float scale = 0.0f;                         // score scale; 0 means 1/sqrt(head_dim)
  bool causal = false;
  // Sliding window (FlashAttention's convention, attncomm.h): key j is
  // visible to query i only if q_pos[i] - window_left <= k_pos[j] <=
  // q_pos[i] + window_right; -1 leaves a side unbounded; causal caps the
  // right side at 0. See visibleSpan() below.
  int32_t window_left = -1, window_right = -1;
  // score = softcap * tanh(score / softcap) on the scaled score, before the
  // softmax; 0: none.
  float softcap = 0.0f;
  const int32_t* q_pos = nullptr;  // [nq] global positions; required if causal or windowed
  const int32_t* k_pos = nullptr;  // [nk]
  const AttnSegment* segments = nullptr;  // null: one segment, all rows x all keys
  int32_t num_segments = 0;
  // Paged K/V: key j is row k_rows[j] of k and v (e.g. a request's blocks
  // scattered over a KV pool, all in one call); k_pos stays indexed by j.
  // Null: key j is row j. Rows must lie in k and v.
  const int64_t* k_rows = nullptr;
};

inline int32_t valueDim(const AttnProblem& p) { return p.head_dim_v > 0 ? p.head_dim_v : p.head_dim; }

// Keys a query at position q sees lie in [q - lo, q + hi] (int64, so no
// sum overflows); `bounded` is false when every key is visible (no causal,
// no window), where positions are not needed.
struct VisibleSpan {
  bool bounded = false;
  int64_t lo = 0, hi = 0;  // offsets below / above the query's position
  bool sees(int64_t q, int64_t k) const { return !bounded || (k >= q - lo && k <= q + hi); }
};
constexpr int64_t kUnboundedSpan = int64_t(1) << 40;  // beyond any int32 distance
inline VisibleSpan visibleSpan(bool causal, int32_t window_left, int32_t window_right) {
  VisibleSpan s;
  s.lo = window_left < 0 ? kUnboundedSpan : window_left;
  s.hi = causal ? 0 : window_right < 0 ? kUnboundedSpan : window_right;
  s.bounded = causal || window_left >= 0 || window_right >= 0;
  return s;
}
inline VisibleSpan visibleSpan(const AttnProblem& p) {
  return visibleSpan(p.causal, p.window_left, p.window_right);
}

// The row of k / v holding key j.
inline size_t keyRow(const AttnProblem& p, int64_t j) {
  return p.k_rows != nullptr ? size_t(p.k_rows[j]) : size_t(j);
}

// Tile counts of one or more calls (added to, never reset by the kernels).
struct AttnStats {
  int64_t tiles_full = 0;     // computed, no mask needed
  int64_t tiles_masked = 0;   // computed with the causal mask
  int64_t tiles_skipped = 0;  // fully masked, not computed
};

struct AttnExec {
  int threads = 1;             // threads working on the call, the caller included
  WorkerPool* pool = nullptr;  // persistent workers to use; null starts threads per call
  AttnStats* stats = nullptr;  // optional tile counts
};

// O and LSE of softmax(scale * Q K^T + mask) V over the given keys only.
// Query rows outside every segment get O = 0, LSE = -inf.
[[nodiscard]] attnResult_t attentionPartial(const AttnProblem& p, float* o, float* lse,
                                            const AttnExec& ex = {});

// Folds this call's keys into an existing accumulator (o_acc, lse_acc),
// exactly as attentionPartial followed by foldPartial (merge.h) would, but
// without materialising the partial: ring attention calls it once per
// incoming KV block. Start from O = 0, LSE = -inf (initAccumulator). Query
// rows that see none of these keys are left untouched.
[[nodiscard]] attnResult_t attentionAccumulate(const AttnProblem& p, float* o_acc,
                                               float* lse_acc, const AttnExec& ex = {});

// O = 0, LSE = -inf for `rows` query rows of `heads` heads.
void initAccumulator(float* o, float* lse, int64_t rows, int heads, int head_dim);

}  // namespace attn::cpu
