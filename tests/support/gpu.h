// Whether this machine has a usable CUDA device, for GPU tests that skip
// (with the reason) where it has none. CUDA builds only.
//
// CUDA cannot be used in a child forked after the parent initialised it, so
// the GPUs are counted in a forked child, and a test that runs ranks as
// processes (REQUIRE_FORKABLE_CUDA) skips once an earlier test of the same
// binary used CUDA in-process (REQUIRE_GPU marks that). ctest runs every
// test in a process of its own, where this never happens.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

namespace attn_test {

inline int GpuCount() {
  static int cached = -1;
  if (cached >= 0) return cached;
  const pid_t pid = fork();
  if (pid == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    _exit(std::min(n, 100));
  }
  int status = 0;
  cached = pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) ? WEXITSTATUS(status) : 0;
  return cached;
}

// Set once a test of this process used CUDA itself.
inline bool& CudaUsedHere() {
  static bool used = false;
  return used;
}

}  // namespace attn_test

// For tests that use CUDA in this process (ranks as threads, kernels).
#define REQUIRE_GPU()                                                                 \
  do {                                                                                \
    if (attn_test::GpuCount() == 0) GTEST_SKIP() << "no CUDA device on this machine"; \
    attn_test::CudaUsedHere() = true;                                                 \
  } while (0)

// For tests whose ranks are forked processes that use CUDA.
#define REQUIRE_FORKABLE_CUDA()                                                                  \
  do {                                                                                           \
    if (attn_test::GpuCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";            \
    if (attn_test::CudaUsedHere())                                                               \
      GTEST_SKIP() << "CUDA was initialised in this process by an earlier test, so forked ranks " \
                      "could not use it; run this test alone (ctest does)";                      \
  } while (0)
