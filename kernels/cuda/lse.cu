// The LSE conventions of attnAttnConfig_t on the device: the natural-log,
// token-major [rows, heads] LSE the algorithms compute, written in base 2
// and / or head-major [heads, rows] (attnLseBase_t, attnLseLayout_t).
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/kernel_status.h"

namespace attn::cuda {
namespace {

__global__ void lseKernel(float* dst, const float* src, int64_t rows, int heads, float scale, bool headMajor) {
  const int64_t n = rows * heads;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = i / heads;
    const int64_t h = i - r * heads;
    // scale > 0: -inf (a row that saw no key) stays -inf.
    dst[headMajor ? h * rows + r : i] = src[i] * scale;
  }
}

}  // namespace

attnResult_t writeLse(float* dst, const float* natural, int64_t rows, int heads, bool base2, bool head_major,
                      cudaStream_t stream) {
  if (rows == 0 || heads == 0) return attnSuccess;
  KERNEL_REQUIRE(dst && natural, "cuda writeLse: null pointer");
  KERNEL_REQUIRE(rows > 0 && heads > 0, "cuda writeLse: %lld rows, %d heads", (long long)rows, heads);
  // Threads of other blocks would read what a transposing thread wrote.
  KERNEL_REQUIRE(!head_major || dst != natural, "cuda writeLse: head-major needs distinct buffers");
  const float scale = base2 ? 1.4426950408889634f : 1.0f;  // log2(e)
  const size_t n = size_t(rows) * size_t(heads);
  return launchKernel("writeLse launch", lseKernel, gridFor(n, 256), 256, 0, stream, dst, natural, rows, heads,
                      scale, head_major);
}

}  // namespace attn::cuda
