#include "src/device/pinned_arena.h"

#include "src/device/cuda_check.h"

namespace attn {

PinnedArena::~PinnedArena() {
  if (base_) (void)cudaFreeHost(base_);
}

attnResult_t PinnedArena::reserve(size_t bytes) {
  if (bytes <= bytes_) return attnSuccess;
  // Grow by at least half again, so a slowly growing workload does not
  // re-pin on every call (pinning is slow).
  size_t want = bytes_ + bytes_ / 2;
  if (want < bytes) want = bytes;
  want = (want + (size_t(1) << 20) - 1) & ~((size_t(1) << 20) - 1);
  if (base_) {
    ATTN_CUDA_CHECK(cudaFreeHost(base_));
    base_ = nullptr;
    bytes_ = 0;
  }
  void* p = nullptr;
  ATTN_CUDA_CHECK(cudaHostAlloc(&p, want, cudaHostAllocPortable));
  base_ = static_cast<char*>(p);
  bytes_ = want;
  return attnSuccess;
}

}  // namespace attn
