// The cuda_ipc backend as device_route sees it: which operations it takes
// and how one is enqueued.
#pragma once

#include "attncomm.h"
#include "src/device/device_op.h"

struct attnComm;

namespace attn {

// The operation goes to this backend: a send/recv group (always; it is
// settled pair by pair, see ipc_p2p.h), or a collective whose kind is
// implemented when every rank of the communicator is on this host. Both
// are the same on every rank, so all ranks route the same operations here.
// Whether the ranks allow cuda_ipc (ATTN_TRANSPORT / config.transports)
// and reach each other's GPUs they agree inside the first collective; if
// not, every one of them runs it (and the later ones) over the host
// transports (device memory straight to them, or staged).
bool ipcSelected(const attnComm* comm, const DeviceOp& op);

// Enqueues `op` on `stream`: GPU to GPU where agreed and the buffers allow,
// else over the host transports on the same work item
// (deviceRunViaTransport).
attnResult_t ipcEnqueue(attnComm* comm, attnStream_t stream, DeviceOp op);

}  // namespace attn
