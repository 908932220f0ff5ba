// Tensor-core attention tile kernel on mma.sync (fp16 / bf16 in, fp32
// accumulate), in the manner of FlashAttention-2: scores, softmax weights
// and the output stay in registers, in the fragment layouts the PTX ISA
// documents (mma_ptx.cuh), so nothing but K, V and Q passes through shared
// memory.
//
// CTA: 64 rows, 4 warps of 16; key tiles of 64. GQA packing: a CTA's rows
// are (query row, q head) pairs of one kv head's group, the heads varying
// fastest (a.heads_per_cta of them, 64 / that many query rows), so each
// K/V tile staged serves every head of the group: a decode step reads its
// keys once per kv head instead of once per q head. Without GQA a CTA is
// 64 query rows of one head, as in the WMMA kernel. Each
// thread owns rows g and g + 8 of its warp (g = lane / 4) and, per 8-key
// column block, keys 2t and 2t + 1 (t = lane % 4): row max and sum reduce
// over the 4 lanes of a quad. S = Q K^T lands in mma accumulators; the
// weights P, rounded to the input type, become the A operand of P V
// without moving (an accumulator pair of key blocks 2kk, 2kk+1 is the A
// fragment of keys 16kk..16kk+15).
//
// Loads overlap compute as in FlashAttention-2, one K and one V buffer:
// V of tile j is copied while S and the softmax of tile j run, K of the
// next tile while P V of tile j runs. Q fragments stay in registers for
// head_dim <= 128 (256 would leave too few registers for the output).
//
// MLA heads (D = head dim of Q and K, Dv of V and O, DeepSeek's 192 / 128):
// S = Q K^T runs over D, the V tile and the output accumulators over Dv.
// An instance with D == Dv is the code it was before Dv existed.
#pragma once

#include <cuda_pipeline_primitives.h>

#include "kernels/cuda/attention_tile.cuh"
#include "kernels/cuda/mma_ptx.cuh"

