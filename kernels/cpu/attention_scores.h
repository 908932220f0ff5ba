// The score half of the CPU attention tile kernel (attention_impl.h):
// the helpers every step shares (rows as fp32, tile prefetching) and the
// S^T = K . Q^T kernels, fp32 broadcast, dot-product and bf16 forms.
// Included by attention_impl.h after the unit's target pragma.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/cpu/attention_task.h"
#include "kernels/cpu/half_block.h"
#include "kernels/cpu/simd_traits.h"

namespace {

using attn::cpu::AttnCall;
using attn::cpu::AttnScratch;
using attn::cpu::AttnTask;
using attn::cpu::AttnTileStats;
using attn::cpu::kAttnKeyTile;

constexpr float kLn2 = 0.693147180559945309f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline int roundUp(int x, int m) { return (x + m - 1) / m * m; }

// Row `index` (in elements) of a fp32/fp16/bf16 tensor as fp32: in place for
// fp32, else converted into `buf`.
inline const float* rowAsFloat(const void* base, attnDataType_t t, size_t index, int n,
                               float* buf) {
  switch (t) {
    case attnFloat16:
      widenRow(buf, static_cast<const uint16_t*>(base) + index, size_t(n), Fp16Tag{});
      return buf;
    case attnBfloat16:
      widenRow(buf, static_cast<const uint16_t*>(base) + index, size_t(n), Bf16Tag{});
      return buf;
    default:
      return static_cast<const float*>(base) + index;
  }
}

inline void copyRowAsFloat(float* __restrict dst, const void* base, attnDataType_t t,
                           size_t index, int n) {
  if (t != attnFloat32) {
    rowAsFloat(base, t, index, n, dst);
    return;
  }
  const float* __restrict src = static_cast<const float*>(base) + index;
  for (int i = 0; i < n; ++i) dst[i] = src[i];  // inline vector moves, no libc call
}

// K and V rows of one kv head in the next key tile, asked for
// (into L2) a few keys at a time by the score loop of the current tile, so
// the requests spread over its compute. A decode step does ~100 cycles of
// work per key, so the out-of-order window spans less than one key and
// cannot hide a miss; the hardware prefetchers stop at each 4 KiB page and
// left about one line in twelve to a demand miss: a bf16 8/1 step took
// 1.5-1.7x its time without this (perf/RESULTS.md §11).
struct TilePrefetch {
  const char* k = nullptr;  // null: nothing to ask for
  const char* v = nullptr;
  size_t stride = 0, vstride = 0;     // bytes from one key's K (V) row to the next
  const int64_t* rows = nullptr;      // paged K/V (AttnProblem::k_rows), or null
  int64_t first = 0;                  // the tile's first key
  int n = 0;                          // its keys
  int lines = 0, vlines = 0;          // cache lines of one head's K (V) row

