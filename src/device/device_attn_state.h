// What ring attention on the GPU keeps between the calls of one device
// communicator: its compute stream, the events of its pipeline, and its
// grow-only device and pinned host buffers. Used only by the
// communicator's proxy thread; created lazily by the first call.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "attncomm.h"
#include "src/device/device_buffer.h"
#include "src/device/backends/staging/pinned_arena.h"

namespace attn {

struct DeviceAttnState {
  int device = -1;
  // Kernels run here; the bridge's copy stream moves the blocks.
  cudaStream_t compute = nullptr;
  // Ordering (no timing): block j is in device buffer j % 2; the kernel
  // that read device buffer i is done; this rank's own block is on the host;
  // the call's last kernel and output writes are done.
  cudaEvent_t blockReady[2] = {nullptr, nullptr};
  cudaEvent_t kernelDone[2] = {nullptr, nullptr};
  cudaEvent_t ownOnHost = nullptr;
  cudaEvent_t finished = nullptr;
  // Timing: start and end of every kernel launch (GPU compute time).
  std::vector<cudaEvent_t> timing;
  // Pass-Q and ship-Q: the partial for peer p is on the host (hostOut).
  std::vector<cudaEvent_t> partialOnHost;

  DeviceBuffer block[2];    // packed KV (pass-KV) or Q blocks (wire.h layout) on the device
  DeviceBuffer acc;         // fp32 O then LSE of this rank's queries
  DeviceBuffer part;        // a user kernel's partial (O then LSE)
  DeviceBuffer visit;       // pass-Q, ship-Q: a partial on its way out or in
  DeviceBuffer meta;        // the call's offsets and positions, every launch's segments
  DeviceBuffer lseOut;      // the natural LSE of a call whose config asks for another (device_lse.h)
  PinnedArena hostBlock[2]; // the same blocks on the host, sent and received
  PinnedArena metaStage;    // what `meta` is uploaded from
  PinnedArena hostOut;      // pass-Q, ship-Q: what goes to peers (query block, partials)
  PinnedArena hostIn;       // pass-Q, ship-Q: what comes from peers

  DeviceAttnState() = default;
  ~DeviceAttnState();
  DeviceAttnState(const DeviceAttnState&) = delete;
  DeviceAttnState& operator=(const DeviceAttnState&) = delete;

  // Creates the stream and the ordering events on the current device (the
  // proxy's) the first time; at least `timingEvents` timing events and
  // `peerEvents` partialOnHost events.
  attnResult_t prepare(size_t timingEvents, size_t peerEvents = 0);
};

}  // namespace attn
