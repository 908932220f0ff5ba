// REQUIRE_UCX_CUDA(): skips a device test unless the installed UCX moves
// device memory itself (transports/ucx built with CUDA support). Debian's
// UCX has none, so on a real GPU these tests skip unless UCX was built with
// CUDA; on the emulated CUDA runtime "device" memory is host memory, which
// every UCX moves. Header-only, for the CUDA builds' tests.
#pragma once

#include <gtest/gtest.h>

#if ATTN_HAVE_UCX
#include <sys/wait.h>
#include <unistd.h>

#include <memory>

#include "transports/ucx/ucx_context.h"

namespace attn_test {

// Asked in a forked child, as GpuCount: a UCX with CUDA support may
// initialise CUDA, which forked ranks could then not use.
inline bool UcxTakesDeviceMemory() {
  static int cached = -1;
  if (cached >= 0) return cached == 1;
  const pid_t pid = fork();
  if (pid == 0) {
    std::unique_ptr<attn::ucx::UcxWorker> w;
    _exit(attn::ucx::UcxWorker::create(true, &w) == attnSuccess && w->deviceMemory() ? 1 : 0);
  }
  int status = 0;
  cached = pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) ? WEXITSTATUS(status) : 0;
  return cached == 1;
}

}  // namespace attn_test

#define REQUIRE_UCX_CUDA()                                                                          \
  do {                                                                                              \
    if (!attn_test::UcxTakesDeviceMemory()) GTEST_SKIP() << "the installed UCX has no CUDA memory support"; \
  } while (0)
#else
#define REQUIRE_UCX_CUDA() GTEST_SKIP() << "built without UCX"
#endif
