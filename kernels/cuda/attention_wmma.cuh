// Tensor-core attention tile kernel (fp16 / bf16 in, fp32 accumulate), with
// WMMA (nvcuda::wmma), which is portable across sm_80+ and runs on Hopper as
// built for sm_90a.
//
// CTA: 64 query rows of one q head, 4 warps, each owning 16 rows. Key tiles
// of 64 rows: K and V are staged in shared memory with cp.async (V's copy
// overlaps the score and softmax work), S = Q K^T per warp goes through
// shared memory for the online softmax (fp32, exp2 domain), P is rounded to
// the input type and P V accumulates into WMMA fragments held in registers
// across all key tiles. Rescaling those fragments by the per-row factor
// needs the row of each fragment element; WMMA does not document the
// layout, so each warp learns it once by loading a matrix whose entries are
// their own row numbers.
//
// MLA heads (D = head dim of Q and K, Dv of V and O): S over D, the V tile,
// the accumulators and the output staging over Dv. An instance with
// D == Dv is the code it was before Dv existed.
#pragma once

#include <cuda_pipeline_primitives.h>
#include <mma.h>

#include "kernels/cuda/attention_tile.cuh"

namespace attn::cuda {

constexpr int kWmmaBQ = 64, kWmmaBK = 64, kWmmaWarps = 4, kWmmaThreads = 128;

template <int D, int Dv>
struct WmmaSmem {
  static constexpr int kLdT = D + 8;          // Q/K row stride (elements): breaks bank aliasing
  static constexpr int kLdV = Dv + 8;         // V row stride (elements)
  static constexpr int kLdS = kWmmaBK + 4;    // score row stride (floats)
  static constexpr int kLdP = kWmmaBK + 8;    // P row stride (elements)
  static constexpr int kLdO = Dv + 4;         // output staging row stride (floats)
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + size_t(kWmmaBQ) * kLdT * 2;
  static constexpr size_t kV = kK + size_t(kWmmaBK) * kLdT * 2;
  static constexpr size_t kS = kV + size_t(kWmmaBK) * kLdV * 2;
  static constexpr size_t kP = kS + size_t(kWmmaWarps) * 16 * kLdS * 4;
  static constexpr size_t kRow = kP + size_t(kWmmaWarps) * 16 * kLdP * 2;  // per-row factor
  static constexpr size_t kKpos = kRow + size_t(kWmmaBQ) * 4;
  static constexpr size_t kBytes = kKpos + size_t(kWmmaBK) * 4;
  // The output staging (16 x kLdO floats per warp) reuses K and V.
  static_assert(size_t(kWmmaWarps) * 16 * kLdO * 4 <= kS - kK, "staging fits in K+V");
};

template <class T, int D, int Dv>
__global__ void __launch_bounds__(kWmmaThreads)
attnWmmaKernel(AttnArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using namespace nvcuda;
  static_assert(D % 16 == 0 && Dv % 16 == 0, "whole 16-column blocks");
  using L = WmmaSmem<D, Dv>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem + L::kQ);
  T* sK = reinterpret_cast<T*>(smem + L::kK);
  T* sV = reinterpret_cast<T*>(smem + L::kV);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* sS = reinterpret_cast<float*>(smem + L::kS) + warp * 16 * L::kLdS;
  T* sP = reinterpret_cast<T*>(smem + L::kP) + warp * 16 * L::kLdP;
  float* sRow = reinterpret_cast<float*>(smem + L::kRow) + warp * 16;
  int* sKpos = reinterpret_cast<int*>(smem + L::kKpos);

  // Heads vary fastest so CTAs of one kv head group run together and share
  // K/V in L2; tiles run last-first (later causal tiles have more keys).
  const int head = int(blockIdx.x % unsigned(a.hq));
  const int tile = a.tiles - 1 - int(blockIdx.x / unsigned(a.hq));
  TileWork w;
  if (!findTile<kWmmaThreads>(a, tile, kWmmaBQ, w)) return;
  takeKeyChunk(a, kWmmaBK, w);
  const int kvh = head / (a.hq / a.hkv);
  const size_t qstride = size_t(a.hq) * D, kstride = size_t(a.hkv) * D;
  const size_t vstride = D == Dv ? kstride : size_t(a.hkv) * Dv;
  const T* gq = static_cast<const T*>(a.q) + size_t(w.q0) * qstride + size_t(head) * D;
  const T* gk = static_cast<const T*>(a.k) + size_t(kvh) * D;
  const T* gv = static_cast<const T*>(a.v) + size_t(kvh) * Dv;

  stageRows<T, D, L::kLdT, kWmmaThreads>(sQ, gq, w.q1 - w.q0, qstride, kWmmaBQ);
  __pipeline_commit();