namespace attn::cuda {

constexpr int kMmaBQ = 64, kMmaBK = 64, kMmaThreads = 128;

template <int D, int Dv>
struct MmaSmem {
  // Row strides (elements) of Q / K and of V: rows 16 bytes apart modulo
  // 128, so the 8 row addresses of one ldmatrix fall in different banks.
  static constexpr int kLd = D + 8;
  static constexpr int kLdV = Dv + 8;
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + size_t(kMmaBQ) * kLd * 2;
  static constexpr size_t kV = kK + size_t(kMmaBK) * kLd * 2;
  static constexpr size_t kKpos = kV + size_t(kMmaBK) * kLdV * 2;
  static constexpr size_t kBytes = kKpos + size_t(kMmaBK) * 4;
};

// This lane's row address for an x4 ldmatrix of a 16 x 16 block at (r0, c0)
// of a row-major tile: matrices (rows 0-7, cols 0-7), (8-15, 0-7),
// (0-7, 8-15), (8-15, 8-15). For Q that is the A fragment; for V, loaded
// transposed, the B fragments of two 8-column blocks.
template <int kLd, class T>
__device__ inline const T* blockRow(const T* s, int r0, int c0, int lane) {
  return s + (r0 + (lane & 15)) * kLd + c0 + (lane >> 4) * 8;
}

template <class T, int D, int Dv>
__global__ void __launch_bounds__(kMmaThreads)
attnMmaKernel(AttnArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  static_assert(D % 16 == 0 && Dv % 16 == 0, "whole 16-column blocks");
  using L = MmaSmem<D, Dv>;
  // Q stays in registers up to D = 128; 192 (MLA) and 256 re-read it from
  // shared memory per tile (192 / 128 with Q in registers takes ~250
  // registers, 2 CTAs per SM; re-read, 168 on sm_90a: 3).
  constexpr bool kQInRegs = D <= 128;
  constexpr int kNB = kMmaBK / 8;  // 8-key column blocks of S
  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem + L::kQ);
  T* sK = reinterpret_cast<T*>(smem + L::kK);
  T* sV = reinterpret_cast<T*>(smem + L::kV);
  int* sKpos = reinterpret_cast<int*>(smem + L::kKpos);
  const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31);
  const int g = lane >> 2, t = lane & 3;

  // The CTA's (query tile, kv head, heads of its group): the head slots of
  // a tile vary fastest so CTAs of one kv head run together and share K/V
  // in L2; tiles run last-first (later causal tiles have more keys).
  const int slot = int(blockIdx.x % unsigned(a.head_slots));
  const int tile = a.tiles - 1 - int(blockIdx.x / unsigned(a.head_slots));
  const int group = a.hq / a.hkv, hc = a.heads_per_cta;
  const int chunks = (group + hc - 1) / hc;
  const int kvh = slot / chunks;
  const int head0 = kvh * group + (slot % chunks) * hc;
  const int nheads = min(hc, (kvh + 1) * group - head0);
  TileWork w;
  if (!findTile<kMmaThreads>(a, tile, kMmaBQ / hc, w)) return;
  takeKeyChunk(a, kMmaBK, w);
  const size_t kstride = size_t(a.hkv) * D;
  [[maybe_unused]] const size_t vstride = size_t(a.hkv) * Dv;
  const T* gk = static_cast<const T*>(a.k) + size_t(kvh) * D;
  const T* gv = static_cast<const T*>(a.v) + size_t(kvh) * Dv;
  // Row r of the CTA is query row w.q0 + r / hc of head head0 + r % hc.
  const int nrows = w.q1 - w.q0;
  auto rowOk = [&](int r) { return r / hc < nrows && r % hc < nheads; };
  {
    constexpr int kVec = 16 / sizeof(T), kPerRow = D / kVec;
    const T* q = static_cast<const T*>(a.q);
    for (int i = int(threadIdx.x); i < kMmaBQ * kPerRow; i += kMmaThreads) {
      const int r = i / kPerRow, c = (i % kPerRow) * kVec;
      T* dst = sQ + r * L::kLd + c;
      if (rowOk(r))
        __pipeline_memcpy_async(dst, q + (size_t(w.q0 + r / hc) * a.hq + size_t(head0 + r % hc)) * D + c, 16);
      else
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
    __pipeline_commit();
  }

  // This thread's rows are r0 = 16 warp + g and r0 + 8; the warp's query
  // rows run from wq0 to wq1 (exclusive).
  const int r0 = warp * 16 + g, r1 = r0 + 8;
  const bool ok0 = rowOk(r0), ok1 = rowOk(r1);
  int any = rowOk(warp * 16 + (lane & 15));
#pragma unroll
  for (int x = 1; x < 16; x <<= 1) any |= __shfl_xor_sync(0xffffffffu, any, x);
  const bool warp_rows = any != 0;
  const int wq0 = w.q0 + warp * 16 / hc, wq1 = min(w.q1, w.q0 + (warp * 16 + 15) / hc + 1);
  // The key positions rows r0 and r1 see.
  int lo0 = INT_MIN, hi0 = INT_MAX, lo1 = INT_MIN, hi1 = INT_MAX;
  int cta_qlo = INT_MAX, cta_qhi = INT_MIN, warp_qlo = INT_MAX, warp_qhi = INT_MIN;
  if (a.bounded) {
    if (ok0) rowSpan(a, a.q_pos[w.q0 + r0 / hc], lo0, hi0);
    if (ok1) rowSpan(a, a.q_pos[w.q0 + r1 / hc], lo1, hi1);
    warpPosBounds64(a.q_pos, w.q0, w.q1, cta_qlo, cta_qhi);
    warpPosBounds(a.q_pos, wq0, wq1, warp_qlo, warp_qhi);
  }

  TileCounts counts;
  // The first key tile from k0 on that is not wholly masked for the CTA
  // (uniform: every warp computes the same bounds), with its bounds.
  auto nextTile = [&](int k0, int& klo, int& khi) {
    for (; k0 < w.ke; k0 += kMmaBK) {
      if (!a.bounded) return k0;
      warpPosBounds64(a.k_pos, k0, min(w.ke, k0 + kMmaBK), klo, khi);
      if (!noneVisible(a, klo, khi, cta_qlo, cta_qhi)) return k0;
      counts.skipped += unsigned(nheads);  // counted per (query tile, q head)
    }
    return w.ke;
  };
  // Paged K/V: rows from the row table; else from row k0 on.
  auto stageKeys = [&](T* s, const T* base, int k0) {
    const int64_t* idx = a.k_rows != nullptr ? a.k_rows + k0 : nullptr;
    const size_t first = idx != nullptr ? 0 : size_t(k0) * kstride;
    stageRows<T, D, L::kLd, kMmaThreads>(s, base + first, min(kMmaBK, w.ke - k0), kstride, kMmaBK, idx);
    __pipeline_commit();
  };
  // V's rows, Dv wide (MLA); with D == Dv those of K (the code before Dv).
  auto stageV = [&](int k0) {
    if constexpr (D == Dv) {
      stageKeys(sV, gv, k0);
    } else {
      const int64_t* idx = a.k_rows != nullptr ? a.k_rows + k0 : nullptr;
      const size_t first = idx != nullptr ? 0 : size_t(k0) * vstride;
      stageRows<T, Dv, L::kLdV, kMmaThreads>(sV, gv + first, min(kMmaBK, w.ke - k0), vstride, kMmaBK, idx);
      __pipeline_commit();
    }
  };
  auto stageK = [&](int k0) {
    stageKeys(sK, gk, k0);
    const int nk = min(kMmaBK, w.ke - k0);
    if (threadIdx.x < kMmaBK)
      sKpos[threadIdx.x] = (a.bounded && int(threadIdx.x) < nk) ? a.k_pos[k0 + int(threadIdx.x)] : 0;
  };

  [[maybe_unused]] uint32_t qf[kQInRegs ? D / 16 : 1][4];
  float o[Dv / 8][4];
#pragma unroll
  for (int f = 0; f < Dv / 8; ++f) o[f][0] = o[f][1] = o[f][2] = o[f][3] = 0.0f;
  // Running max (log2 domain) of rows g, g+8, and this thread's part of
  // their denominators (the quad's parts add up at the end: the rescale
  // factor is the same in all four lanes).
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  [[maybe_unused]] bool q_loaded = false;

  int klo = INT_MIN, khi = INT_MIN;
  int k0 = nextTile(w.kb, klo, khi);
  if (k0 < w.ke) stageK(k0);
  while (k0 < w.ke) {
    const int nk = min(kMmaBK, w.ke - k0);
    const bool needs_mask = a.bounded && !allVisible(a, klo, khi, cta_qlo, cta_qhi);
    if (needs_mask) counts.masked += unsigned(nheads);
    else counts.full += unsigned(nheads);
    __pipeline_wait_prior(0);  // Q (first tile) and this tile's K have landed
    __syncthreads();           // for every thread; every warp is done with the last V
    stageV(k0);                // lands while S and the softmax run

    const bool active = warp_rows && !(a.bounded && noneVisible(a, klo, khi, warp_qlo, warp_qhi));
    uint32_t p[kMmaBK / 16][4];  // the weights, as A fragments of P V
    if (active) {
      if constexpr (kQInRegs) {
        if (!q_loaded) {
#pragma unroll
          for (int kk = 0; kk < D / 16; ++kk) ptx::ldmatrixX4(qf[kk], blockRow<L::kLd>(sQ, warp * 16, kk * 16, lane));
          q_loaded = true;
        }
      }
      float s[kNB][4];
#pragma unroll
      for (int j = 0; j < kNB; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t qa[4];
        if constexpr (kQInRegs) {
#pragma unroll
          for (int i = 0; i < 4; ++i) qa[i] = qf[kk][i];
        } else {
          ptx::ldmatrixX4(qa, blockRow<L::kLd>(sQ, warp * 16, kk * 16, lane));
        }
#pragma unroll
        for (int n = 0; n < kMmaBK / 16; ++n) {
          // Keys 16n..16n+15, dims 16kk..16kk+15: the B fragments of key
          // blocks 2n and 2n+1 (K row-major is B column-major).
          uint32_t kb[4];
          ptx::ldmatrixX4(kb, sK + (n * 16 + (lane >> 4) * 8 + (lane & 7)) * L::kLd + kk * 16 + ((lane >> 3) & 1) * 8);
          ptx::mma16816<T>(s[2 * n], qa, kb[0], kb[1]);
          ptx::mma16816<T>(s[2 * n + 1], qa, kb[2], kb[3]);
        }
      }
      // Softcap on the scaled score (then already in the log2 domain).
      float mul = a.scale_log2;
      if (a.cap != 0.0f) {
#pragma unroll
        for (int j = 0; j < kNB; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[j][e] = a.cap * tanhf(s[j][e] * a.cap_in);
        mul = 1.0f;
      }
      // Mask and scale; -inf where a pair is masked, out of range, or the row is.
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int j = 0; j < kNB; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = j * 8 + 2 * t + e;
          bool c0 = ok0 && c < nk, c1 = ok1 && c < nk;
          if (needs_mask) {
            const int kp = sKpos[c];
            c0 = c0 && kp >= lo0 && kp <= hi0;
            c1 = c1 && kp >= lo1 && kp <= hi1;
          }
          s[j][e] = c0 ? s[j][e] * mul : -INFINITY;
          s[j][2 + e] = c1 ? s[j][2 + e] * mul : -INFINITY;
          mx0 = fmaxf(mx0, s[j][e]);
          mx1 = fmaxf(mx1, s[j][2 + e]);
        }
#pragma unroll
      for (int x = 1; x <= 2; x <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
      }
      const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
      // A row that has seen nothing yet keeps O = 0: any factor works.
      const float al0 = mn0 == -INFINITY ? 1.0f : exp2f(m0 - mn0);
      const float al1 = mn1 == -INFINITY ? 1.0f : exp2f(m1 - mn1);
      float ps0 = 0.0f, ps1 = 0.0f;
      auto weight = [](float sc, float mn) { return sc == -INFINITY ? 0.0f : exp2f(sc - mn); };
#pragma unroll
      for (int kk = 0; kk < kMmaBK / 16; ++kk)
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // key block 2kk + h: registers 2h (row g), 2h+1 (row g+8)
          const float* sj = s[2 * kk + h];
          float r0, r1, r2, r3;
          p[kk][2 * h] = ptx::pack2<T>(weight(sj[0], mn0), weight(sj[1], mn0), r0, r1);
          p[kk][2 * h + 1] = ptx::pack2<T>(weight(sj[2], mn1), weight(sj[3], mn1), r2, r3);
          ps0 += r0 + r1;  // the rounded weights: O stays a true weighted average
          ps1 += r2 + r3;
        }
      l0 = l0 * al0 + ps0;
      l1 = l1 * al1 + ps1;
      m0 = mn0;
      m1 = mn1;
#pragma unroll
      for (int f = 0; f < Dv / 8; ++f) {
        o[f][0] *= al0;
        o[f][1] *= al0;
        o[f][2] *= al1;
        o[f][3] *= al1;
      }
    }
    __pipeline_wait_prior(0);  // V has landed
    __syncthreads();           // for every thread; every warp is done with sK and sKpos
    int nlo = INT_MIN, nhi = INT_MIN;
    const int k1 = nextTile(k0 + kMmaBK, nlo, nhi);
    if (k1 < w.ke) stageK(k1);  // lands while P V runs
    if (active) {
#pragma unroll
      for (int kk = 0; kk < kMmaBK / 16; ++kk)
#pragma unroll
        for (int f = 0; f < Dv / 16; ++f) {
          uint32_t vb[4];
          ptx::ldmatrixX4Trans(vb, blockRow<L::kLdV>(sV, kk * 16, f * 16, lane));
          ptx::mma16816<T>(o[2 * f], p[kk], vb[0], vb[1]);
          ptx::mma16816<T>(o[2 * f + 1], p[kk], vb[2], vb[3]);
        }
    }
    k0 = k1;
    klo = nlo;
    khi = nhi;
  }
  __pipeline_wait_prior(0);  // no key tile at all: Q's copy is still outstanding
  counts.flush(a.stats);

