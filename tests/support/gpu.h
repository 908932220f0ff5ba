// Whether this machine has a usable CUDA device, for GPU tests that skip
// (with the reason) where it has none. CUDA builds only.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

namespace attn_test {

inline int GpuCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

}  // namespace attn_test

#define REQUIRE_GPU()                                                                 \
  do {                                                                                \
    if (attn_test::GpuCount() == 0) GTEST_SKIP() << "no CUDA device on this machine"; \
  } while (0)
