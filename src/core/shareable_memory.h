// Host memory that other processes on this host can map: the backing store
// of attnMemAlloc. Each allocation is its own memfd, mapped shared here; a
// peer process that is handed a message from it opens our descriptor
// through /proc/<pid>/fd and reads with plain memcpy, with no system call
// per message (CMA's process_vm_readv pins every page of every message and
// measured 1.6-2.8x slower than memcpy here, see perf/RESULTS.md).
//
// Regions are named "attn-mem-<pid>-<serial>" (pid of the allocating
// process, serial unique in it), so a reader can check that the descriptor
// it opened is the region it was told about, and a cache of mappings keyed
// by (pid, serial) never confuses two regions.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "attncomm.h"

namespace attn {

struct ShareableRegion {
  uintptr_t base = 0;
  size_t bytes = 0;
  int fd = -1;          // -1: memfd was unavailable; the memory is private to us
  int64_t ownerPid = 0;  // the process that allocated it
  uint64_t serial = 0;
};

// Allocates `bytes` (> 0) of zeroed, page-aligned shareable memory.
attnResult_t shareableAlloc(size_t bytes, void** ptr);
// Frees memory from shareableAlloc; attnInvalidArgument for any other pointer.
attnResult_t shareableFree(void* ptr);
// The region holding all of [ptr, ptr + bytes), if any.
bool findShareable(const void* ptr, size_t bytes, ShareableRegion* out);
// The name the region's memfd carries (readlink shows "/memfd:<name> (deleted)").
std::string shareableName(int64_t ownerPid, uint64_t serial);

// Maps, in this process, the first `bytes` of a region another process of
// this host holds (r.ownerPid, r.fd, r.serial as it described them) by
// opening its descriptor through /proc/<holder>/fd (holder: that process;
// not always r.ownerPid, a forked child inherits its parent's regions) and
// checking that it is that region (the number may since name another file). Null, with the
// reason in *why and *errnoOut, when it cannot (the descriptor is gone,
// names another file or is too small; the kernel refuses: EACCES / EPERM).
// Release with munmap(p, bytes).
void* mapPeerShareable(int64_t holder, const ShareableRegion& r, size_t bytes, bool writable, bool populate,
                       std::string* why, int* errnoOut);

// A grow-only scratch buffer in shareable memory (the heap if that fails),
// kept between calls so that peers keep their mapping of it: the rotation
// buffers of ring attention. Contents are not kept when it grows.
class ShareableBuffer {
 public:
  ShareableBuffer() = default;
  ~ShareableBuffer() { release(); }
  ShareableBuffer(const ShareableBuffer&) = delete;
  ShareableBuffer& operator=(const ShareableBuffer&) = delete;

  // At least `bytes` of room (grows by at least a quarter, so slowly
  // growing calls do not reallocate every time).
  attnResult_t reserve(size_t bytes);
  char* data() const { return data_; }
  size_t capacity() const { return capacity_; }

 private:
  void release();
  char* data_ = nullptr;
  size_t capacity_ = 0;
  bool shareable_ = false;
};

}  // namespace attn
