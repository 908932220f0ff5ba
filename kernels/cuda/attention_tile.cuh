// What every attention CTA does before and around its math: find its
// (segment, query tile) in a packed variable-length batch, compute position
// bounds to skip fully masked key tiles (causal and sliding windows), and
// count tiles. Shared by the
// tensor-core (mma.sync, WMMA) and the SIMT kernels in attention.cu.
#pragma once

#include <climits>
#include <cstdint>

#include <cuda_pipeline_primitives.h>

#include "kernels/cuda/cuda_common.cuh"

namespace attn::cuda {

// A CTA's work: query rows [q0, q1) (at most block_q of them, all of one
// segment) against keys [kb, ke).
struct TileWork {
  int q0, q1, kb, ke;
};

struct AttnArgs {
  const void* q;
  const void* k;
  const void* v;
  const int32_t* q_pos;
  const int32_t* k_pos;
  const int64_t* k_rows;         // paged K/V: row of k / v holding key j; null: row j
  const cpu::AttnSegment* segs;  // null: one segment, all rows x all keys
  int nseg, nq, nk, hq, hkv, d;  // d: head dim of Q and K
  float scale_log2;  // score scale * log2(e): softmax runs on exp2
  // Softcap (cap != 0): the log2-domain score is cap * tanh(x), x = the raw
  // dot q.k * cap_in (= scale / softcap) or the log2-scaled score * cap_inv
  // (= 1 / cap); cap = softcap * log2(e). 0: no cap.
  float cap, cap_in, cap_inv;
  // Causal and / or windowed (cpu::visibleSpan): positions are read, key j
  // is visible to query i iff q_pos[i] - span_lo <= k_pos[j] <= q_pos[i] +
  // span_hi (int64: no sum overflows), and tiles are skipped on them.
  bool bounded;
  long long span_lo, span_hi;
  bool accumulate;  // fold into (o, lse) instead of writing the partial
  float* o;
  float* lse;
  AttnCudaStats* stats;
  int tiles;   // query tiles in the grid (an upper bound with segments)
  int splits;  // key chunks per segment (split-K): the grid's y dimension
  // Query heads of one kv head per CTA (the mma kernel packs a GQA group's
  // heads as rows of one CTA so they share each K/V tile; 1 elsewhere), and
  // the CTAs per query tile: hkv x ceil(group / heads_per_cta) (= hq at 1).
  int heads_per_cta;
  int head_slots;
  // Head dim of V and O (MLA: may differ from d, the head dim of Q and K).
  // Last, so the fields before it keep their offsets: the kernels built
  // for d == dv compile to the code they had before it existed.
  int dv;
};

__device__ inline int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// The key positions [lo, hi] a query at position q sees, clamped to int32
// (exact: lo <= q and hi >= q always fit, and the keys' positions are
// int32), so the per-element test is two int compares.
__device__ inline void rowSpan(const AttnArgs& a, int q, int& lo, int& hi) {
  lo = int(max((long long)q - a.span_lo, (long long)INT_MIN));
  hi = int(min((long long)q + a.span_hi, (long long)INT_MAX));
}

// For key positions in [klo, khi] and query positions in [qlo, qhi] (a key
// tile's and some queries' bounds, positions in any order): no pair can be
// visible (the tile is skipped for those queries), or every pair is (no
// mask needed).
__device__ inline bool noneVisible(const AttnArgs& a, int klo, int khi, int qlo, int qhi) {
  return (long long)klo > (long long)qhi + a.span_hi || (long long)khi < (long long)qlo - a.span_lo;
}
__device__ inline bool allVisible(const AttnArgs& a, int klo, int khi, int qlo, int qhi) {
  return (long long)khi <= (long long)qlo + a.span_hi && (long long)klo >= (long long)qhi - a.span_lo;
}

// Softcap of a log2-domain score (a.cap != 0).
__device__ inline float capScore(const AttnArgs& a, float s2) { return a.cap * tanhf(s2 * a.cap_inv); }

// The row of k / v holding key j.
__device__ inline size_t keyRow(const AttnArgs& a, int j) {
  return a.k_rows != nullptr ? size_t(a.k_rows[j]) : size_t(j);
}

template <int kThreads>
__device__ int blockSum(int v, int* scratch) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps");
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  int s = 0;
  for (int w = 0; w < kThreads / 32; ++w) s += scratch[w];
  __syncthreads();
  return s;
}

