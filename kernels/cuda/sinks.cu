// Attention sinks on the device (kernels/cpu/sinks.h): one learned logit per
// query head joins each row's softmax denominator, folded into a finished
// result in place.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/kernel_status.h"

namespace attn::cuda {
namespace {

constexpr int kSinkThreads = 256;

// One warp per (row, head): every lane reads the old LSE and scales its
// slice of O, then lane 0 writes the new LSE (after the warp's reads).
__global__ void sinksKernel(float* o, float* lse, int64_t rows, int heads, int d, const float* sinks) {
  const int64_t n = rows * heads;
  const int lane = int(threadIdx.x & 31);
  const int64_t warps = int64_t(gridDim.x) * (kSinkThreads / 32);
  for (int64_t i = int64_t(blockIdx.x) * (kSinkThreads / 32) + (threadIdx.x >> 5); i < n; i += warps) {
    const int h = int(i % heads);
    const float l = lse[i], s = sinks[h];
    float lo = l, f = 1.0f;
    if (l == -INFINITY) {  // saw no key: only the sink, O = 0 (even without one)
      lo = s;
      f = 0.0f;
    } else if (s != -INFINITY) {  // -inf: no sink, unchanged
      lo = fmaxf(l, s) + log1pf(expf(-fabsf(l - s)));
      f = expf(l - lo);
    }
    if (f != 1.0f) {
      float* row = o + i * d;
      for (int c = lane; c < d; c += 32) row[c] = f == 0.0f ? 0.0f : row[c] * f;
    }
    __syncwarp();
    if (lane == 0) lse[i] = lo;
  }
}

}  // namespace

attnResult_t applySinks(float* o, float* lse, int64_t rows, int heads, int head_dim, const float* sinks,
                        cudaStream_t stream) {
  KERNEL_REQUIRE(rows >= 0 && heads > 0 && head_dim > 0, "cuda applySinks: %lld rows, %d heads, head_dim %d",
                 (long long)rows, heads, head_dim);
  if (rows == 0) return attnSuccess;
  KERNEL_REQUIRE(o && lse && sinks, "cuda applySinks: null pointer");
  const size_t pairs = size_t(rows) * size_t(heads);
  return launchKernel("applySinks launch", sinksKernel, gridFor(pairs, kSinkThreads / 32), kSinkThreads, 0, stream,
                      o, lse, rows, heads, head_dim, sinks);
}

}  // namespace attn::cuda
