// What every C API entry point does around its body: validate the handle,
// name the rank in error messages, count the call (so abort can wait for it),
// record the error text on the communicator, and run the operation now, in
// the caller's group, or on the executor (non-blocking communicators).
#pragma once

#include <exception>
#include <functional>
#include <new>
#include <string>

#include "src/core/comm.h"
#include "src/core/error.h"

namespace attn {

class ApiCall {
 public:
  explicit ApiCall(attnComm* comm) : comm_(comm), ctx_(comm ? comm->prefix : ErrorContext::none()) {
    clearThreadLastError();
    if (comm_) comm_->activeCalls.fetch_add(1, std::memory_order_acq_rel);
  }
  ~ApiCall() {
    if (comm_) comm_->activeCalls.fetch_sub(1, std::memory_order_acq_rel);
  }
  ApiCall(const ApiCall&) = delete;
  ApiCall& operator=(const ApiCall&) = delete;

  // Records the thread's error text on the communicator when r failed.
  attnResult_t finish(attnResult_t r) {
    if (r != attnSuccess && r != attnInProgress && comm_) comm_->recordError(threadLastError());
    return r;
  }

 private:
  attnComm* comm_;
  ErrorContext ctx_;
};

// Checks a communicator handle for an operation.
attnResult_t checkCommUsable(attnComm* comm);
// For collectives that run on the calling thread and use the engine
// directly (split, KV pool create): waits for the operations queued before
// them (a non-blocking communicator's executor, a device communicator's
// proxy), since peers match messages in order and two operations' messages
// must not interleave; then checks the communicator again, as one of them
// may have failed it.
attnResult_t waitForQueuedOperations(attnComm* comm);

using CommOp = std::function<attnResult_t()>;
// Runs op, turning a C++ exception (e.g. std::bad_alloc) into an error code:
// nothing throws across the C API.
template <class Op>
attnResult_t runGuarded(Op&& op) {
  try {
    return op();
  } catch (const std::bad_alloc&) {
    return setError(attnSystemError, "out of memory");
  } catch (const std::exception& e) {
    return setError(attnInternalError, "unexpected exception: %s", e.what());
  }
}

// Whether an operation on `comm` runs now on the calling thread: not inside
// a group, and the communicator blocking (or this is its device proxy).
bool runsNow(attnComm* comm);
// The other cases: queues `op` into the open group, or submits it to the
// executor of a non-blocking communicator (returns attnInProgress).
attnResult_t dispatchQueued(attnComm* comm, CommOp op);
void traceDispatch(const char* name);

// Runs `op` on `comm`: now, in the caller's group, or on the executor. A
// template so that the common case, a blocking call, runs the lambda as it
// is, without wrapping it in a std::function (a heap allocation per call).
template <class Op>
attnResult_t dispatch(attnComm* comm, const char* name, Op&& op) {
  if (!runsNow(comm)) return dispatchQueued(comm, CommOp(std::forward<Op>(op)));
  traceDispatch(name);
  return runGuarded(op);
}

// Group bookkeeping (src/core/group.cc).
bool inGroup();
struct P2pOp {
  bool isSend;
  int peer;
  void* buf;
  size_t bytes;
  attnStream_t stream = nullptr;  // device communicators: the caller's stream
};
void groupAddP2p(attnComm* comm, const P2pOp& op);
// Device communicators: run at attnGroupEnd as one device operation.
void groupAddDeviceP2p(attnComm* comm, const P2pOp& op);
void groupAddColl(attnComm* comm, CommOp op);

}  // namespace attn
