// Sends and receives of device buffers through pinned host memory over the
// host transports, pipelined: a message larger than ATTN_DEVICE_STAGE_CHUNK
// moves as slices, so that one slice's copy down, another's trip over the
// network and a third's copy up overlap. Used where a pair cannot go GPU to
// GPU and its transport takes host memory only (the staging backend's
// groups, and cuda_ipc's pairs across hosts or that it cannot pull).
//
// On the wire: a message of at most one slice is its bytes, as on a host
// communicator. A larger one is cut into slices of max(chunk, size / 256)
// bytes; the first carries a header with the full size ahead of its data,
// so a receiver that expects another size fails with attnInvalidUsage
// instead of taking the first slices as its whole message (the size check
// a single message gets from the transport). Both sides cut alike when
// their sizes and ATTN_DEVICE_STAGE_CHUNK agree, which the API already
// requires.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "attncomm.h"
#include "src/core/transport.h"
#include "src/device/backends/staging/pinned_arena.h"
#include "src/device/backends/staging/stage_pipeline.h"

namespace attn {

class Engine;

class StagedP2p {
 public:
  // `copy`: the stream for the copies between device and host. `chunk`:
  // ATTN_DEVICE_STAGE_CHUNK as read by the caller (0: every message whole).
  StagedP2p(Engine& e, cudaStream_t copy, size_t chunk) : e_(e), copy_(copy), chunk_(chunk) {}

  // In the group's order; self pairs are the caller's business.
  void add(int peer, bool isSend, void* buf, size_t bytes) { ops_.push_back({peer, isSend, buf, bytes}); }
  bool empty() const { return ops_.empty(); }

  // Moves everything added; returns once the received bytes are in their
  // device buffers. On a failure with requests in flight the engine is
  // broken, so the transports let go of the staging memory.
  attnResult_t run(PinnedArena& stage, SliceEvents& events);

 private:
  struct Op {
    int peer;
    bool isSend;
    void* buf;
    size_t bytes;
    size_t slice = 0;   // bytes per slice; 0: one whole message
    size_t slices = 1;  // messages
    char* host = nullptr;  // [header][bytes] when sliced, else [bytes]
  };
  attnResult_t move(PinnedArena& stage, SliceEvents& events, bool* posted);
  // The first message of a receive: its size, and the sender's header.
  attnResult_t checkFirst(const Op& op, size_t got) const;

  Engine& e_;
  cudaStream_t copy_;
  size_t chunk_;
  std::vector<Op> ops_;
  // One per message. A member: on failure they must outlive run()'s
  // breaking of the engine.
  std::unique_ptr<Request[]> req_;
};

// Process-wide count of messages moved as slices by StagedP2p (tests).
std::atomic<uint64_t>& stagedP2pSlices();

}  // namespace attn
