// A collective call this rank refuses (its arguments): what its peers learn.
#pragma once

#include "attncomm.h"
#include "src/coll/signature.h"

struct attnComm;

namespace attn {

// `status` (whose text is the thread's last error) for a call of `kind`. On
// a communicator checking signatures (ATTN_CHECK=1), the rank still takes
// part in the call's signature exchange with a refused signature, queued as
// the call would have been (now, in the group, on the non-blocking queue,
// on a device communicator's stream): its peers then fail the call naming
// this rank and every rank stays in step. Without the checks, as with
// NCCL, the peers wait for a call that will not come. Returns `status`.
attnResult_t refuseCollective(attnComm* comm, attnStream_t stream, CollKind kind, attnResult_t status);

}  // namespace attn
