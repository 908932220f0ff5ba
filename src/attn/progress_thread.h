// Drives a communicator's engine from a background thread while the caller
// computes, so the next block moves during the current block's attention
// (the overlap of CP paper Alg. 2/3). Sleeps when nothing is queued.
//
// Or, in caller mode, no thread at all: the waits drive the engine on the
// calling thread. A call whose every message is small (a decode step) has
// nothing to overlap, and starting, waking and joining a thread costs more
// than its messages (driveModeFor picks, ATTN_ATTN_PROGRESS).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "src/core/engine.h"

namespace attn {

enum class DriveMode { kThread, kCaller };

// The mode for a call whose largest message is `largestMessage` bytes and
// whose largest kernel on one rank is `kernelMacs` multiply-adds:
// ATTN_ATTN_PROGRESS (thread, caller, or auto). Auto leaves it to the
// caller when every message is at most 16 KiB: kick() sends each whole
// the moment it is posted, so no peer waits for this rank's kernel, however
// long, and a thread would only take a core from the kernels (a 16K-token
// decode on 2 processes: 0.55 ms against 2.0 with a thread,
// perf/RESULTS.md section 15). Up to 64 KiB (a message may leave in
// parts, the rest at the next pass) only when the kernel is short too (at
// most 2^19 multiply-adds, well under 100 us); past that a thread moves
// the messages while the kernel runs.
DriveMode driveModeFor(size_t largestMessage, double kernelMacs);

class ProgressThread {
 public:
  explicit ProgressThread(Engine& e, const std::string& errorContext, DriveMode mode = DriveMode::kThread);
  ~ProgressThread();  // stops the thread
  ProgressThread(const ProgressThread&) = delete;
  ProgressThread& operator=(const ProgressThread&) = delete;

  // Call after posting, so a sleeping driver looks again. In caller mode,
  // one pass over the engine right away: what was just posted leaves now,
  // not after the kernel this thread runs next (a peer would wait for it).
  [[nodiscard]] attnResult_t kick();
  // Caller mode: one pass over the engine's connections, without blocking
  // (for loops that poll requests themselves); nothing in thread mode.
  attnResult_t poll();
  // Waits (without driving) until req is no longer pending, the engine
  // broke, or the driver failed. Returns the request's result. Blocks on a
  // condition the driver signals after each pass that moved something:
  // spinning or polling here would take the CPU from the ranks still
  // computing when threads outnumber cores, and slow the whole ring.
  attnResult_t wait(Request* req);
  // The same until ready() holds (e.g. any of several requests is done).
  // ready() is called with the driver's lock held or not: it must only
  // read request states. Fails on timeout, abort or a broken engine.
  attnResult_t waitFor(const std::function<bool()>& ready);

 private:
  void loop();
  attnResult_t driveUntil(const std::function<bool()>& ready);

  Engine& e_;
  DriveMode mode_;
  std::string context_;
  std::mutex mu_;
  std::condition_variable cv_;      // kicks, stop
  std::condition_variable doneCv_;  // the driver moved something
  std::atomic<int> waiters_{0};
  bool stop_ = false;
  uint64_t kicks_ = 0;
  std::atomic<attnResult_t> failed_{attnSuccess};
  std::string failure_;
  std::thread thread_;
};

}  // namespace attn
