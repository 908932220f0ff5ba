// CUDA runtime errors as attncomm errors: attnUnhandledCudaError with the
// call that failed and CUDA's own text.
#pragma once

#include <cuda_runtime_api.h>

#include "src/core/error.h"

#define ATTN_CUDA_CHECK(call)                                                         \
  do {                                                                                \
    cudaError_t attn_cuda_err_ = (call);                                              \
    if (attn_cuda_err_ != cudaSuccess)                                                \
      return ::attn::setError(attnUnhandledCudaError, "%s failed: %s (%s)", #call,     \
                              cudaGetErrorString(attn_cuda_err_),                     \
                              cudaGetErrorName(attn_cuda_err_));                      \
  } while (0)
