// CUDA errors as attnResult_t plus a readable message.
#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/kernel_status.h"

namespace attn::cuda {

attnResult_t cudaResult(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return attnSuccess;
  return kernels::fail(attnUnhandledCudaError, "cuda: %s: %s (%s)", what, cudaGetErrorName(err),
                  cudaGetErrorString(err));
}

}  // namespace attn::cuda
