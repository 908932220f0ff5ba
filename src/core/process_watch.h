// Is another process of ours still alive? Used wherever this rank waits on
// a peer process through shared memory alone (the shm transport's rings,
// the device ring's read counters), where no socket would tell it the peer
// died.
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace attn {

// Watches a peer process for death, cheaply: looks at most once per
// `intervalMs` (a pidfd when the kernel has them, so a zombie or a reused
// pid is not mistaken for a live peer).
class ProcessWatch {
 public:
  ProcessWatch() = default;
  ~ProcessWatch();
  ProcessWatch(const ProcessWatch&) = delete;
  ProcessWatch& operator=(const ProcessWatch&) = delete;

  // pid <= 0 or our own process: never reports death. Call once.
  void watch(pid_t pid, int intervalMs);
  // False once the process has exited (sticky). Rate-limited unless `now`.
  bool alive(bool now = false);
  pid_t pid() const { return pid_; }

 private:
  bool lookNow();
  pid_t pid_ = 0;
  int pidfd_ = -1;
  int64_t intervalNs_ = 0;
  int64_t nextCheckNs_ = 0;
  bool dead_ = false;
};

}  // namespace attn
