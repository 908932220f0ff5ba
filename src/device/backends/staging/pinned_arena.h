// A grow-only pinned host buffer: the staging area a device communicator's
// proxy copies device data through. Used by one thread (the proxy).
#pragma once

#include <cstddef>
#include <vector>

#include "attncomm.h"
#include "src/device/retained_memory.h"

namespace attn {

class PinnedArena {
 public:
  PinnedArena() = default;
  // Returns its memory to the process's cache (retained_memory.h), never
  // to CUDA: cudaFreeHost waits for the whole device. Every copy through
  // the arena must be over (its streams synchronised).
  ~PinnedArena();
  PinnedArena(const PinnedArena&) = delete;
  PinnedArena& operator=(const PinnedArena&) = delete;

  // At least `bytes` of pinned memory at base(); earlier contents are lost
  // when it grows. The smaller block is kept (retired) until the arena is
  // destroyed: copies queued before the growth may still read it.
  attnResult_t reserve(size_t bytes);
  char* base() const { return static_cast<char*>(block_.ptr); }

 private:
  retained::Block block_;
  std::vector<retained::Block> retired_;
};

}  // namespace attn
