// The UCX resources of one communicator: a UCP context and one worker.
//
// One worker per communicator (per Transport instance) keeps communicators
// independent: their tags, progress and failures never mix. The progress
// engine serialises calls, so the worker runs in SERIALIZED mode; `mu`
// still guards it because the engine may sleep in waitForActivity (which
// arms the worker) while a background thread progresses.
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "attncomm.h"

namespace attn::ucx {

class UcxWorker {
 public:
  // ucp_init (tag matching + wakeup) and one worker. Errors name UCX's cause.
  // allowDevice: take device memory where this UCX supports CUDA memory.
  static attnResult_t create(bool allowDevice, std::unique_ptr<UcxWorker>* out);
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  ucp_context_h context() const { return context_; }
  ucp_worker_h worker() const { return worker_; }
  std::mutex& mutex() { return mu_; }
  // Device buffers go to UCX as they are: it was built with CUDA (its
  // context lists CUDA memory) and ATTN_UCX_CUDA allows it.
  bool deviceMemory() const { return deviceMemory_; }

  // The worker address (what peers need to reach it).
  attnResult_t address(std::vector<uint8_t>* out) const;

  // Drains the worker: progresses until it reports nothing more (bounded).
  // Caller holds mutex(). Returns the number of events handled.
  unsigned progressLocked();

  // Sleeps until the worker may have events or `timeoutUs` passed.
  void wait(int timeoutUs);

  // Takes a close request (from ucp_ep_close_nbx) to finish before the
  // worker goes away. Caller holds mutex().
  void adoptCloseRequest(void* req);
  // Keeps a small value at a fixed address until the worker goes (the
  // payload of a goodbye message that UCX may still be sending).
  uint64_t* keep(uint64_t value);
  // A gracefully closing endpoint: `flush` (may be null) runs on; when it is
  // done, or at the worker's teardown deadline, the endpoint is closed. All
  // such endpoints drain in parallel, so a slow peer costs one deadline.
  void closeAfterFlush(ucp_ep_h ep, void* flush);
  // An error-handler argument that outlives its connection (see
  // UcxConnection): stays valid until the worker goes.
  template <class T> T* keepObject(T* p) {
    objects_.push_back(std::shared_ptr<void>(p, [](void* q) { delete static_cast<T*>(q); }));
    return p;
  }

 private:
  UcxWorker() = default;

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;  // -1: no wakeup support, wait() sleeps briefly instead
  bool deviceMemory_ = false;
  std::mutex mu_;
  std::vector<void*> closing_;  // endpoint close requests in flight
  std::deque<uint64_t> kept_;   // deque: push_back keeps addresses stable
  struct Closing {
    ucp_ep_h ep;
    void* flush;
  };
  std::vector<Closing> flushing_;
  std::vector<std::shared_ptr<void>> objects_;
  void finishFlushes(bool force);
  void drainUnexpected();
};

// "UCX: <status text>" for messages.
const char* statusText(ucs_status_t s);

}  // namespace attn::ucx
