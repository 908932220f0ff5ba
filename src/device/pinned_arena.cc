#include "src/device/pinned_arena.h"

#include "src/device/cuda_check.h"

namespace attn {

PinnedArena::~PinnedArena() {
  if (base_) (void)cudaFreeHost(base_);
  for (char* p : retired_) (void)cudaFreeHost(p);
}

attnResult_t PinnedArena::reserve(size_t bytes) {
  if (bytes <= bytes_) return attnSuccess;
  // Grow by at least half again, so a slowly growing workload does not
  // re-pin on every call (pinning is slow).
  size_t want = bytes_ + bytes_ / 2;
  if (want < bytes) want = bytes;
  want = (want + (size_t(1) << 20) - 1) & ~((size_t(1) << 20) - 1);
  void* p = nullptr;
  ATTN_CUDA_CHECK(cudaHostAlloc(&p, want, cudaHostAllocPortable));
  if (base_) retired_.push_back(base_);
  base_ = static_cast<char*>(p);
  bytes_ = want;
  return attnSuccess;
}

}  // namespace attn