  // Keys [j, j + count) of the tile (indices past its end are ignored).
  // Always inlined: GCC counts __builtin_prefetch as free of side effects,
  // so it marks an out-of-line caller pure and drops the void call whole
  // (which is what became of the fp32 path's earlier prefetch).
  __attribute__((always_inline)) inline void keys(int j, int count) const {
    if (k == nullptr) return;
    const int end = j + count < n ? j + count : n;
    for (; j < end; ++j) {
      const size_t row = rows != nullptr ? size_t(rows[first + j]) : size_t(first + j);
      const char* kr = k + row * stride;
      const char* vr = v + row * vstride;
      for (int l = 0; l < lines; ++l) __builtin_prefetch(kr + 64 * l, 0, 2);
      for (int l = 0; l < vlines; ++l) __builtin_prefetch(vr + 64 * l, 0, 2);
    }
  }
};

// For score loops that ask for nothing: the fp32 path compiles as it would
// without prefetching (an empty TilePrefetch measured 6% slower there).
struct NoPrefetch {
  void keys(int, int) const {}
};

// The score loop asks for the next key tile's rows of the same head when
// K and V are fp16/bf16 and the task's next tile (K and V of all its kv
// heads) fits this budget: the rows must wait in L2 (1 MiB on Zen 4) beside
// the current tile's. fp32 rows, read in place, measured from 0.87x to
// 1.12x with it, so they go without.
constexpr size_t kPrefetchTileBytes = size_t(256) << 10;

// The TilePrefetch of kv head `head` for keys [k0, k_end) of the segment
// (fp16/bf16 input).
inline TilePrefetch tilePrefetch(const AttnCall& c, int head, int k0, int k_end) {
  TilePrefetch f;
  f.n = k_end - k0 < kAttnKeyTile ? k_end - k0 : kAttnKeyTile;
  if (f.n <= 0) return f;
  const auto& p = *c.p;
  const size_t row_bytes = size_t(p.head_dim) * sizeof(uint16_t), vrow_bytes = size_t(c.dv) * sizeof(uint16_t);
  f.k = static_cast<const char*>(p.k) + head * row_bytes;
  f.v = static_cast<const char*>(p.v) + head * vrow_bytes;
  f.stride = size_t(p.num_kv_heads) * row_bytes;
  f.vstride = size_t(p.num_kv_heads) * vrow_bytes;
  f.lines = int((row_bytes + 63) / 64);
  f.vlines = int((vrow_bytes + 63) / 64);
  f.rows = p.k_rows;
  f.first = k0;
  return f;
}

// out[j][c] = sum_d K[j][d] * Qt[d][c] for J keys and C vectors of rows.
template <class I, int J, int C>
inline void scoreBlock(const float* const* krow, const float* qt, int rows, int head_dim,
                       float* out) {
  using V = typename I::V;
  V acc[J][C];
#pragma GCC unroll 8
  for (int j = 0; j < J; ++j)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[j][c] = I::zero();
  const float* kr[J];
#pragma GCC unroll 8
  for (int j = 0; j < J; ++j) kr[j] = krow[j];
  for (int d = 0; d < head_dim; ++d) {
    V q[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) q[c] = I::load(qt + size_t(d) * rows + c * I::W);
#pragma GCC unroll 8
    for (int j = 0; j < J; ++j) {
      const V b = I::set1(kr[j][d]);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[j][c] = I::fma(b, q[c], acc[j][c]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < J; ++j)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) I::store(out + j * rows + c * I::W, acc[j][c]);
}

// Runs F<n>() for the remaining n < Max vectors (n = 1 .. Max-1).
template <int Max, class F>
inline void withCount(int n, F&& f) {
  if constexpr (Max > 1) {
    if (n == Max - 1) return f.template operator()<Max - 1>();
    return withCount<Max - 1>(n, f);
  }
}

// S^T for keys [0, nkeys) (a multiple of kSJ) and row vectors [c0, nvec).
template <class I>
void scoreTile(const float* const* krow, int nkeys, const float* qt, int c0, int nvec,
               int head_dim, float* s) {
  constexpr int R = I::kRows;
  // Column chunks outside: a chunk of Q^T (head_dim x kSC vectors) stays in
  // L1 while the tile's keys stream past it.
  int c = c0;
  for (; c + I::kSC <= nvec; c += I::kSC)
    for (int j = 0; j < nkeys; j += I::kSJ)
      scoreBlock<I, I::kSJ, I::kSC>(krow + j, qt + c * I::W, R, head_dim, s + j * R + c * I::W);
  withCount<I::kSC>(nvec - c, [&]<int N>() {
    for (int j = 0; j < nkeys; j += I::kSJ)
      scoreBlock<I, I::kSJ, N>(krow + j, qt + c * I::W, R, head_dim, s + j * R + c * I::W);
  });
}

// S^T[j][r] for keys [0, nkeys) (a multiple of kSJ) and rows [r0, r1) (a
// multiple of 4 apart) as dot products along head_dim (a multiple of W):
// K rows and Q rows (qr, stride dpad) are both read in order and every lane
// works. For a head's few decode rows the broadcast kernel above would fill
// only those rows' lanes of each vector.
template <class I, class Prefetch>
void scoreDot(const float* const* krow, int nkeys, const float* qr, int dpad, int r0, int r1,
              int dvec, float* s, int ss, const Prefetch& pf) {
  using V = typename I::V;
  constexpr int KJ = sizeof(V) >= 64 ? 4 : 2;  // 16 or 8 accumulators: fit the register file
  static_assert(I::kSJ % KJ == 0);
  for (int j = 0; j < nkeys; j += KJ) {
    pf.keys(j, KJ);
    for (int r = r0; r < r1; r += 4) {
      V acc[KJ][4];
#pragma GCC unroll 4
      for (int a = 0; a < KJ; ++a)
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) acc[a][i] = I::zero();
      const float* q = qr + size_t(r) * dpad;
      for (int c = 0; c < dvec; ++c) {
        V qv[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) qv[i] = I::load(q + size_t(i) * dpad + c * I::W);
#pragma GCC unroll 4
        for (int a = 0; a < KJ; ++a) {
          const V kv = I::load(krow[j + a] + c * I::W);
#pragma GCC unroll 4
          for (int i = 0; i < 4; ++i) acc[a][i] = I::fma(kv, qv[i], acc[a][i]);
        }
      }
#pragma GCC unroll 4
      for (int a = 0; a < KJ; ++a)
        I::hsum4(acc[a][0], acc[a][1], acc[a][2], acc[a][3], s + (j + a) * ss + r);
    }
  }
}

// Whether the traits multiply bf16 directly (SimdAvx512Bf16).
template <class I>
constexpr bool kHasBf16Dot = requires { I::kBf16PerVector; };

// scoreDot for bf16 K rows read in place and bf16 Q rows as given (qr,
// stride dpad), head_dim a multiple of kBf16PerVector: each instruction
// takes two products per lane, so the scores cost half the fp32 FMAs, and K
// is never widened. The scale (with log2 e) is applied to the sums.
template <class I>
void scoreDotBf16(const uint16_t* const* krow, int nkeys, const uint16_t* qr, int dpad, int r0,
                  int r1, int head_dim, float scale, float* s, int ss, const TilePrefetch& pf) {
  if constexpr (kHasBf16Dot<I>) {
    using V = typename I::V;
    using VB = typename I::VB;
    constexpr int KJ = 4;  // 16 accumulators + 4 Q + 1 K registers
    static_assert(I::kSJ % KJ == 0);
    for (int j = 0; j < nkeys; j += KJ) {
      pf.keys(j, KJ);
      for (int r = r0; r < r1; r += 4) {
        V acc[KJ][4];
#pragma GCC unroll 4
        for (int a = 0; a < KJ; ++a)
#pragma GCC unroll 4
          for (int i = 0; i < 4; ++i) acc[a][i] = I::zero();
        const uint16_t* q = qr + size_t(r) * dpad;
        for (int d = 0; d < head_dim; d += I::kBf16PerVector) {
          VB qv[4];
#pragma GCC unroll 4
          for (int i = 0; i < 4; ++i) qv[i] = I::loadBf16(q + size_t(i) * dpad + d);
#pragma GCC unroll 4
          for (int a = 0; a < KJ; ++a) {
            const VB kv = I::loadBf16(krow[j + a] + d);
#pragma GCC unroll 4
            for (int i = 0; i < 4; ++i) acc[a][i] = I::dotBf16(acc[a][i], kv, qv[i]);
          }
        }
#pragma GCC unroll 4
        for (int a = 0; a < KJ; ++a)
          I::hsum4Scaled(acc[a][0], acc[a][1], acc[a][2], acc[a][3], scale, s + (j + a) * ss + r);
      }
    }
  }
}

}  // namespace
