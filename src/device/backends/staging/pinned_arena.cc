#include "src/device/backends/staging/pinned_arena.h"

#include "src/core/error.h"

namespace attn {

PinnedArena::~PinnedArena() {
  retained::release(retained::kHost, block_);
  for (const retained::Block& b : retired_) retained::release(retained::kHost, b);
}

attnResult_t PinnedArena::reserve(size_t bytes) {
  if (bytes <= block_.bytes) return attnSuccess;
  // Grow by at least half again, so a slowly growing workload does not
  // re-pin on every call (pinning is slow).
  size_t want = block_.bytes + block_.bytes / 2;
  if (want < bytes) want = bytes;
  retained::Block b;
  ATTN_CHECK(retained::acquire(retained::kHost, want, &b));
  if (block_.ptr) retired_.push_back(block_);
  block_ = b;
  return attnSuccess;
}

}  // namespace attn
