// What every C API entry point does around its body: turn any C++
// exception into a code (guardedEntry), check the handle against the live
// ones (src/core/handle_registry.h), name the rank in error messages, count
// the call (so abort and destroy wait for it), record the error text on the
// communicator, and run the operation now, in the caller's group, or on the
// executor (non-blocking communicators).
#pragma once

#include <exception>
#include <functional>
#include <new>
#include <string>

#include "src/core/api_guard.h"
#include "src/core/comm.h"
#include "src/core/error.h"
#include "src/core/handle_registry.h"

namespace attn {

// One C API call on a communicator. The public constructor looks the handle
// up among the live communicators and holds it (its activeCalls) until the
// call returns, so it cannot be freed under the call; a handle that is not
// one (destroyed, never created, another kind, NULL) is never read, and
// check() refuses it. The library's own work for a call already admitted
// (a non-blocking communicator's executor, a group's launch) uses Admitted.
class ApiCall {
 public:
  struct Admitted {};
  explicit ApiCall(attnComm* comm);
  ApiCall(attnComm* comm, Admitted) : lookup_{HandleState::kLive, HandleKind::kComm}, comm_(comm), handle_(comm),
                                       ctx_(comm->prefix) {
    clearThreadLastError();
    comm_->activeCalls.fetch_add(1, std::memory_order_acq_rel);
  }
  ~ApiCall() {
    if (comm_) comm_->activeCalls.fetch_sub(1, std::memory_order_acq_rel);
  }
  ApiCall(const ApiCall&) = delete;
  ApiCall& operator=(const ApiCall&) = delete;

  // attnSuccess when the handle is a live communicator that can take an
  // operation now (checkCommUsable); else the refusal, its text set.
  attnResult_t check() const;
  // Only the handle: attnSuccess for a live communicator, even a broken one
  // (attnCommShrink, attnCommGetAsyncError).
  attnResult_t checkHandle() const;
  bool admitted() const { return comm_ != nullptr; }

  // Records the thread's error text on the communicator when r failed.
  attnResult_t finish(attnResult_t r) {
    if (r != attnSuccess && r != attnInProgress && comm_) comm_->recordError(threadLastError());
    return r;
  }

 private:
  HandleLookup lookup_;  // first: the constructor's lookup writes it
  attnComm* comm_;        // null when the handle was refused
  const void* handle_;
  ErrorContext ctx_;
};

// Checks a live communicator for an operation (ready, not aborted, not
// broken). The handle itself is ApiCall's to check.
attnResult_t checkCommUsable(attnComm* comm);
// For collectives that run on the calling thread and use the engine
// directly (split, KV pool create): waits for the operations queued before
// them (a non-blocking communicator's executor, a device communicator's
// proxy), since peers match messages in order and two operations' messages
// must not interleave; then checks the communicator again, as one of them
// may have failed it.
attnResult_t waitForQueuedOperations(attnComm* comm);

using CommOp = std::function<attnResult_t()>;
// Runs op, turning a C++ exception (e.g. std::bad_alloc) into an error code,
// for work that runs outside the caller's frame (queued, on a proxy).
template <class Op>
attnResult_t runGuarded(Op&& op) noexcept {
  return guardedEntry(std::forward<Op>(op));
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

// Group bookkeeping (src/api/api_group.cc).
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
