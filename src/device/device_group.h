// Sends and receives of one group on a device communicator (api_p2p.cc,
// group.cc): they run as ONE device operation (DeviceOp kP2pGroup), so any
// send/recv order works and self pairs match, on every backend.
//
// The operation is enqueued on the stream of the group's first op. Ops that
// named other streams join it as NCCL does for multi-stream groups: before
// the launch the first stream waits for the others' earlier work, after it
// the others wait for the first stream (deviceJoinAfter).
#pragma once

#include <vector>

#include "attncomm.h"
#include "src/core/api_call.h"
#include "src/core/error.h"

struct attnComm;

namespace attn {

// The streams to join once the group is launched.
struct StreamJoin {
  attnStream_t primary = nullptr;
  std::vector<attnStream_t> others;
};

#if ATTN_HAVE_CUDA
// Checks the self pairs, joins the streams in, and enqueues the operation.
// *after gets what deviceJoinAfter must do once NCCL's group (if any) was
// launched (ncclGroupFlush).
attnResult_t deviceP2pGroup(attnComm* comm, std::vector<P2pOp> ops, StreamJoin* after);
// The other streams wait for the primary's work so far.
attnResult_t deviceJoinAfter(attnComm* comm, const StreamJoin& join);
#else
inline attnResult_t deviceP2pGroup(attnComm*, std::vector<P2pOp>, StreamJoin*) {
  return setError(attnNotSupported, "this build has no CUDA path");
}
inline attnResult_t deviceJoinAfter(attnComm*, const StreamJoin&) { return attnSuccess; }
#endif

}  // namespace attn
