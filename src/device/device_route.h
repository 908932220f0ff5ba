// Device communicators (config.device >= 0): how API entry points hand an
// operation on device buffers (device_op.h) to a backend.
//
// The staging backend runs on the stream bridge (stream_bridge.h): its proxy
// copies the inputs device-to-host on the library's stream, runs the same
// host-memory operation (the API entry point itself, re-entered on the proxy
// thread), and copies the outputs back. Everything stays ordered on the
// caller's stream and the caller's thread never blocks.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "attncomm.h"
#include "src/core/error.h"
#include "src/device/device_op.h"

struct attnComm;

namespace attn {

#if ATTN_HAVE_CUDA
// comm is a device communicator and the caller is not its proxy thread.
bool deviceRoute(const attnComm* comm);
// Enqueues `op` on `stream`, run by the best backend this communicator has
// for it (device_op.h).
attnResult_t deviceEnqueue(attnComm* comm, attnStream_t stream, DeviceOp op);
// Lifetime, called by the communicator (no-ops for host communicators).
attnResult_t deviceInit(attnComm* comm);
void deviceAbort(attnComm* comm);
void deviceFree(attnComm* comm);
bool deviceBusy(const attnComm* comm);
#else
inline bool deviceRoute(const attnComm*) { return false; }
inline attnResult_t deviceEnqueue(attnComm*, attnStream_t, DeviceOp) {
  return setError(attnNotSupported, "this build has no CUDA path");
}
inline attnResult_t deviceInit(attnComm*) { return attnSuccess; }
inline void deviceAbort(attnComm*) {}
inline void deviceFree(attnComm*) {}
inline bool deviceBusy(const attnComm*) { return false; }
#endif

// An operation only the staging backend runs (kOther).
inline attnResult_t deviceEnqueue(attnComm* comm, attnStream_t stream, std::vector<DeviceSpan> spans,
                                  HostOp host) {
  DeviceOp op;
  op.spans = std::move(spans);
  op.hostOp = std::move(host);
  return deviceEnqueue(comm, stream, std::move(op));
}

}  // namespace attn
