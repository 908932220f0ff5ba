// A grow-only pinned host buffer: the staging area a device communicator's
// proxy copies device data through. Used by one thread (the proxy).
#pragma once

#include <cstddef>

#include "attncomm.h"

namespace attn {

class PinnedArena {
 public:
  PinnedArena() = default;
  ~PinnedArena();
  PinnedArena(const PinnedArena&) = delete;
  PinnedArena& operator=(const PinnedArena&) = delete;

  // At least `bytes` of pinned memory at base(); earlier contents are lost
  // when it grows.
  attnResult_t reserve(size_t bytes);
  char* base() const { return base_; }

 private:
  char* base_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace attn
