// What every C API entry point does around its body: validate the handle,
// name the rank in error messages, count the call (so abort can wait for it),
// record the error text on the communicator, and run the operation now, in
// the caller's group, or on the executor (non-blocking communicators).
#pragma once

#include <functional>
#include <string>

#include "src/core/comm.h"
#include "src/core/error.h"

namespace attn {

class ApiCall {
 public:
  explicit ApiCall(attnComm* comm) : comm_(comm), ctx_(comm ? comm->prefix : std::string("-")) {
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
attnResult_t runGuarded(const CommOp& op);
// Runs `op` on `comm`: queued into the open group, submitted to the executor
// (non-blocking comm: returns attnInProgress), or run now.
attnResult_t dispatch(attnComm* comm, const char* name, CommOp op);

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
