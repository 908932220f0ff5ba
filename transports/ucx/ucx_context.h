// The UCX resources of one communicator: a UCP context and one worker.
//
// One worker per communicator (per Transport instance) keeps communicators
// independent: their tags, progress and failures never mix. The progress
// engine serialises calls, so the worker runs in SERIALIZED mode; `mu`
// still guards it because the engine may sleep in waitForActivity (which
// arms the worker) while a background thread progresses.
//
// Quarantine: UCX cannot cancel a receive it has begun to fill (the first
// fragments of an eager message matched it); it writes the rest into the
// caller's buffer whenever the worker is progressed and they arrive, even
// after the endpoint closed (shared memory has one receive queue per
// worker). A connection that closes with such a receive still held, past a
// short drain, quarantines the worker: from then on it is never progressed
// again (every connection on it fails) and it is destroyed without
// progress, so UCX cannot touch a buffer whose request failed.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
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
  // Caller holds mutex(). Returns the number of events handled; 0 and no
  // progress once quarantined.
  unsigned progressLocked();

  // Stops all progress for good (see above). Caller holds mutex().
  void quarantine(const std::string& why);
  bool quarantined() const { return quarantined_.load(std::memory_order_relaxed); }
  const std::string& quarantineWhy() const { return quarantineWhy_; }
  // An operation UCX may still hold into a failed request's buffer, kept
  // until UCX completes it (dropOrphan, from its callback) or the worker
  // goes. Only on a quarantined worker.
  template <class T> void adoptOrphan(T* p) {
    orphans_.emplace(p, std::shared_ptr<void>(p, [](void* q) { delete static_cast<T*>(q); }));
  }
  void dropOrphan(void* p) { orphans_.erase(p); }

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
  std::atomic<bool> quarantined_{false};  // read by wait() without the mutex
  std::string quarantineWhy_;
  std::map<void*, std::shared_ptr<void>> orphans_;
  void finishFlushes(bool force);
  void drainUnexpected();
};

// "UCX: <status text>" for messages.
const char* statusText(ucs_status_t s);

}  // namespace attn::ucx
