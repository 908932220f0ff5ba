// N-way merge of (O, LSE) partials into an fp32 accumulator, in place
// (contract of kernels/cpu/merge.h). Bandwidth-bound: a group of threads
// owns a row, each thread moves 16 bytes of fp32 (8 of fp16/bf16) per load;
// the row's weights are computed once per thread from the LSE values
// (broadcast reads). A -inf partial is never read, so garbage in its O
// cannot leak (0 * NaN). A partial's LSE is read in its own convention
// (base 2, head-major), so an engine kernel's output folds as it is.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/kernel_status.h"

namespace attn::cuda {
namespace {

constexpr int kMergeThreads = 256;

struct MergeArgs {
  float* o_acc;
  float* lse_acc;
  const void* o[kMergeMaxPartsPerLaunch];
  const float* lse[kMergeMaxPartsPerLaunch];
  attnDataType_t type[kMergeMaxPartsPerLaunch];
  float lscale[kMergeMaxPartsPerLaunch];  // to natural log: 1, or ln 2 (base 2)
  int lheads[kMergeMaxPartsPerLaunch];    // head-major: heads per token row; 0: token-major
  int nparts;
  size_t rows;  // partial rows (= accumulator rows unless acc_rows)
  int d;
  int tpr;                  // threads per row (a power of two <= kMergeThreads)
  const int32_t* acc_rows;  // null, or accumulator token of each partial token
  int heads;                // rows per token (with acc_rows)
  size_t acc_tokens;
};

template <int VW>
__device__ inline void loadVec(const void* base, attnDataType_t t, size_t i, float* v) {
  if (t == attnFloat32) {
    const float* p = static_cast<const float*>(base) + i;
    if constexpr (VW == 4) {
      const float4 x = __ldcs(reinterpret_cast<const float4*>(p));
      v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
    } else {
      v[0] = __ldcs(p);
    }
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(base) + i;
    uint16_t h[VW];
    if constexpr (VW == 4) {
      const uint2 x = __ldcs(reinterpret_cast<const uint2*>(p));
      h[0] = uint16_t(x.x), h[1] = uint16_t(x.x >> 16), h[2] = uint16_t(x.y), h[3] = uint16_t(x.y >> 16);
    } else {
      h[0] = __ldcs(reinterpret_cast<const unsigned short*>(p));
    }
#pragma unroll
    for (int j = 0; j < VW; ++j)
      v[j] = t == attnFloat16 ? __half2float(__ushort_as_half(h[j]))
                              : __bfloat162float(__ushort_as_bfloat16(h[j]));
  }
}

// Part j's natural LSE of partial row rp.
__device__ inline float partLse(const MergeArgs& a, int j, size_t rp) {
  const int h = a.lheads[j];
  const size_t i = h == 0 ? rp : (rp % size_t(h)) * (a.rows / size_t(h)) + rp / size_t(h);
  return a.lse[j][i] * a.lscale[j];
}

template <int VW>
__global__ void __launch_bounds__(kMergeThreads) mergeKernel(MergeArgs a) {
  const int rpb = kMergeThreads / a.tpr;
  const size_t rp = size_t(blockIdx.x) * rpb + threadIdx.x / a.tpr;
  const int lane = threadIdx.x % a.tpr;
  bool live = rp < a.rows;
  size_t ra = rp;
  if (live && a.acc_rows) {
    const size_t tok = rp / a.heads;
    const int32_t at = a.acc_rows[tok];
    live = at >= 0 && size_t(at) < a.acc_tokens;
    ra = size_t(at) * a.heads + rp % a.heads;
  }
  float w[kMergeMaxPartsPerLaunch];
  float w0 = 0.0f, lse_new = -INFINITY;
  if (live) {
    const float la = a.lse_acc[ra];
    float mx = la;
    // Loops over parts are unrolled to the launch maximum so that the
    // parameter arrays and w[] are indexed statically (registers, no local memory).
    // w[] holds the parts' natural LSEs first, then their weights.
#pragma unroll
    for (int j = 0; j < kMergeMaxPartsPerLaunch; ++j) {
      w[j] = j < a.nparts ? partLse(a, j, rp) : -INFINITY;
      mx = fmaxf(mx, w[j]);
    }
    if (mx != -INFINITY) {
      w0 = la == -INFINITY ? 0.0f : expf(la - mx);
      float sum = w0;
#pragma unroll
      for (int j = 0; j < kMergeMaxPartsPerLaunch; ++j) {
        const float lj = w[j];
        w[j] = lj == -INFINITY ? 0.0f : expf(lj - mx);
        sum += w[j];
      }
      const float inv = 1.0f / sum;
      w0 *= inv;
#pragma unroll
      for (int j = 0; j < kMergeMaxPartsPerLaunch; ++j) w[j] *= inv;
      lse_new = mx + logf(sum);
    } else {
#pragma unroll
      for (int j = 0; j < kMergeMaxPartsPerLaunch; ++j) w[j] = 0.0f;
    }
    float* oa = a.o_acc + ra * size_t(a.d);
    for (int c = lane * VW; c < a.d; c += a.tpr * VW) {
      float acc[VW];
      if (w0 != 0.0f) {
        if constexpr (VW == 4) {
          const float4 x = *reinterpret_cast<const float4*>(oa + c);
          acc[0] = w0 * x.x, acc[1] = w0 * x.y, acc[2] = w0 * x.z, acc[3] = w0 * x.w;
        } else {
          acc[0] = w0 * oa[c];
        }
      } else {
#pragma unroll
        for (int i = 0; i < VW; ++i) acc[i] = 0.0f;
      }
#pragma unroll
      for (int j = 0; j < kMergeMaxPartsPerLaunch; ++j) {
        if (j >= a.nparts || w[j] == 0.0f) continue;
        float v[VW];
        loadVec<VW>(a.o[j], a.type[j], rp * size_t(a.d) + c, v);
#pragma unroll
        for (int i = 0; i < VW; ++i) acc[i] = fmaf(w[j], v[i], acc[i]);
      }
      if constexpr (VW == 4) *reinterpret_cast<float4*>(oa + c) = make_float4(acc[0], acc[1], acc[2], acc[3]);
      else oa[c] = acc[0];
    }
  }
  __syncthreads();  // every thread of the row has read the old LSE
  if (live && lane == 0) a.lse_acc[ra] = lse_new;
}

attnResult_t launch(MergeArgs& a, cudaStream_t stream) {
  bool vec = a.d % 4 == 0 && aligned(a.o_acc, 16);
  for (int j = 0; j < a.nparts; ++j)
    vec = vec && aligned(a.o[j], a.type[j] == attnFloat32 ? 16 : 8);
  const int vw = vec ? 4 : 1;
  const int nvec = (a.d + vw - 1) / vw;
  int tpr = 1;
  while (tpr < nvec && tpr < kMergeThreads) tpr *= 2;
  a.tpr = tpr;
  const size_t rpb = kMergeThreads / tpr;
  const size_t blocks = (a.rows + rpb - 1) / rpb;
  if (blocks > 0x7fffffffull) return kernels::fail(attnInvalidArgument, "cuda merge: %zu rows is too many", a.rows);
  return launchKernel("merge launch", vec ? mergeKernel<4> : mergeKernel<1>, unsigned(blocks), kMergeThreads,
                      0, stream, a);
}

attnResult_t mergeImpl(float* o_acc, float* lse_acc, const cpu::AttnPartialRef* parts, int nparts,
                       size_t rows, int head_dim, const int32_t* acc_rows, int heads,
                       size_t acc_tokens, cudaStream_t stream) {
  KERNEL_REQUIRE(nparts >= 0 && head_dim > 0, "cuda merge: bad shape (%d parts, head_dim %d)",
               nparts, head_dim);
  KERNEL_REQUIRE(nparts == 0 || parts != nullptr, "cuda merge: null parts array");
  for (int j = 0; j < nparts; ++j) {
    const attnDataType_t t = parts[j].o_dtype;
    KERNEL_REQUIRE(t == attnFloat32 || t == attnFloat16 || t == attnBfloat16,
                 "cuda merge: part %d has dtype %d (not fp32, fp16 or bf16)", j, int(t));
    KERNEL_REQUIRE(rows == 0 || (parts[j].o && parts[j].lse), "cuda merge: part %d has a null pointer", j);
    KERNEL_REQUIRE(cpu::validLseOf(parts[j], rows),
                   "cuda merge: part %d has LSE base %d, layout %d, %d heads (not one of %zu rows)", j,
                   int(parts[j].lse_base), int(parts[j].lse_layout), parts[j].lse_heads, rows);
  }
  if (rows == 0) return attnSuccess;
  KERNEL_REQUIRE(o_acc && lse_acc, "cuda merge: null accumulator");
  // Without parts the merge still normalises -inf rows to O = 0 (as the CPU).
  int j = 0;
  do {
    MergeArgs a{};
    a.o_acc = o_acc;
    a.lse_acc = lse_acc;
    a.nparts = nparts - j < kMergeMaxPartsPerLaunch ? nparts - j : kMergeMaxPartsPerLaunch;
    for (int i = 0; i < a.nparts; ++i) {
      a.o[i] = parts[j + i].o;
      a.lse[i] = parts[j + i].lse;
      a.type[i] = parts[j + i].o_dtype;
      a.lscale[i] = parts[j + i].lse_base == attnLseBase2 ? 0.69314718055994531f : 1.0f;  // ln 2
      a.lheads[i] = parts[j + i].lse_layout == attnLseHeadMajor ? parts[j + i].lse_heads : 0;
    }
    a.rows = rows;
    a.d = head_dim;
    a.acc_rows = acc_rows;
    a.heads = heads;
    a.acc_tokens = acc_tokens;
    KERNEL_CHECK(launch(a, stream));
    j += a.nparts;
  } while (j < nparts);
  return attnSuccess;
}

}  // namespace

attnResult_t mergePartials(float* o_acc, float* lse_acc, const cpu::AttnPartialRef* parts,
                           int nparts, size_t rows, int head_dim, cudaStream_t stream) {
  return mergeImpl(o_acc, lse_acc, parts, nparts, rows, head_dim, nullptr, 1, 0, stream);
}

attnResult_t foldPartial(float* o_acc, float* lse_acc, const cpu::AttnPartialRef& part,
                         size_t rows, int head_dim, cudaStream_t stream) {
  return mergeImpl(o_acc, lse_acc, &part, 1, rows, head_dim, nullptr, 1, 0, stream);
}

attnResult_t foldPartialRows(float* o_acc, float* lse_acc, const cpu::AttnPartialRef& part,
                             const int32_t* acc_rows, size_t ntokens, size_t acc_tokens,
                             int heads, int head_dim, cudaStream_t stream) {
  KERNEL_REQUIRE(heads > 0, "cuda foldPartialRows: heads %d", heads);
  KERNEL_REQUIRE(ntokens == 0 || acc_rows, "cuda foldPartialRows: null acc_rows");
  return mergeImpl(o_acc, lse_acc, &part, 1, ntokens * size_t(heads), head_dim, acc_rows, heads,
                   acc_tokens, stream);
}

}  // namespace attn::cuda