// Finds query tile `tile` (counted over the segments in order, each segment
// split into ceil(rows / block_q) tiles). Returns false (for the whole CTA)
// past the last tile. With many segments the CTA scans them kThreads at a
// time: O(num_segments / kThreads) steps, no workspace, no host sync.
template <int kThreads>
__device__ bool findTile(const AttnArgs& a, int tile, int block_q, TileWork& w) {
  if (a.segs == nullptr) {
    w.q0 = tile * block_q;
    if (w.q0 >= a.nq) return false;
    w.q1 = min(a.nq, w.q0 + block_q);
    w.kb = 0;
    w.ke = a.nk;
    return true;
  }
  __shared__ int scratch[32];
  __shared__ int found[5];
  if (threadIdx.x == 0) found[0] = 0;
  __syncthreads();
  int base = 0;
  for (int c = 0; c < a.nseg; c += kThreads) {
    const int s = c + int(threadIdx.x);
    int qb = 0, qe = 0, cnt = 0;
    if (s < a.nseg) {
      const cpu::AttnSegment g = a.segs[s];
      qb = clampi(g.q_begin, 0, a.nq);
      qe = clampi(g.q_end, qb, a.nq);
      cnt = (qe - qb + block_q - 1) / block_q;
    }
    // Inclusive scan of cnt over the block: warp scan, then warp totals.
    int incl = cnt;
    for (int o = 1; o < 32; o <<= 1) {
      const int t = __shfl_up_sync(0xffffffffu, incl, o);
      if ((threadIdx.x & 31) >= unsigned(o)) incl += t;
    }
    if ((threadIdx.x & 31) == 31) scratch[threadIdx.x >> 5] = incl;
    __syncthreads();
    int before = 0, total = 0;
    for (int wi = 0; wi < kThreads / 32; ++wi) {
      if (wi < int(threadIdx.x >> 5)) before += scratch[wi];
      total += scratch[wi];
    }
    incl += before + base;
    const int excl = incl - cnt;
    if (cnt > 0 && tile >= excl && tile < incl) {
      const cpu::AttnSegment g = a.segs[s];
      const int t = tile - excl;
      found[0] = 1;
      found[1] = qb + t * block_q;
      found[2] = min(qe, qb + (t + 1) * block_q);
      found[3] = clampi(g.k_begin, 0, a.nk);
      found[4] = clampi(g.k_end, found[3], a.nk);
    }
    base += total;
    __syncthreads();
    if (found[0] || base > tile) break;  // uniform: every thread reads the same
  }
  if (!found[0]) return false;
  w.q0 = found[1];
  w.q1 = found[2];
  w.kb = found[3];
  w.ke = found[4];
  return true;
}

// Split-K (flash-decoding): grid column blockIdx.y of a.splits takes chunk
// blockIdx.y of its segment's keys, cut on block_k so a key tile never
// straddles two chunks (the tile counts stay those of one launch), and
// writes its partial into slice blockIdx.y of (o, lse): outO / outLse.
__device__ inline void takeKeyChunk(const AttnArgs& a, int block_k, TileWork& w) {
  if (a.splits <= 1) return;
  const int n = w.ke - w.kb;
  const int step = ((n + a.splits - 1) / a.splits + block_k - 1) / block_k * block_k;
  const int j = int(blockIdx.y);
  const int lo = min(n, j * step), hi = min(n, (j + 1) * step);
  w.ke = w.kb + hi;
  w.kb += lo;
}
__device__ inline float* outO(const AttnArgs& a, int row, int head, int d) {
  return a.o + ((size_t(blockIdx.y) * size_t(a.nq) + size_t(row)) * size_t(a.hq) + size_t(head)) * size_t(d);
}
__device__ inline float* outLse(const AttnArgs& a, int row, int head) {
  return a.lse + (size_t(blockIdx.y) * size_t(a.nq) + size_t(row)) * size_t(a.hq) + size_t(head);
}

