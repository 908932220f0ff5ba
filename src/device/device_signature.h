// ATTN_CHECK=1 on device communicators: each collective's signature
// (src/coll/signature.h) is exchanged once, before any of its data moves,
// whichever backend then runs it. The NCCL bridge exchanges it on the
// caller's thread (outside groups); the other backends at the start of the
// operation's work on the proxy thread, before the cuda_ipc or transport
// handshakes, so a rank that refused its arguments (deviceRefuse) meets its
// peers in the same exchange. The staging backend's host collective is the
// library's internal entry, which exchanges none of its own.
#pragma once

#include "attncomm.h"
#include "src/coll/signature.h"
#include "src/device/device_op.h"

struct attnComm;

namespace attn {

// The signature of `op`; false for kinds the host path checks no signature
// of either (send/recv groups).
bool deviceOpSignature(const DeviceOp& op, CollSignature* sig);

// Exchanges `op`'s signature when the communicator checks signatures; a
// no-op for kinds without one. Collective over the host engine.
attnResult_t checkDeviceSignature(attnComm* comm, const DeviceOp& op);

}  // namespace attn
