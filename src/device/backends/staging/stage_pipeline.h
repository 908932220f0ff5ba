// The staging backend, pipelined (staging_backend.cc): a collective on device
// buffers that has no device path (peers on other hosts, cuda_ipc off,
// buffers cuda_ipc cannot serve) runs as consecutive slices of at most
// ATTN_DEVICE_STAGE_CHUNK bytes of every rank's block. Every slice's inputs
// are queued device to pinned host on the copy stream at once; each
// slice's host collective starts as soon as its inputs are down, and its
// outputs go back up while the next slice's runs. The device-to-host copy,
// the network and the host-to-device copy of different slices overlap,
// where unpipelined staging runs them one after the other.
//
// Every rank cuts the same slices (they depend only on the count, the
// element size and ATTN_DEVICE_STAGE_CHUNK, which must be alike on every
// rank), so slice k meets slice k everywhere. Slice layouts on the host:
// each slice's blocks are contiguous ([rank][slice]), so the host
// collective sees an ordinary call of the slice's count; the strided
// device side is copied with cudaMemcpy2DAsync.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "attncomm.h"
#include "src/device/device_op.h"
#include "src/device/backends/staging/pinned_arena.h"

namespace attn {

// Slice size in bytes per rank block: ATTN_DEVICE_STAGE_CHUNK (default
// 4 MiB; 0 turns pipelining off).
size_t stageChunkBytes();

// Elements per slice of `op`, or 0 when it runs
// unpipelined (a kind that cannot be sliced, or everything fits one slice).
size_t stageSliceCount(const DeviceOp& op, size_t chunkBytes);

// Events marking each slice's inputs on the host; grown on demand, kept
// for the communicator's life.
class SliceEvents {
 public:
  SliceEvents() = default;
  ~SliceEvents();
  SliceEvents(const SliceEvents&) = delete;
  SliceEvents& operator=(const SliceEvents&) = delete;
  attnResult_t reserve(size_t n);
  cudaEvent_t operator[](size_t i) const { return events_[i]; }

 private:
  std::vector<cudaEvent_t> events_;
};

// The host collective of one slice: `in` and `out` laid out as the
// collective's own buffers of `count` elements per block.
using SliceRun = std::function<attnResult_t(char* in, char* out, size_t count)>;

// Runs `op` (stageSliceCount(op, ...) = slice > 0) on rank `me` of
// `nranks` slice by slice through `arena` on the proxy thread, `hostRun`
// running each slice; returns once the outputs are on the device.
attnResult_t runStagePipeline(const DeviceOp& op, int me, int nranks, size_t slice, PinnedArena& arena,
                              SliceEvents& events, cudaStream_t copy, const SliceRun& hostRun);

// Process-wide count of slices run pipelined (tests).
std::atomic<uint64_t>& stagedSlices();

}  // namespace attn