// Min and max of q_pos over rows [r0, r1) (r1 - r0 <= 32), reduced over the
// warp; INT_MAX / INT_MIN when the range is empty.
__device__ inline void warpPosBounds(const int32_t* pos, int r0, int r1, int& lo, int& hi) {
  lo = INT_MAX;
  hi = INT_MIN;
  const int r = r0 + int(threadIdx.x & 31);
  if (r < r1) lo = hi = pos[r];
  for (int o = 16; o; o >>= 1) {
    lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
    hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
  }
}

// Bounds of positions [i0, i1) (i1 - i0 <= 64: a key tile's, a CTA's
// queries'), computed by one warp (every warp computes the same values, so
// a skip decision is uniform without a barrier).
__device__ inline void warpPosBounds64(const int32_t* pos, int i0, int i1, int& lo, int& hi) {
  int lo2, hi2;
  warpPosBounds(pos, i0, min(i1, i0 + 32), lo, hi);
  warpPosBounds(pos, i0 + 32, i1, lo2, hi2);
  lo = min(lo, lo2);
  hi = max(hi, hi2);
}

// Copies rows [0, n) of one head (THD: row stride `stride` elements; row r
// is g's row idx[r] when idx is given, paged K/V) into shared memory rows
// of kLd, zero-filling rows >= n: 16-byte cp.async.
template <class T, int D, int kLd, int kThreads>
__device__ inline void stageRows(T* s, const T* g, int n, size_t stride, int rows,
                                 const int64_t* idx = nullptr) {
  constexpr int kVec = 16 / sizeof(T), kPerRow = D / kVec;
  for (int i = threadIdx.x; i < rows * kPerRow; i += kThreads) {
    const int r = i / kPerRow, c = (i % kPerRow) * kVec;
    T* dst = s + r * kLd + c;
    const size_t row = idx != nullptr && r < n ? size_t(idx[r]) : size_t(r);
    if (r < n) __pipeline_memcpy_async(dst, g + row * stride + c, 16);
    else *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
  }
}

// Per-CTA tile counters, flushed with one atomic each at the end.
struct TileCounts {
  unsigned full = 0, masked = 0, skipped = 0;
  __device__ void flush(AttnCudaStats* s) const {
    if (s == nullptr || threadIdx.x != 0) return;
    if (full) atomicAdd(&s->tiles_full, (unsigned long long)full);
    if (masked) atomicAdd(&s->tiles_masked, (unsigned long long)masked);
    if (skipped) atomicAdd(&s->tiles_skipped, (unsigned long long)skipped);
  }
};

// Writes one finished output row: o_row holds the unnormalised sum
// sum_j p_j v_j in lane-strided pieces; l the denominator, m2 the running
// max in the log2 domain. `get(i)` returns element i (i in this lane's
// slice). Partial mode: O = acc / l, LSE = ln(l) + m2 ln2, or O = 0,
// LSE = -inf if no key. Accumulate mode: merged into the existing row, or
// left alone if no key. All lanes of the row's group must call it; the
// caller orders the lse write after every lane's read (see attention.cu).
__device__ inline float rowLse(float m2, float l) {
  return l > 0.0f ? (m2 + __log2f(l)) * 0.69314718055994531f : -INFINITY;
}

// Weights to fold a new partial with LSE `ln` into an accumulator row with
// LSE `la`: returns false when the new partial saw nothing (row untouched).
__device__ inline bool foldWeights(float la, float ln, float& wa, float& wn, float& lse_out) {
  if (ln == -INFINITY) return false;
  const float mx = fmaxf(la, ln);
  wa = la == -INFINITY ? 0.0f : expf(la - mx);
  wn = expf(ln - mx);
  const float sum = wa + wn;
  wa /= sum;
  wn /= sum;
  lse_out = mx + logf(sum);
  return true;
}

}  // namespace attn::cuda
