// A grow-only pinned host buffer: the staging area a device communicator's
// proxy copies device data through. Used by one thread (the proxy).
#pragma once

#include <cstddef>
#include <vector>

#include "attncomm.h"

namespace attn {

class PinnedArena {
 public:
  PinnedArena() = default;
  ~PinnedArena();
  PinnedArena(const PinnedArena&) = delete;
  PinnedArena& operator=(const PinnedArena&) = delete;

  // At least `bytes` of pinned memory at base(); earlier contents are lost
  // when it grows. The smaller buffer is kept (retired) until the arena is
  // destroyed, not freed: cudaFreeHost may wait for the whole device, and a
  // proxy runs while streams of its own and other ranks' callers are parked
  // on it, which would never finish.
  attnResult_t reserve(size_t bytes);
  char* base() const { return base_; }

 private:
  char* base_ = nullptr;
  size_t bytes_ = 0;
  std::vector<char*> retired_;
};

}  // namespace attn