#pragma unroll
  for (int x = 1; x <= 2; x <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, x);
    l1 += __shfl_xor_sync(0xffffffffu, l1, x);
  }
  // Accumulate mode: every lane of a row's quad reads its old LSE before
  // lane t = 0 overwrites it.
  float la0 = -INFINITY, la1 = -INFINITY;
  if (a.accumulate) {
    if (ok0) la0 = *outLse(a, w.q0 + r0 / hc, head0 + r0 % hc);
    if (ok1) la1 = *outLse(a, w.q0 + r1 / hc, head0 + r1 % hc);
    __syncwarp();
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (!(h == 0 ? ok0 : ok1)) continue;
    const int r = h == 0 ? r0 : r1, row = w.q0 + r / hc, head = head0 + r % hc;
    const float l = h == 0 ? l0 : l1;
    const float ln = rowLse(h == 0 ? m0 : m1, l);
    float* go = outO(a, row, head, Dv) + 2 * t;
    float wa = 0.0f, wn = 0.0f, lo = ln;
    if (!a.accumulate) {
      wn = l > 0.0f ? 1.0f / l : 0.0f;
    } else {
      if (!foldWeights(h == 0 ? la0 : la1, ln, wa, wn, lo)) continue;  // saw nothing: untouched
      wn /= l;
    }
#pragma unroll
    for (int f = 0; f < Dv / 8; ++f) {
      float2 y = make_float2(0.0f, 0.0f);
      if (wa != 0.0f) y = *reinterpret_cast<const float2*>(go + f * 8);
      *reinterpret_cast<float2*>(go + f * 8) =
          make_float2(wa * y.x + wn * o[f][2 * h], wa * y.y + wn * o[f][2 * h + 1]);
    }
    if (t == 0) *outLse(a, row, head) = lo;
  }
#else
  __trap();  // built without sm_80 support; the host never picks this path there
#endif
}

}  // namespace attn::cuda
