// Portable SIMT attention tile kernel: any dtype (fp32 needs it: tensor
// cores would round it), any head_dim 1..256 and any V head dim 1..256
// (MLA), any alignment, any GPU. Same contract and tile logic as the WMMA
// kernel, with fp32 FMAs.
//
// CTA: 32 query rows of one q head, 128 threads; thread t serves row t / 4
// and key / dim slice t % 4. A row's four threads are adjacent lanes, so its
// softmax reductions are two shuffles. Q (pre-scaled), K and V tiles live in
// shared memory as fp32; the output accumulator stays in registers (up to 64
// of the Dv dims per thread).
#pragma once

#include "kernels/cuda/attention_tile.cuh"

namespace attn::cuda {

constexpr int kSimtBQ = 32, kSimtBK = 32, kSimtThreads = 128;

// d: head dim of Q and K, dv: of V.
inline size_t simtSmemBytes(int d, int dv) {
  // Odd strides: the rows a warp reads fall in different banks.
  return (size_t(kSimtBQ) + kSimtBK) * (d + 1) * 4 + size_t(kSimtBK) * (dv + 1) * 4 +
         size_t(kSimtBQ) * (kSimtBK + 1) * 4 + size_t(kSimtBK) * 4;
}

template <class T>
__global__ void __launch_bounds__(kSimtThreads)
attnSimtKernel(AttnArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int D = a.d, ld = D + 1, Dv = a.dv, ldv = Dv + 1;
  float* sQ = reinterpret_cast<float*>(smem);
  float* sK = sQ + kSimtBQ * ld;
  float* sV = sK + kSimtBK * ld;
  float* sP = sV + kSimtBK * ldv;
  int* sKpos = reinterpret_cast<int*>(sP + kSimtBQ * (kSimtBK + 1));

  const int head = int(blockIdx.x % unsigned(a.hq));
  const int tile = a.tiles - 1 - int(blockIdx.x / unsigned(a.hq));
  TileWork w;
  if (!findTile<kSimtThreads>(a, tile, kSimtBQ, w)) return;
  takeKeyChunk(a, kSimtBK, w);
  const int kvh = head / (a.hq / a.hkv);
  const size_t qstride = size_t(a.hq) * D, kstride = size_t(a.hkv) * D, vstride = size_t(a.hkv) * Dv;
  const T* gq = static_cast<const T*>(a.q) + size_t(w.q0) * qstride + size_t(head) * D;
  const T* gk = static_cast<const T*>(a.k) + size_t(kvh) * D;
  const T* gv = static_cast<const T*>(a.v) + size_t(kvh) * Dv;
  const int nrows = w.q1 - w.q0;
  for (int i = threadIdx.x; i < kSimtBQ * D; i += kSimtThreads) {
    const int r = i / D, c = i % D;
    sQ[r * ld + c] = r < nrows ? F32<T>::load(gq[size_t(r) * qstride + c]) * a.scale_log2 : 0.0f;
  }

  const int r = threadIdx.x >> 2, sl = threadIdx.x & 3, lane = threadIdx.x & 31;
  const int row = w.q0 + r;
  const bool row_ok = row < w.q1;
  const int my_qpos = (a.bounded && row_ok) ? a.q_pos[row] : INT_MIN;
  int my_lo = INT_MIN, my_hi = INT_MAX;  // the key positions my row sees
  int cta_qlo = INT_MAX, cta_qhi = INT_MIN, warp_qlo = INT_MAX, warp_qhi = INT_MIN;
  if (a.bounded) {
    rowSpan(a, my_qpos, my_lo, my_hi);
    warpPosBounds(a.q_pos, w.q0, w.q1, cta_qlo, cta_qhi);
    // This warp's 8 rows: reduce my_qpos over the warp.
    warp_qlo = row_ok ? my_qpos : INT_MAX;
    warp_qhi = my_qpos;
    for (int o = 16; o; o >>= 1) {
      warp_qlo = min(warp_qlo, __shfl_xor_sync(0xffffffffu, warp_qlo, o));
      warp_qhi = max(warp_qhi, __shfl_xor_sync(0xffffffffu, warp_qhi, o));
    }
  }
  const bool warp_rows = w.q0 + int(threadIdx.x >> 5) * 8 < w.q1;

  float acc[64];
#pragma unroll
  for (int j = 0; j < 64; ++j) acc[j] = 0.0f;
  float m2 = -INFINITY, l = 0.0f;
  TileCounts counts;

  for (int k0 = w.kb; k0 < w.ke; k0 += kSimtBK) {
    const int nk = min(kSimtBK, w.ke - k0);
    int klo = INT_MIN, khi = INT_MIN;
    if (a.bounded) {
      warpPosBounds(a.k_pos, k0, k0 + nk, klo, khi);
      if (noneVisible(a, klo, khi, cta_qlo, cta_qhi)) {
        ++counts.skipped;
        continue;
      }
    }
    const bool needs_mask = a.bounded && !allVisible(a, klo, khi, cta_qlo, cta_qhi);
    if (needs_mask) ++counts.masked;
    else ++counts.full;

    __syncthreads();  // previous tile's readers are done (and Q is stored, first time)
    // K and V rows in one pass over the wider of the two (D == Dv: both always).
    const int W = max(D, Dv);
    for (int i = threadIdx.x; i < kSimtBK * W; i += kSimtThreads) {
      const int kr = i / W, c = i % W;
      const bool ok = kr < nk;
      const size_t row = ok ? keyRow(a, k0 + kr) : 0;
      if (c < D) sK[kr * ld + c] = ok ? F32<T>::load(gk[row * kstride + c]) : 0.0f;
      if (c < Dv) sV[kr * ldv + c] = ok ? F32<T>::load(gv[row * vstride + c]) : 0.0f;
    }
    if (threadIdx.x < kSimtBK)
      sKpos[threadIdx.x] = (a.bounded && int(threadIdx.x) < nk) ? a.k_pos[k0 + threadIdx.x] : 0;
    __syncthreads();
    // No barrier follows in this tile.
    if (!warp_rows || (a.bounded && noneVisible(a, klo, khi, warp_qlo, warp_qhi))) continue;

    // Scores of my row for keys sl, sl+4, ..., sl+28.
    float s[8];
    float mt = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int c = sl + 4 * j;
      float dot = 0.0f;
      for (int d = 0; d < D; ++d) dot = fmaf(sQ[r * ld + d], sK[c * ld + d], dot);
      if (a.cap != 0.0f) dot = capScore(a, dot);  // Q is pre-scaled: dot is the log2-domain score
      bool ok = row_ok && c < nk;
      if (needs_mask) ok = ok && sKpos[c] >= my_lo && sKpos[c] <= my_hi;
      s[j] = ok ? dot : -INFINITY;
      mt = fmaxf(mt, s[j]);
    }
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
    const float mn = fmaxf(m2, mt);
    const float alpha = mn == -INFINITY ? 1.0f : exp2f(m2 - mn);
    float ps = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float p = s[j] == -INFINITY ? 0.0f : exp2f(s[j] - mn);
      sP[r * (kSimtBK + 1) + sl + 4 * j] = p;
      ps += p;
    }
    ps += __shfl_xor_sync(0xffffffffu, ps, 1);
    ps += __shfl_xor_sync(0xffffffffu, ps, 2);
    l = l * alpha + ps;
    m2 = mn;
    __syncwarp();
    // acc[j] holds dim sl + 4 j of my row.
#pragma unroll
    for (int j = 0; j < 64; ++j) acc[j] *= alpha;
    for (int c = 0; c < nk; ++c) {
      const float p = sP[r * (kSimtBK + 1) + c];
      const float* vr = sV + c * ldv + sl;
#pragma unroll
      for (int j = 0; j < 64; ++j)
        if (sl + 4 * j < Dv) acc[j] = fmaf(p, vr[4 * j], acc[j]);
    }
    __syncwarp();  // sP is rewritten by the next tile
  }
  counts.flush(a.stats);
  if (!row_ok) return;

  const float ln = rowLse(m2, l);
  float* go = outO(a, row, head, Dv);
  float* gl = outLse(a, row, head);
  if (!a.accumulate) {
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int j = 0; j < 64; ++j)
      if (sl + 4 * j < Dv) go[sl + 4 * j] = acc[j] * inv;
    if (sl == 0) *gl = ln;
    return;
  }
  const float la = *gl;
  float wa, wn, lo;
  const bool fold = foldWeights(la, ln, wa, wn, lo);
  if (fold) {
    wn /= l;
#pragma unroll
    for (int j = 0; j < 64; ++j)
      if (sl + 4 * j < Dv) {
        const float y = wa != 0.0f ? go[sl + 4 * j] : 0.0f;
        go[sl + 4 * j] = wa * y + wn * acc[j];
      }
  }
  // The row's four lanes have all read the old LSE before lane sl == 0
  // writes it (they share row_ok, so all four are here).
  __syncwarp(0xfu << (lane & ~3));
  if (fold && sl == 0) *gl = lo;
}

}  // namespace attn::cuda
