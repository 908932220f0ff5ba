// The NCCL backend of device communicators made by attnCommInitFromNccl
// (nccl_comm.cc): collectives and grouped sends/receives become NCCL calls
// on the caller's stream, with no proxy thread and no staging.
//
// Inside attnGroupStart/End the NCCL calls of this thread join one NCCL
// group, opened at the first of them and launched by attnGroupEnd
// (ncclGroupFlush), so a thread driving several ranks works as in NCCL.
//
// This header needs neither nccl.h nor the CUDA headers: the front door
// (src/api) includes it in every build.
#pragma once

#include <memory>
#include <vector>

#include "attncomm.h"
#include "src/coll/signature.h"
#include "src/core/error.h"
#include "src/device/device_op.h"

struct attnComm;

namespace attn {

// The NCCL communicator (the engine's, not owned; or a split or shrunk
// child's, owned) and the barrier's scratch word.
struct NcclBridge;
struct NcclBridgeDeleter {
  void operator()(NcclBridge* b) const;
};
using NcclBridgePtr = std::unique_ptr<NcclBridge, NcclBridgeDeleter>;

// attnCommInitFromNccl (src/api/api_init_nccl.cc) sends rank 0's unique id
// to every rank over NCCL itself: a byte saying whether rank 0 made one,
// then the id.
constexpr size_t kNcclIdMessageBytes = 1 + sizeof(attnUniqueId);

#if ATTN_HAVE_NCCL
// The engine's communicator `handle` (an ncclComm_t): this rank, the
// count, its CUDA device, and a bridge over it (not owning it).
attnResult_t ncclOpen(void* handle, int* rank, int* nranks, int* device, NcclBridgePtr* bridge);
// Broadcasts msg[kNcclIdMessageBytes] from rank 0 to every rank of the bridge.
attnResult_t ncclBroadcastIdMessage(NcclBridge* bridge, char* msg);
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

// attnCommSplit and attnCommShrink of a communicator with the NCCL backend
// give the child an NCCL communicator of its own, made from the parent's
// (ncclCommSplit, ncclCommShrink) and owned by the child's bridge, so its
// operations keep riding NCCL. Whether `comm` has the NCCL backend (the
// same on every rank: attnCommInitFromNccl is collective).
bool ncclBacked(const attnComm* comm);
// Every rank of the parent calls it (NCCL's split is collective over the
// parent): `color` ATTN_SPLIT_NOCOLOR for a rank that gets no NCCL child,
// else its color and its rank in that color's new communicator.
attnResult_t ncclSplitChild(attnComm* parent, int color, int newRank, NcclBridgePtr* child);
// Every survivor calls it, with the same sorted `excluded`. *child stays
// null where the NCCL library has no ncclCommShrink (before 2.27): the
// shrunk communicator then runs on attncomm's own device path.
attnResult_t ncclShrinkChild(attnComm* parent, const std::vector<int>& excluded, bool abort,
                             NcclBridgePtr* child);
// Gives a child made by newCommInternal its NCCL backend.
void ncclAdopt(attnComm* comm, NcclBridgePtr child);
#else
inline attnResult_t ncclOpen(void*, int*, int*, int*, NcclBridgePtr*) {
  return setError(attnNotSupported,
                  "attnCommInitFromNccl: this build of attncomm has no NCCL (it needs CUDA and NCCL at build "
                  "time; see ATTN_ENABLE_NCCL)");
}
inline attnResult_t ncclBroadcastIdMessage(NcclBridge*, char*) { return attnNotSupported; }
inline attnResult_t ncclEnqueue(attnComm*, NcclBridge*, attnStream_t, DeviceOp&) {
  return setError(attnNotSupported, "this build has no NCCL");
}
inline attnResult_t ncclGroupFlush() { return attnSuccess; }
inline attnResult_t ncclAsyncError(NcclBridge*) { return attnSuccess; }
inline attnResult_t ncclRefuse(attnComm*, const CollSignature&) { return attnSuccess; }
inline bool ncclBacked(const attnComm*) { return false; }
inline attnResult_t ncclSplitChild(attnComm*, int, int, NcclBridgePtr*) {
  return setError(attnNotSupported, "this build has no NCCL");
}
inline attnResult_t ncclShrinkChild(attnComm*, const std::vector<int>&, bool, NcclBridgePtr*) {
  return setError(attnNotSupported, "this build has no NCCL");
}
inline void ncclAdopt(attnComm*, NcclBridgePtr) {}
#endif

}  // namespace attn
