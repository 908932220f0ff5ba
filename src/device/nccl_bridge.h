// The NCCL backend of device communicators made by attnCommInitFromNccl
// (nccl_comm.cc): collectives and grouped sends/receives become NCCL calls
// on the caller's stream, with no proxy thread and no staging.
//
// Inside attnGroupStart/End the NCCL calls of this thread join one NCCL
// group, opened at the first of them and launched by attnGroupEnd
// (ncclGroupFlush), so a thread driving several ranks works as in NCCL.
//
// This header needs neither nccl.h nor the CUDA headers: src/core includes it.
#pragma once

#include <memory>

#include "attncomm.h"
#include "src/coll/signature.h"
#include "src/core/error.h"
#include "src/device/device_op.h"

struct attnComm;

namespace attn {

// The engine's ncclComm_t (not owned) and the barrier's scratch word.
struct NcclBridge;
struct NcclBridgeDeleter {
  void operator()(NcclBridge* b) const;
};
using NcclBridgePtr = std::unique_ptr<NcclBridge, NcclBridgeDeleter>;

#if ATTN_HAVE_NCCL
// Runs `op` (any kind but kOther) as NCCL calls on `stream`.
attnResult_t ncclEnqueue(attnComm* comm, NcclBridge* nccl, attnStream_t stream, DeviceOp& op);
// Launches the NCCL group this thread opened inside an attn group, if any.
// Called by the outermost attnGroupEnd.
attnResult_t ncclGroupFlush();
// NCCL's asynchronous error on the engine's communicator (attnSuccess while
// there is none), with NCCL's text recorded as the thread's error.
attnResult_t ncclAsyncError(NcclBridge* nccl);
// ATTN_CHECK=1: this rank refused a collective's arguments; it takes part in
// the signature exchange its peers run before their NCCL call (on this
// thread, outside groups, as they do).
attnResult_t ncclRefuse(attnComm* comm, const CollSignature& refused);
#else
inline attnResult_t ncclEnqueue(attnComm*, NcclBridge*, attnStream_t, DeviceOp&) {
  return setError(attnNotSupported, "this build has no NCCL");
}
inline attnResult_t ncclGroupFlush() { return attnSuccess; }
inline attnResult_t ncclAsyncError(NcclBridge*) { return attnSuccess; }
inline attnResult_t ncclRefuse(attnComm*, const CollSignature&) { return attnSuccess; }
#endif

}  // namespace attn
