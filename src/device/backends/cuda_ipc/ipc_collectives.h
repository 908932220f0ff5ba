// The collectives of the cuda_ipc backend, as pulls: every rank publishes
// where its input lives (a small descriptor per peer over the host
// transport), then copies what it needs straight out of its peers' device
// buffers on the library's copy stream, reduces with the device kernels,
// waits for its copies, and meets the others once more before returning
// (so no rank reuses a buffer a peer may still read).
//
// Run on the proxy thread inside a stream-bridge work item: the caller's
// stream already reached the operation and is released after it.
#pragma once

#include <cuda_runtime_api.h>

#include "attncomm.h"
#include "src/device/device_op.h"
#include "src/device/backends/cuda_ipc/ipc_state.h"

struct attnComm;

namespace attn::ipc {

// The operation kinds implemented here.
bool implements(DeviceOpKind kind);

// Runs `op` GPU to GPU. When some rank's buffer cannot be served (not
// device memory, not exportable), every rank learns it from the
// descriptors, nothing moves, and all return attnSuccess with *staged set:
// the caller runs the staging backend instead. A failure after that point
// is an error on every rank (no silent fallback).
attnResult_t runCollective(attnComm* comm, IpcState& st, const DeviceOp& op, cudaStream_t copy,
                           bool* staged);

}  // namespace attn::ipc
