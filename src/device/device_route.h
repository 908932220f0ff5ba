// Device communicators (config.device >= 0): how API entry points hand an
// operation on device buffers (device_op.h) to a backend
// (src/device/backends/device_backend.h). The first backend that takes it
// runs it: NCCL on the caller's stream; the others on the communicator's
// proxy thread (stream_bridge.h), ordered on the caller's stream, the
// caller's thread never blocking. A proxy-thread backend may decline (all
// ranks alike) and the next one runs it; staging, last, takes every
// collective.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "attncomm.h"
#include "src/coll/signature.h"
#include "src/core/error.h"
#include "src/device/device_op.h"

struct attnComm;

namespace attn {

// Work that handles device memory itself (no staging), run on the proxy
// thread of a device communicator, ordered on the caller's stream: ring
// attention on the GPU. The stream is released when it returns.
using DeviceWork = std::function<attnResult_t()>;

#if ATTN_HAVE_CUDA
// comm is a device communicator: its operations go to the device backends.
bool deviceRoute(const attnComm* comm);
// Enqueues `op` on `stream`, run by the best backend this communicator has
// for it (device_op.h).
attnResult_t deviceEnqueue(attnComm* comm, attnStream_t stream, DeviceOp op);
// Lifetime, called by the communicator (no-ops for host communicators).
attnResult_t deviceInit(attnComm* comm);
void deviceAbort(attnComm* comm);
void deviceFree(attnComm* comm);
bool deviceBusy(const attnComm* comm);
// Returns once the operations enqueued so far have run (at once on the
// proxy thread itself).
void deviceWaitIdle(const attnComm* comm);
// An asynchronous error of the device backend (NCCL's), attnSuccess if none.
attnResult_t deviceAsyncError(attnComm* comm);
// Enqueues `work` on `stream` for the proxy thread.
attnResult_t deviceEnqueueWork(attnComm* comm, attnStream_t stream, DeviceWork work);
// From inside a DeviceWork (on the proxy thread): runs `op` at once by the
// first proxy-thread backend that takes it and does not decline.
attnResult_t deviceRunOnProxy(attnComm* comm, const DeviceOp& op);
// ATTN_CHECK=1: this rank refused a collective's arguments (refused.status).
// It takes part in the signature exchange its peers' operation begins with
// (device_signature.h): enqueued on `stream` as the call would have been,
// or, with the NCCL backend, on this thread.
attnResult_t deviceRefuse(attnComm* comm, attnStream_t stream, const CollSignature& refused);
#else
inline bool deviceRoute(const attnComm*) { return false; }
inline attnResult_t deviceEnqueue(attnComm*, attnStream_t, DeviceOp) {
  return setError(attnNotSupported, "this build has no CUDA path");
}
inline attnResult_t deviceInit(attnComm*) { return attnSuccess; }
inline void deviceAbort(attnComm*) {}
inline void deviceFree(attnComm*) {}
inline bool deviceBusy(const attnComm*) { return false; }
inline void deviceWaitIdle(const attnComm*) {}
inline attnResult_t deviceAsyncError(attnComm*) { return attnSuccess; }
inline attnResult_t deviceEnqueueWork(attnComm*, attnStream_t, DeviceWork) {
  return setError(attnNotSupported, "this build has no CUDA path");
}
inline attnResult_t deviceRunOnProxy(attnComm*, const DeviceOp&) {
  return setError(attnNotSupported, "this build has no CUDA path");
}
inline attnResult_t deviceRefuse(attnComm*, attnStream_t, const CollSignature&) { return attnSuccess; }
#endif

}  // namespace attn
