// The process-wide cache of the memory device communicators allocate with
// a device-wide free: pinned host memory (staging) and plain cudaMalloc
// device memory (buffers other processes map by handle or a transport
// registers for RDMA).
//
// cudaFreeHost and cudaFree wait for the whole device. Ranks may share a
// GPU, so one rank may free a communicator while another rank's stream is
// parked on its proxy, waiting for this rank's next call: that wait never
// ends. So released blocks are kept here and reused by later requests they
// fit (as PyTorch's caching host allocator does). They go back to CUDA
// when no stream of the process is parked on a proxy (parked_streams.h):
// past ATTN_RETAINED_CACHE_MB cached, when an allocation runs out of
// memory (then it is tried once more), and when the last device
// communicator of the process goes. A trim that finds a parked stream is
// left for a later release.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attncomm.h"

namespace attn::retained {

constexpr int kHost = -1;  // `where` of pinned host memory; else a CUDA ordinal

struct Block {
  void* ptr = nullptr;
  size_t bytes = 0;  // may exceed what was asked for
};

// A block of at least `bytes` (> 0): a cached one that fits (no more than
// twice the size), else a new allocation. Device memory is on device
// `where`, which must be the calling thread's current device.
attnResult_t acquire(int where, size_t bytes, Block* out);
// Back to the cache: every use of it, on any stream or by any peer, must be
// over. Given back to CUDA at once while no device communicator exists,
// and blocks past the cap are when safe.
void release(int where, const Block& b);

// Held by each device communicator (DeviceState): while any exists, cached
// blocks stay cached; when the last one goes, they are freed.
class CommHold {
 public:
  CommHold();
  ~CommHold();
  CommHold(const CommHold&) = delete;
  CommHold& operator=(const CommHold&) = delete;
};

struct Stats {
  uint64_t allocated = 0;  // blocks allocated from CUDA
  uint64_t reused = 0;     // requests served from the cache
  uint64_t freed = 0;      // blocks given back to CUDA
  uint64_t trimsDeferred = 0;  // trims left for later: a stream was parked on a proxy
  size_t cachedBytes = 0;  // in the cache now (host and device)
  int holds = 0;           // live CommHolds
};
Stats stats();

}  // namespace attn::retained
