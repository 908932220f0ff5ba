// The attention tile kernel, written once over a SIMD traits struct
// (simd_traits.h) and instantiated by each isa_*.cc unit.
//
// Layout choice: scores are computed transposed, S^T[key][row] = K . Q^T, with
// Q transposed once per task. Then a key's K values are broadcast from their
// own row (K is never transposed), and the softmax maxima and sums over keys
// are vertical vector ops across S^T rows (no horizontal reductions). P.V
// then broadcasts P^T[key][row] against rows of V. A task keeps up to
// kRows stacked query rows, so every K/V tile is read once for all of them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/cpu/attention_scores.h"
#include "kernels/cpu/attention_task.h"
#include "kernels/cpu/half_block.h"
#include "kernels/cpu/simd_traits.h"

namespace {

// How a key tile is masked: every pair visible; keys above a row's upper
// bound hidden (causal, or a window's right side); keys outside [lower,
// upper] hidden (a window's left side, one compare pair per vector).
enum TileMask : int { kMaskNone = 0, kMaskUpper = 1, kMaskSpan = 2 };

// c * tanh(s / c) (softcap), c > 0, lane by lane. tanh(|x|) = (1 - e) /
// (1 + e) with e = 2^(-2|x| log2 e) in (0, 1], which neither overflows nor
// loses the sign; below |x| = 1/8, where 1 - e cancels, its odd Taylor
// polynomial to x^7 (relative error < 4e-9 there). Either way the absolute
// error is about one fp32 ulp of c, that of a score of that size. Infinite s
// gives +-c, NaN stays NaN.
template <class I>
__attribute__((always_inline)) inline typename I::V softcapV(typename I::V s, typename I::V c, typename I::V inv_c) {
  using V = typename I::V;
  const V x = I::mul(s, inv_c);
  const V ax = I::abs(x);
  const V e = I::exp2(I::mul(ax, I::set1(-2.0f * 1.4426950408889634f)));
  const V one = I::set1(1.0f);
  const V big = I::div(I::sub(one, e), I::add(one, e));
  const V x2 = I::mul(ax, ax);
  V poly = I::fma(x2, I::set1(-17.0f / 315.0f), I::set1(2.0f / 15.0f));
  poly = I::fma(x2, poly, I::set1(-1.0f / 3.0f));
  poly = I::fma(x2, poly, one);
  const V small = I::mul(ax, poly);
  return I::mul(c, I::copySign(I::selectLess(ax, I::set1(0.125f), small, big), x));
}

// Online softmax step over keys [0, nkeys) for row vectors [c0, nvec): caps
// the scores (kCap: softcap, cap = softcap * log2 e, the scores being base
// 2), masks (kMask, TileMask: sc.qpos holds each row's upper bound, sc.qlo
// its lower one), updates the running max m and denominator l, turns S^T
// into P^T and leaves the factor that rescales the rows' previous output in
// alpha. A capped score is finite, so a masked one stays -inf.
// With kBf16Pairs (bf16 decode, AVX512_BF16), P is left as bf16 pairs for
// pvTileBf16 instead: row j / 2 of S^T holds keys j and j + 1 (a 0 past the
// last key). The denominator sums P unrounded, so the LSE stays that of the
// scores; O's weights carry bf16 rounding (2^-9 relative, unbiased), as
// flash attention's P·V on tensor cores does.
template <class I, int kMask, bool kCap, bool kBf16Pairs>
void softmaxTile(AttnScratch& sc, int ss, int nkeys, int c0, int nvec, const int32_t* kpos,
                 float cap) {
  using V = typename I::V;
  // 1 / cap kept finite (a denormal cap), so that a score of 0 gives 0, not NaN.
  const V capv = I::set1(cap),
          inv_cap = I::set1(kCap ? std::min(1.0f / cap, std::numeric_limits<float>::max()) : 0.0f);
  for (int c = c0; c < nvec; ++c) {
    float* col = sc.s + c * I::W;
    const V m_old = I::load(sc.m + c * I::W);
    V mx = I::set1(kNegInf);
    if constexpr (kMask != kMaskNone || kCap) {
      const int32_t* qhi = sc.qpos + c * I::W;
      const int32_t* qlo = sc.qlo + c * I::W;
      for (int j = 0; j < nkeys; ++j) {
        V s = I::load(col + j * ss);
        if constexpr (kCap) s = softcapV<I>(s, capv, inv_cap);
        if constexpr (kMask == kMaskUpper) s = I::maskCausal(s, kpos[j], qhi);
        if constexpr (kMask == kMaskSpan) s = I::maskSpan(s, kpos[j], qlo, qhi);
        I::store(col + j * ss, s);
        mx = I::max(mx, s);
      }
    } else {
      for (int j = 0; j < nkeys; ++j) mx = I::max(mx, I::load(col + j * ss));
    }
    const V m_new = I::max(m_old, mx);
    const V base = I::zeroIfNegInf(m_new);  // rows with nothing seen: exp2(-inf - 0) = 0
    const V alpha = I::exp2(I::sub(m_old, base));
    V sum = I::zero();
    if constexpr (kBf16Pairs) {
      // Row j / 2 is written once rows j and j + 1 are read: in place.
      for (int j = 0; j < nkeys; j += 2) {
        const V p0 = I::exp2(I::sub(I::load(col + j * ss), base));
        const V p1 = j + 1 < nkeys ? I::exp2(I::sub(I::load(col + (j + 1) * ss), base)) : I::zero();
        I::store(col + (j / 2) * ss, _mm512_castsi512_ps(I::pairBf16(p0, p1)));
        sum = I::add(sum, I::add(p0, p1));
      }
    } else {
      for (int j = 0; j < nkeys; ++j) {
        const V p = I::exp2(I::sub(I::load(col + j * ss), base));
        I::store(col + j * ss, p);
        sum = I::add(sum, p);
      }
    }
    I::store(sc.l + c * I::W, I::fma(I::load(sc.l + c * I::W), alpha, sum));
    I::store(sc.m + c * I::W, m_new);
    I::store(sc.alpha + c * I::W, alpha);
  }
}

// softmaxTile for a run-time mask and cap (0: none).
template <class I, bool kBf16Pairs>
void softmaxTileFor(AttnScratch& sc, int ss, int nkeys, int c0, int nvec, int mask,
                    const int32_t* kpos, float cap) {
  if (cap != 0.0f) {
    if (mask == kMaskSpan) softmaxTile<I, kMaskSpan, true, kBf16Pairs>(sc, ss, nkeys, c0, nvec, kpos, cap);
    else if (mask == kMaskUpper) softmaxTile<I, kMaskUpper, true, kBf16Pairs>(sc, ss, nkeys, c0, nvec, kpos, cap);
    else softmaxTile<I, kMaskNone, true, kBf16Pairs>(sc, ss, nkeys, c0, nvec, kpos, cap);
  } else {
    if (mask == kMaskSpan) softmaxTile<I, kMaskSpan, false, kBf16Pairs>(sc, ss, nkeys, c0, nvec, kpos, cap);
    else if (mask == kMaskUpper) softmaxTile<I, kMaskUpper, false, kBf16Pairs>(sc, ss, nkeys, c0, nvec, kpos, cap);
    else softmaxTile<I, kMaskNone, false, kBf16Pairs>(sc, ss, nkeys, c0, nvec, kpos, cap);
  }
}

// acc[r][c] = alpha[r] * acc[r][c] + sum_j P^T[j][r] * V[j][c] for PR rows and
// C vectors of V's head dim starting at column `col` (acc rows `dpad` apart).
template <class I, int PR, int C>
inline void pvBlock(const float* p, int ss, const float* const* vrow, int nkeys,
                    const float* alpha, float* acc, int dpad, int col) {
  using V = typename I::V;
  V a[PR][C];
#pragma GCC unroll 8
  for (int r = 0; r < PR; ++r) {
    const V al = I::set1(alpha[r]);
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) a[r][c] = I::mul(I::load(acc + r * dpad + col + c * I::W), al);
  }
  for (int j = 0; j < nkeys; ++j) {
    V v[C];
    const float* vr = vrow[j] + col;
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) v[c] = I::load(vr + c * I::W);
#pragma GCC unroll 8
    for (int r = 0; r < PR; ++r) {
      const V pb = I::set1(p[j * ss + r]);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) a[r][c] = I::fma(pb, v[c], a[r][c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < PR; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) I::store(acc + r * dpad + col + c * I::W, a[r][c]);
}

// Head-dim chunks outside: the chunk of V (keys x kPC vectors) stays in L1
// while the rows go by.
template <class I>
void pvTile(AttnScratch& sc, int ss, const float* const* vrow, int nkeys, int r0, int nrows,
            int dvec, int dpad) {
  int c = 0;
  for (; c + I::kPC <= dvec; c += I::kPC)
    for (int r = r0; r < nrows; r += I::kPR)
      pvBlock<I, I::kPR, I::kPC>(sc.s + r, ss, vrow, nkeys, sc.alpha + r, sc.acc + size_t(r) * dpad,
                                 dpad, c * I::W);
  withCount<I::kPC>(dvec - c, [&]<int N>() {
    for (int r = r0; r < nrows; r += I::kPR)
      pvBlock<I, I::kPR, N>(sc.s + r, ss, vrow, nkeys, sc.alpha + r, sc.acc + size_t(r) * dpad,
                            dpad, c * I::W);
  });
}

// pvBlock for bf16 V rows read in place and P as bf16 pairs (softmaxTile's
// kBf16Pairs): one instruction takes two keys, and V is never widened. PR
// rows x C2 chunks of 32 columns from `col`; the accumulators run in
// pairRows' column order and go back to acc's at the end.
template <class I, int PR, int C2>
inline void pvBlockBf16(const float* p, int ss, const uint16_t* const* vrow, int npairs,
                        const float* alpha, float* acc, int dpad, int col) {
  if constexpr (kHasBf16Dot<I>) {
    using V = typename I::V;
    using VB = typename I::VB;
    V a[PR][2 * C2];
#pragma GCC unroll 8
    for (int r = 0; r < PR; ++r) {
      const V al = I::set1(alpha[r]);
#pragma GCC unroll 4
      for (int c = 0; c < C2; ++c) {
        const float* at = acc + r * dpad + col + c * 32;
        I::toPairOrder(I::mul(I::load(at), al), I::mul(I::load(at + 16), al), &a[r][2 * c], &a[r][2 * c + 1]);
      }
    }
    for (int jp = 0; jp < npairs; ++jp) {
      VB v[2 * C2];
#pragma GCC unroll 4
      for (int c = 0; c < C2; ++c)
        I::pairRows(vrow[2 * jp] + col + c * 32, vrow[2 * jp + 1] + col + c * 32, &v[2 * c], &v[2 * c + 1]);
#pragma GCC unroll 8
      for (int r = 0; r < PR; ++r) {
        const VB pb = I::broadcastPair(p + jp * ss + r);
#pragma GCC unroll 8
        for (int c = 0; c < 2 * C2; ++c) a[r][c] = I::dotBf16(a[r][c], v[c], pb);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < PR; ++r)
#pragma GCC unroll 4
      for (int c = 0; c < C2; ++c) {
        V n0, n1;
        I::fromPairOrder(a[r][2 * c], a[r][2 * c + 1], &n0, &n1);
        I::store(acc + r * dpad + col + c * 32, n0);
        I::store(acc + r * dpad + col + c * 32 + 16, n1);
      }
  }
}

// pvTile for pvBlockBf16 (V's head dim dv a multiple of 32): `nkeys` keys in
// (nkeys + 1) / 2 pairs, vrow extended past an odd count (its P is 0).
template <class I>
void pvTileBf16(AttnScratch& sc, int ss, const uint16_t* const* vrow, int nkeys, int r0, int nrows,
                int dv, int dpad) {
  constexpr int C2 = I::kPC / 2;
  const int npairs = (nkeys + 1) / 2, chunks = dv / 32;
  int c = 0;
  for (; c + C2 <= chunks; c += C2)
    for (int r = r0; r < nrows; r += I::kPR)
      pvBlockBf16<I, I::kPR, C2>(sc.s + r, ss, vrow, npairs, sc.alpha + r, sc.acc + size_t(r) * dpad, dpad,
                                 c * 32);
  withCount<C2>(chunks - c, [&]<int N>() {
    for (int r = r0; r < nrows; r += I::kPR)
      pvBlockBf16<I, I::kPR, N>(sc.s + r, ss, vrow, npairs, sc.alpha + r, sc.acc + size_t(r) * dpad, dpad,
                                c * 32);
  });
}

// A task's rows: `heads` blocks of `block` rows (a multiple of the vector
// width), block b for kv head t.kv_head + b; row i < per_head of a block is
// flat index t.m_begin + i, the rest pad it.
struct RowLayout {
  int per_head, block, heads;
  int cols() const { return block * heads; }
};

// (query row, query head) flat index into O and LSE rows of task row m.
inline size_t outRow(const AttnCall& c, const AttnTask& t, const RowLayout& L, int m) {
  const int flat = t.m_begin + m % L.block;
  const int row = c.segs[t.seg].q_begin + flat / c.group;
  return size_t(row) * c.p->num_q_heads + size_t(t.kv_head + m / L.block) * c.group +
         flat % c.group;
}

// The visible key positions of a task's rows: the extremes of the rows'
// upper bounds (q + span.hi) and lower bounds (q - span.lo), saturated to
// int32 (no key lies beyond them), over the rows that are not padding.
struct RowBounds {
  int32_t hi_min, hi_max, lo_min, lo_max;
};

inline int32_t saturate32(int64_t x) {
  return x < std::numeric_limits<int32_t>::min()   ? std::numeric_limits<int32_t>::min()
         : x > std::numeric_limits<int32_t>::max() ? std::numeric_limits<int32_t>::max()
                                                    : int32_t(x);
}

// Q rows of the task -> sc.qt (scaled, transposed), or sc.qr (scaled) for
// the dot-product path, or sc.qr16 (bf16 as given) for the bf16 one; each
// row's visible key positions -> sc.qlo, sc.qpos (padding rows see none).
// Returns their extremes over the task in rb, and per vector of rows the
// largest upper bound in vhi and the smallest lower bound in vlo.
template <class I>
void loadQueries(const AttnCall& c, const AttnTask& t, const RowLayout& L, bool dot,
                 bool bf16_dot, AttnScratch& sc, RowBounds& rb, int32_t* vhi, int32_t* vlo) {
  const auto& p = *c.p;
  const int D = p.head_dim, R = I::kRows;
  constexpr int32_t kMin = std::numeric_limits<int32_t>::min(), kMax = std::numeric_limits<int32_t>::max();
  rb = {kMax, kMin, kMax, kMin};
  for (int m = 0; m < L.cols(); ++m) {
    float* qr = sc.qr + size_t(m) * c.dpad;
    uint16_t* qr16 = sc.qr16 + size_t(m) * c.dpad;
    if (m % L.block >= L.per_head) {  // padding columns: computed, never stored
      if (bf16_dot)
        for (int d = 0; d < c.dpad; ++d) qr16[d] = 0;
      else if (dot)
        for (int d = 0; d < c.dpad; ++d) qr[d] = 0.0f;
      else
        for (int d = 0; d < D; ++d) sc.qt[size_t(d) * R + m] = 0.0f;
      sc.qpos[m] = kMin;
      sc.qlo[m] = kMax;
      continue;
    }
    const size_t oh = outRow(c, t, L, m);
    if (bf16_dot) {  // unscaled: the scale is applied to the scores
      std::memcpy(qr16, static_cast<const uint16_t*>(p.q) + oh * D, size_t(D) * sizeof(uint16_t));
    } else {
      const float* q = rowAsFloat(p.q, p.dtype, oh * D, D, sc.row);
      if (dot)  // rows as they are (dot products); D is a multiple of the vector here
        for (int d = 0; d < D; ++d) qr[d] = q[d] * c.scale_log2;
      else  // transposed (broadcast kernel)
        for (int d = 0; d < D; ++d) sc.qt[size_t(d) * R + m] = q[d] * c.scale_log2;
    }
    int32_t hi = kMax, lo = kMin;
    if (c.span.bounded) {
      const int64_t pos = p.q_pos[oh / size_t(p.num_q_heads)];
      hi = saturate32(pos + c.span.hi);
      lo = saturate32(pos - c.span.lo);
    }
    sc.qpos[m] = hi;
    sc.qlo[m] = lo;
    rb.hi_min = std::min(rb.hi_min, hi);
    rb.hi_max = std::max(rb.hi_max, hi);
    rb.lo_min = std::min(rb.lo_min, lo);
    rb.lo_max = std::max(rb.lo_max, lo);
  }
  for (int v = 0; v < L.cols() / I::W; ++v) {
    vhi[v] = kMin;
    vlo[v] = kMax;
    for (int i = 0; i < I::W; ++i) {
      vhi[v] = std::max(vhi[v], sc.qpos[v * I::W + i]);
      vlo[v] = std::min(vlo[v], sc.qlo[v * I::W + i]);
    }
  }
}

// Running state: empty, or the accumulator's (O, LSE) as (acc, m = lse*log2e, l = 1).
template <class I>
void initState(const AttnCall& c, const AttnTask& t, const RowLayout& L, AttnScratch& sc) {
  const int D = c.dv;
  for (int m = 0; m < L.cols(); ++m) {
    float* acc = sc.acc + size_t(m) * c.dvpad;
    sc.m[m] = kNegInf;
    sc.l[m] = 0.0f;
    for (int d = 0; d < c.dvpad; ++d) acc[d] = 0.0f;
    if (!c.accumulate || m % L.block >= L.per_head) continue;
    const size_t oh = outRow(c, t, L, m);
    const float lse = c.lse[oh];
    if (lse == kNegInf) continue;  // an empty accumulator; its O is ignored
    sc.m[m] = lse * (1.0f / kLn2);
    sc.l[m] = 1.0f;
    for (int d = 0; d < D; ++d) acc[d] = c.o[oh * D + d];
  }
}

// Points sc.krow / sc.vrow ([head][key]) at fp32 rows of keys [k0, k0 + n)
// of the task's kv heads: into the call's packed copy when there is one, else
// copied (and converted from fp16/bf16) into the tile buffers in memory order,
// V zero-padded to dvpad. With bf16_k, sc.krow16 and sc.vrow16 point at the
// bf16 K and V rows in place instead. Each head's rows are extended to
// `nkeys_pad` by repeating its last key (masked later, or weighted 0). K rows
// are head_dim long, V rows dv (each its own row stride).
template <class I>
void loadKeys(const AttnCall& c, const AttnTask& t, AttnScratch& sc, int k0, int n,
              int nkeys_pad, bool bf16_k) {
  const auto& p = *c.p;
  const int D = p.head_dim, Dv = c.dv, K = kAttnKeyTile;
  const size_t kstride = size_t(p.num_kv_heads) * D, vstride = size_t(p.num_kv_heads) * Dv;
  if (c.kpack != nullptr) {
    for (int b = 0; b < t.kv_heads; ++b) {
      const size_t first = size_t(t.kv_head + b) * p.nk + k0;
      for (int j = 0; j < n; ++j) {
        sc.krow[b * K + j] = c.kpack + (first + j) * D;
        sc.vrow[b * K + j] = c.vpack + (first + j) * c.dvpad;
      }
    }
  } else if (p.dtype == attnFloat32 && D % I::W == 0 && Dv % I::W == 0) {
    // fp32 rows are used in place (whole vectors, no padding needed).
    const float* kb = static_cast<const float*>(p.k) + size_t(t.kv_head) * D;
    const float* vb = static_cast<const float*>(p.v) + size_t(t.kv_head) * Dv;
    for (int j = 0; j < n; ++j) {
      const size_t row = attn::cpu::keyRow(p, k0 + j);
      for (int b = 0; b < t.kv_heads; ++b) {
        sc.krow[b * K + j] = kb + row * kstride + size_t(b) * D;
        sc.vrow[b * K + j] = vb + row * vstride + size_t(b) * Dv;
      }
    }
  } else {
    for (int j = 0; j < n; ++j) {
      const size_t row = attn::cpu::keyRow(p, k0 + j);
      const size_t kfirst = row * kstride + size_t(t.kv_head) * D;
      const size_t vfirst = row * vstride + size_t(t.kv_head) * Dv;
      for (int b = 0; b < t.kv_heads; ++b) {  // one key's heads lie side by side
        const size_t kat = kfirst + size_t(b) * D, vat = vfirst + size_t(b) * Dv;
        if (bf16_k) {  // both used in place
          sc.krow16[b * K + j] = static_cast<const uint16_t*>(p.k) + kat;
          sc.vrow16[b * K + j] = static_cast<const uint16_t*>(p.v) + vat;
          continue;
        }
        float* kb = sc.kbuf + (size_t(b) * K + j) * D;
        copyRowAsFloat(kb, p.k, p.dtype, kat, D);
        sc.krow[b * K + j] = kb;
        float* vb = sc.vbuf + (size_t(b) * K + j) * c.dvpad;
        copyRowAsFloat(vb, p.v, p.dtype, vat, Dv);
        for (int d = Dv; d < c.dvpad; ++d) vb[d] = 0.0f;
        sc.vrow[b * K + j] = vb;
      }
    }
  }
  for (int b = 0; b < t.kv_heads; ++b)
    for (int j = n; j < nkeys_pad; ++j) {
      if (bf16_k) {
        sc.krow16[b * K + j] = sc.krow16[b * K + n - 1];
        sc.vrow16[b * K + j] = sc.vrow16[b * K + n - 1];
      } else
        sc.krow[b * K + j] = sc.krow[b * K + n - 1];
    }
}

template <class I>
void storeRows(const AttnCall& c, const AttnTask& t, const RowLayout& L, AttnScratch& sc) {
  const int D = c.dv;
  for (int m = 0; m < L.cols(); ++m) {
    if (m % L.block >= L.per_head) continue;
    const size_t oh = outRow(c, t, L, m);
    float* o = c.o + oh * D;
    const float l = sc.l[m];
    // Nothing new reached this row: keep the accumulator bit-exact.
    if (c.accumulate && l == 1.0f && sc.m[m] == c.lse[oh] * (1.0f / kLn2)) continue;
    if (l == 0.0f) {  // saw no key at all
      for (int d = 0; d < D; ++d) o[d] = 0.0f;
      c.lse[oh] = kNegInf;
      continue;
    }
    const float inv = 1.0f / l;
    const float* acc = sc.acc + size_t(m) * c.dvpad;
    for (int d = 0; d < D; ++d) o[d] = acc[d] * inv;
    c.lse[oh] = (sc.m[m] + std::log2(l)) * kLn2;
  }
}

// Rows per head up to which scoreDot beats the broadcast score kernel.
template <class I>
constexpr int kDotRows = I::W / 2;

template <class I>
void attentionTask(const AttnCall& c, const AttnTask& t, AttnScratch& sc, AttnTileStats& st) {
  static_assert(I::kRows <= attn::cpu::kAttnMaxTileRows && I::kRows % I::W == 0);
  static_assert(I::W % I::kPR == 0 && kAttnKeyTile % I::kSJ == 0);
  const auto& p = *c.p;
  const auto& seg = c.segs[t.seg];
  const int nrows = t.m_end - t.m_begin;
  const RowLayout L{nrows, roundUp(nrows, I::W), t.kv_heads};
  const int bvec = L.block / I::W;  // vectors per head block
  // Few rows per head (decode): scores as dot products; the rows past the
  // last group of 4 are never scored, so their S^T lanes start at 0.
  const bool dot = L.per_head <= kDotRows<I> && p.head_dim % I::W == 0;
  // bf16 K and Q multiplied as they are (AVX512_BF16), K read in place; P·V
  // in bf16 too, V read in place (so V's head dim a multiple of 32 as well).
  const bool bf16_dot = kHasBf16Dot<I> && dot && p.dtype == attnBfloat16 && c.kpack == nullptr &&
                        p.head_dim % (2 * I::W) == 0 && c.dv % (2 * I::W) == 0;
  const int dot_rows = roundUp(L.per_head, 4);
  // Row stride of S^T: the broadcast kernel fills whole kRows rows, the dot
  // products only the task's rows, which stay dense (kRows floats apart, the
  // 64 keys' scores would fall into a few L1 sets).
  const int ss = dot ? L.cols() : I::kRows;
  // Only the dot-product (decode) paths stream K/V faster than they compute.
  const bool prefetch = dot && c.kpack == nullptr && p.dtype != attnFloat32 &&
                        size_t(t.kv_heads) * kAttnKeyTile * size_t(p.head_dim + c.dv) * sizeof(uint16_t) <=
                            kPrefetchTileBytes;
  RowBounds rb;
  int32_t vhi[attn::cpu::kAttnMaxTileRows / I::W], vlo[attn::cpu::kAttnMaxTileRows / I::W];
  loadQueries<I>(c, t, L, dot, bf16_dot, sc, rb, vhi, vlo);
  initState<I>(c, t, L, sc);
  const int dvec = (p.head_dim + I::W - 1) / I::W;  // vectors of a K row
  const int dvec_v = (c.dv + I::W - 1) / I::W;     // of a V row
  if (dot)
    for (int b = 0; b < t.kv_heads; ++b)
      for (int j = 0; j < kAttnKeyTile; ++j)
        for (int r = b * L.block + dot_rows; r < (b + 1) * L.block; ++r) sc.s[j * ss + r] = 0;
  bool computed = false;
  for (int k0 = seg.k_begin; k0 < seg.k_end; k0 += kAttnKeyTile) {
    const int n = seg.k_end - k0 < kAttnKeyTile ? seg.k_end - k0 : kAttnKeyTile;
    int mask = kMaskNone;
    int32_t kmin = std::numeric_limits<int32_t>::min(), kmax = std::numeric_limits<int32_t>::max();
    if (c.span.bounded) {
      kmax = std::numeric_limits<int32_t>::min();
      kmin = std::numeric_limits<int32_t>::max();
      for (int j = 0; j < n; ++j) {
        const int32_t kp = p.k_pos[k0 + j];
        kmin = kp < kmin ? kp : kmin;
        kmax = kp > kmax ? kp : kmax;
      }
      // Every key above every row's upper bound (in every query's future)
      // or below every row's lower bound (out of every query's window).
      if (kmin > rb.hi_max || kmax < rb.lo_min) {
        st.skipped += t.kv_heads;
        continue;
      }
      if (kmin < rb.lo_max) mask = kMaskSpan;  // some key below some row's window
      else if (kmax > rb.hi_min) mask = kMaskUpper;
    }
    const bool masked = mask != kMaskNone;
    (masked ? st.masked : st.full) += t.kv_heads;
    computed = true;
    const int nkeys_pad = roundUp(n, I::kSJ);
    loadKeys<I>(c, t, sc, k0, n, nkeys_pad, bf16_dot);
    for (int b = 0; b < t.kv_heads; ++b) {
      // Row vectors no key of this tile reaches (every key above all their
      // upper bounds or below all their lower ones): rows are usually in
      // position order, so skip the leading and trailing ones.
      int c0 = b * bvec, c1 = c0 + bvec;
      if (masked) {
        while (c0 < c1 && (vhi[c0] < kmin || vlo[c0] > kmax)) ++c0;
        while (c1 > c0 && (vhi[c1 - 1] < kmin || vlo[c1 - 1] > kmax)) --c1;
      }
      if (c0 == c1) continue;
      const TilePrefetch pf =
          prefetch ? tilePrefetch(c, t.kv_head + b, k0 + kAttnKeyTile, seg.k_end) : TilePrefetch{};
      const int r1 = std::min(b * L.block + dot_rows, c1 * I::W);  // dot paths' last scored row
      const int pv_end = std::min(roundUp(b * L.block + nrows, I::kPR), c1 * I::W);
      if (bf16_dot)
        scoreDotBf16<I>(sc.krow16 + b * kAttnKeyTile, nkeys_pad, sc.qr16, c.dpad, c0 * I::W, r1,
                        p.head_dim, c.scale_log2, sc.s, ss, pf);
      else if (dot && prefetch)
        scoreDot<I>(sc.krow + b * kAttnKeyTile, nkeys_pad, sc.qr, c.dpad, c0 * I::W, r1, dvec, sc.s, ss, pf);
      else if (dot)
        scoreDot<I>(sc.krow + b * kAttnKeyTile, nkeys_pad, sc.qr, c.dpad, c0 * I::W, r1, dvec, sc.s, ss,
                    NoPrefetch{});
      else
        scoreTile<I>(sc.krow + b * kAttnKeyTile, nkeys_pad, sc.qt, c0, c1, p.head_dim, sc.s);
      const int32_t* kpos = masked ? p.k_pos + k0 : nullptr;
      if (bf16_dot) {
        softmaxTileFor<I, kHasBf16Dot<I>>(sc, ss, n, c0, c1, mask, kpos, c.softcap_log2);
        pvTileBf16<I>(sc, ss, sc.vrow16 + b * kAttnKeyTile, n, c0 * I::W, pv_end, c.dv, c.dvpad);
      } else {
        softmaxTileFor<I, false>(sc, ss, n, c0, c1, mask, kpos, c.softcap_log2);
        pvTile<I>(sc, ss, sc.vrow + b * kAttnKeyTile, n, c0 * I::W, pv_end, dvec_v, c.dvpad);
      }
    }
  }
  if (c.accumulate && !computed) return;  // leave the accumulator bit-exact
  storeRows<I>(c, t, L, sc);
}

}  // namespace
