// Per device communicator (attnComm::device): the stream bridge, its
// staging memory, and ring attention's streams and buffers.
#pragma once

#include <memory>

#include "src/device/device_attn_state.h"
#include "src/device/backends/nccl/nccl_bridge.h"
#include "src/device/backends/staging/pinned_arena.h"
#include "src/device/retained_memory.h"
#include "src/device/ring_link.h"
#include "src/device/backends/staging/stage_pipeline.h"
#include "src/device/stream_bridge.h"
#include "src/device/backends/direct/transport_direct.h"
#include "src/device/backends/cuda_ipc/ipc_state.h"

namespace attn {

// Members are destroyed bottom-up: the bridge first (it joins the proxy
// thread, the only user of the others, and drains its copy stream), the
// hold last (the others return their memory to the cache before it).
struct DeviceState {
  retained::CommHold hold;  // keeps the process's cache of memory (retained_memory.h)
  PinnedArena arena;     // the staging backend's copies
  SliceEvents sliceEvents;  // pipelined staging: each slice's inputs are on the host
  DeviceAttnState attn;  // ring attention on the GPU
  NcclBridgePtr nccl;    // attnCommInitFromNccl: the NCCL backend (nccl_bridge.h)
  std::unique_ptr<ipc::IpcState> ipc;  // the cuda_ipc backend (src/device/backends/cuda_ipc), made on first use
  std::unique_ptr<RingLink> ring;      // how ring attention's blocks move (ring_link.h), made on first use
  std::unique_ptr<TransportDirect> direct;  // device memory straight to the transport (transport_direct.h), made on first use
  std::unique_ptr<StreamBridge> bridge;
};

}  // namespace attn
