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
// comm is a device communicator and the caller is not its proxy thread.
bool deviceRoute(const attnComm* comm);
// The caller is a device communicator's proxy thread: the host-memory
// operations it re-enters run at once, even on a non-blocking communicator
// (the proxy already is their asynchronous executor).
bool onDeviceProxy(const attnComm* comm);
// The caller is the proxy thread of some device communicator (reads no
// communicator: usable on a handle not yet checked).
bool onAnyDeviceProxy();
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
// From inside a DeviceWork: runs `op` over the host transports,
// synchronously on the proxy thread: its device buffers handed to them
// where they all take device memory (transport_direct.h), else on pinned
// host copies of its spans (the staging backend, pipelined where
// stage_pipeline.h can).
attnResult_t deviceRunViaTransport(attnComm* comm, const DeviceOp& op);
// ATTN_CHECK=1: this rank refused a collective's arguments (refused.status).
// It takes part in the signature exchange its peers' operation begins with
// (device_signature.h): enqueued on `stream` as the call would have been,
// or, with the NCCL backend, on this thread.
attnResult_t deviceRefuse(attnComm* comm, attnStream_t stream, const CollSignature& refused);
#else
inline bool deviceRoute(const attnComm*) { return false; }
inline bool onDeviceProxy(const attnComm*) { return false; }
inline bool onAnyDeviceProxy() { return false; }
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
inline attnResult_t deviceRunViaTransport(attnComm*, const DeviceOp&) {
  return setError(attnNotSupported, "this build has no CUDA path");
}
inline attnResult_t deviceRefuse(attnComm*, attnStream_t, const CollSignature&) { return attnSuccess; }
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
