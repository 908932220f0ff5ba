// The progress engine of one communicator: posts point-to-point operations on
// the per-peer connections and drives them to completion.
//
// Waiting threads drive progress themselves (spin briefly, then sleep in the
// transports' waitForActivity). A background thread may drive it too (the
// attention collectives do, to overlap communication with compute); a mutex
// serialises every touch of the connections.
//
// On the first failure the engine breaks: it records the error, closes every
// connection (so peers blocked on this rank fail fast instead of timing
// out), and every later operation fails with the same cause.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "src/core/transport.h"

namespace attn {

class Engine {
 public:
  Engine(int rank, int nranks, int timeoutMs, const std::atomic<bool>* abortFlag);
  ~Engine();

  // Takes ownership of the transports and of the connection to each peer
  // (conns[rank] is null: self is handled by the callers with memcpy).
  void attach(std::vector<std::unique_ptr<Transport>> transports,
              std::vector<std::unique_ptr<Connection>> conns,
              std::vector<int> transportOfPeer);

  int rank() const { return rank_; }
  int timeoutMs() const { return timeoutMs_; }
  // The communicator was aborted, or its operations were stopped.
  bool aborted() const {
    return stopped_.load(std::memory_order_relaxed) ||
           (abortFlag_ && abortFlag_->load(std::memory_order_relaxed));
  }
  // Ends the operations waiting in any thread (they fail with
  // attnRemoteError) without aborting the communicator's bootstrap: what
  // attnCommShrink(ATTN_SHRINK_ABORT) needs. Later operations fail too.
  void stopOperations() { stopped_.store(true, std::memory_order_relaxed); }
  int nranks() const { return nranks_; }
  const char* transportName(int peer) const;
  // The connection's mappedSendMin() (0 for self and unconnected peers).
  size_t mappedSendMin(int peer) const;

  attnResult_t isend(int peer, const void* buf, size_t bytes, Request* req);
  attnResult_t irecv(int peer, void* buf, size_t capacity, Request* req);
  // The connection to `peer` moves CUDA device memory itself (false for
  // self and unconnected peers); then the two below take device buffers.
  bool takesDeviceMemory(int peer) const;
  attnResult_t isendDevice(int peer, const void* buf, size_t bytes, Request* req);
  attnResult_t irecvDevice(int peer, void* buf, size_t capacity, Request* req);

  // One pass over the busy connections; *progressed when anything moved.
  attnResult_t progress(bool* progressed);

  // Blocks until `req` completes; returns its result. Fails with attnTimeout
  // when nothing moved for the timeout, attnRemoteError on abort.
  attnResult_t wait(Request* req);
  attnResult_t waitAll(Request* reqs, size_t n);
  // Blocks until one of reqs[0..n) is no longer pending; *done receives its
  // index (the lowest when several are) and its result is returned. The
  // order of arrival, for protocols that serve first come, first served.
  attnResult_t waitAny(Request* const* reqs, size_t n, size_t* done);
  // Sleeps until activity may have happened (after spinning a little).
  // `idleSince` tracks the time of the last progress for the timeout check.
  attnResult_t idleWait(int* spins, std::chrono::steady_clock::time_point* lastProgress);

  // Any connection with queued operations?
  bool busy();
  // For a background driver: one progress pass, and if nothing moved, a
  // sleep of at most waitUs in the busy transports (under the lock, so
  // posts from other threads wait at most that long).
  attnResult_t progressOrSleep(int waitUs, bool* progressed);

  // Staging memory for the algorithms of one collective at a time: grows,
  // never shrinks, never zero-filled (a fresh 32 MiB vector per call costs
  // an mmap and a page-fault storm).
  char* scratch(size_t bytes);

  // Broken: first failure's code and text.
  bool broken() const { return broken_.load(std::memory_order_acquire); }
  attnResult_t brokenResult() const { return brokenCode_; }
  // Marks the engine broken with `code` and closes every connection.
  void breakWith(attnResult_t code, const std::string& why);
  void closeAll();

 private:
  attnResult_t checkRequest(Request* req);
  // One progress pass; when nothing moved, a spin or a sleep (idleWait).
  attnResult_t driveOnce(int* spins, std::chrono::steady_clock::time_point* lastProgress);
  attnResult_t timeoutError();
  // The transports with unfinished work on some connection (locks mu_).
  std::vector<Transport*> busyTransports();
  // armWait on `busy`, one more progress pass, waitForActivity(sliceUs) on
  // each unless that pass moved something, disarmWait.
  attnResult_t armedWait(const std::vector<Transport*>& busy, int sliceUs, bool* progressed);

  int rank_, nranks_, timeoutMs_;
  const std::atomic<bool>* abortFlag_;
  std::atomic<bool> stopped_{false};
  std::mutex mu_;
  std::vector<std::unique_ptr<Transport>> transports_;
  std::vector<std::unique_ptr<Connection>> conns_;
  std::vector<int> transportOfPeer_;
  std::unique_ptr<char[]> scratch_;
  size_t scratchBytes_ = 0;
  std::atomic<bool> broken_{false};
  attnResult_t brokenCode_ = attnSuccess;
  std::string brokenWhy_;
};

}  // namespace attn
