// -T S (nccl-tests' timeout) for every perf binary: after S seconds a
// watchdog thread aborts every communicator this process registered
// (attnCommAbort is safe from any thread; a handle already destroyed is
// refused, not touched), so calls blocked on a peer return an error and the
// run fails naming -T instead of hanging. If the process has still not
// ended 30 s later, the watchdog exits it (status 124, timeout(1)'s).
#pragma once

#include "attncomm.h"

namespace attnperf {

// Starts this process's watchdog (no-op for seconds <= 0, or when it already
// runs here; a forked rank starts its own).
void watchdogStart(int seconds, const char* program);
// A communicator the watchdog may abort; unregister before freeing it.
void watchdogAdd(attnComm_t comm);
// false: the watchdog already aborted it (the caller must not free it again).
bool watchdogRemove(attnComm_t comm);
// True once the timeout fired in this process.
bool watchdogFired();
// The run ended: the watchdog stands down.
void watchdogStop();

// For rank bodies: watchdogArm in main records -T; each rank's guard starts
// the watchdog in its process (once) and registers its communicator for
// the guard's life.
void watchdogArm(const char* program, int seconds);
class WatchdogGuard {
 public:
  explicit WatchdogGuard(attnComm_t comm);
  ~WatchdogGuard();
  WatchdogGuard(const WatchdogGuard&) = delete;
  WatchdogGuard& operator=(const WatchdogGuard&) = delete;

 private:
  attnComm_t comm_;
};

// The exit status when the watchdog has to end the process itself.
constexpr int kWatchdogExit = 124;

}  // namespace attnperf