  // Row of each accumulator element, learnt from a matrix of row numbers.
  using AccFrag = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
  int rowOf[AccFrag::num_elements];
  {
    for (int i = lane; i < 16 * 16; i += 32) sS[(i / 16) * L::kLdS + i % 16] = float(i / 16);
    __syncwarp();
    AccFrag f;
    wmma::load_matrix_sync(f, sS, L::kLdS, wmma::mem_row_major);
#pragma unroll
    for (int i = 0; i < AccFrag::num_elements; ++i) rowOf[i] = int(f.x[i]);
    __syncwarp();
  }

  // This warp's rows; lanes 2r and 2r+1 own row r in the softmax.
  const int wr0 = w.q0 + warp * 16, wr1 = min(w.q1, wr0 + 16);
  const int my_row = wr0 + lane / 2;
  const bool row_ok = my_row < wr1;
  int my_lo = INT_MIN, my_hi = INT_MAX;  // the key positions my row sees
  int cta_qlo = INT_MAX, cta_qhi = INT_MIN, warp_qlo = INT_MAX, warp_qhi = INT_MIN;
  if (a.bounded) {
    if (row_ok) rowSpan(a, a.q_pos[my_row], my_lo, my_hi);
    warpPosBounds64(a.q_pos, w.q0, w.q1, cta_qlo, cta_qhi);
    warpPosBounds(a.q_pos, wr0, wr1, warp_qlo, warp_qhi);
  }
  const bool warp_rows = wr0 < wr1;

  AccFrag acc[Dv / 16];
#pragma unroll
  for (int f = 0; f < Dv / 16; ++f) wmma::fill_fragment(acc[f], 0.0f);
  float m2 = -INFINITY, l = 0.0f;  // running max (log2 domain) and denominator of my row
  TileCounts counts;

  for (int k0 = w.kb; k0 < w.ke; k0 += kWmmaBK) {
    const int nk = min(kWmmaBK, w.ke - k0);
    int klo = INT_MIN, khi = INT_MIN;
    if (a.bounded) {
      warpPosBounds64(a.k_pos, k0, k0 + nk, klo, khi);
      if (noneVisible(a, klo, khi, cta_qlo, cta_qhi)) {  // every pair masked: uniform over the CTA
        ++counts.skipped;
        continue;
      }
    }
    const bool needs_mask = a.bounded && !allVisible(a, klo, khi, cta_qlo, cta_qhi);
    if (needs_mask) ++counts.masked;
    else ++counts.full;

    __syncthreads();  // the previous tile's readers of sK / sV / sKpos are done
    // Paged K/V: rows from the row table; else from row k0 on.
    const int64_t* idx = a.k_rows != nullptr ? a.k_rows + k0 : nullptr;
    const size_t first = idx != nullptr ? 0 : size_t(k0) * kstride;
    stageRows<T, D, L::kLdT, kWmmaThreads>(sK, gk + first, nk, kstride, kWmmaBK, idx);
    __pipeline_commit();
    const size_t vfirst = D == Dv ? first : idx != nullptr ? 0 : size_t(k0) * vstride;
    stageRows<T, Dv, L::kLdV, kWmmaThreads>(sV, gv + vfirst, nk, vstride, kWmmaBK, idx);
    __pipeline_commit();
    if (threadIdx.x < kWmmaBK)
      sKpos[threadIdx.x] = (a.bounded && int(threadIdx.x) < nk) ? a.k_pos[k0 + threadIdx.x] : 0;
    __pipeline_wait_prior(1);  // Q (first tile) and K have landed
    __syncthreads();

    const bool active = warp_rows && !(a.bounded && noneVisible(a, klo, khi, warp_qlo, warp_qhi));
    if (active) {
      // S = Q K^T for this warp's 16 rows x 64 keys.
#pragma unroll 1
      for (int n = 0; n < kWmmaBK / 16; ++n) {
        AccFrag s;
        wmma::fill_fragment(s, 0.0f);
#pragma unroll 4
        for (int kk = 0; kk < D / 16; ++kk) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> qa;
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> kb;
          wmma::load_matrix_sync(qa, sQ + warp * 16 * L::kLdT + kk * 16, L::kLdT);
          wmma::load_matrix_sync(kb, sK + n * 16 * L::kLdT + kk * 16, L::kLdT);
          wmma::mma_sync(s, qa, kb, s);
        }
        wmma::store_matrix_sync(sS + n * 16, s, L::kLdS, wmma::mem_row_major);
      }
      __syncwarp();
      // Online softmax: lane pair per row, 32 columns each. Two passes over
      // sS instead of holding 32 scores in registers: D = 256 keeps 128
      // accumulator registers live, and this is what avoids spilling there.
      const int r = lane / 2, c0 = (lane & 1) * 32;
      // Softcap: capped once in place (the passes below read each score twice).
      float mul = a.scale_log2;
      if (a.cap != 0.0f) {
        for (int j = 0; j < 32; ++j) {
          float* x = sS + r * L::kLdS + c0 + j;
          *x = a.cap * tanhf(*x * a.cap_in);
        }
        mul = 1.0f;
      }
      auto score = [&](int c) {
        bool ok = row_ok && c < nk;
        if (needs_mask) ok = ok && sKpos[c] >= my_lo && sKpos[c] <= my_hi;
        return ok ? sS[r * L::kLdS + c] * mul : -INFINITY;
      };
      float mt = -INFINITY;
#pragma unroll 8
      for (int j = 0; j < 32; ++j) mt = fmaxf(mt, score(c0 + j));
      mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
      const float mn = fmaxf(m2, mt);
      // A row that has seen nothing yet keeps O = 0: any factor works.
      const float alpha = mn == -INFINITY ? 1.0f : exp2f(m2 - mn);
      float ps = 0.0f;
#pragma unroll 8
      for (int j = 0; j < 32; ++j) {
        const float sc = score(c0 + j);
        const T p = F32<T>::store(sc == -INFINITY ? 0.0f : exp2f(sc - mn));
        sP[r * L::kLdP + c0 + j] = p;
        ps += F32<T>::load(p);  // the rounded weights: O stays a true weighted average
      }
      ps += __shfl_xor_sync(0xffffffffu, ps, 1);
      l = l * alpha + ps;
      m2 = mn;
      if ((lane & 1) == 0) sRow[r] = alpha;
      __syncwarp();
#pragma unroll
      for (int f = 0; f < Dv / 16; ++f)
#pragma unroll
        for (int i = 0; i < AccFrag::num_elements; ++i) acc[f].x[i] *= sRow[rowOf[i]];
    }
    __pipeline_wait_prior(0);  // V has landed
    __syncthreads();
    if (active) {
#pragma unroll 1
      for (int kk = 0; kk < kWmmaBK / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> pa;
        wmma::load_matrix_sync(pa, sP + kk * 16, L::kLdP);
#pragma unroll
        for (int f = 0; f < Dv / 16; ++f) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> vb;
          wmma::load_matrix_sync(vb, sV + kk * 16 * L::kLdV + f * 16, L::kLdV);
          wmma::mma_sync(acc[f], pa, vb, acc[f]);
        }
      }
    }
  }
  __pipeline_wait_prior(0);  // no key tile at all: Q's copy is still outstanding
  counts.flush(a.stats);
  __syncthreads();  // every warp is done with sK / sV: reuse them for the output

  float* sO = reinterpret_cast<float*>(smem + L::kK) + warp * 16 * L::kLdO;
#pragma unroll
  for (int f = 0; f < Dv / 16; ++f)
    wmma::store_matrix_sync(sO + f * 16, acc[f], L::kLdO, wmma::mem_row_major);
  if ((lane & 1) == 0) sRow[lane / 2] = l;
  float* rowM = reinterpret_cast<float*>(sKpos);  // m2 per row, 16 per warp: reuse the 64 ints
  __syncthreads();
  if ((lane & 1) == 0) rowM[warp * 16 + lane / 2] = m2;
  __syncwarp();

  for (int r = 0; r < wr1 - wr0; ++r) {
    const int row = wr0 + r;
    const float lr = sRow[r];
    const float ln = rowLse(rowM[warp * 16 + r], lr);
    float* go = outO(a, row, head, Dv);
    float* gl = outLse(a, row, head);
    const float* so = sO + r * L::kLdO;
    if (!a.accumulate) {
      const float inv = lr > 0.0f ? 1.0f / lr : 0.0f;
      for (int c = lane * 4; c < Dv; c += 128) {
        const float4 x = *reinterpret_cast<const float4*>(so + c);
        *reinterpret_cast<float4*>(go + c) = make_float4(x.x * inv, x.y * inv, x.z * inv, x.w * inv);
      }
      if (lane == 0) *gl = ln;
    } else {
      const float la = *gl;
      float wa, wn, lo;
      if (foldWeights(la, ln, wa, wn, lo)) {
        wn /= lr;
        for (int c = lane * 4; c < Dv; c += 128) {
          const float4 x = *reinterpret_cast<const float4*>(so + c);
          float4 y = make_float4(0.f, 0.f, 0.f, 0.f);
          if (wa != 0.0f) y = *reinterpret_cast<const float4*>(go + c);
          *reinterpret_cast<float4*>(go + c) =
              make_float4(wa * y.x + wn * x.x, wa * y.y + wn * x.y, wa * y.z + wn * x.z,
                          wa * y.w + wn * x.w);
        }
        __syncwarp();  // every lane has read the old LSE
        if (lane == 0) *gl = lo;
      }
    }
  }
#else
  __trap();  // built without sm_80 support; the host never picks this path there
#endif
}

}  // namespace attn::cuda
