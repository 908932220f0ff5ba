#include "src/core/process_watch.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>

namespace attn {
namespace {

int64_t coarseNowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);  // vDSO, a few ns
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

}  // namespace

ProcessWatch::~ProcessWatch() {
  if (pidfd_ >= 0) close(pidfd_);
}

void ProcessWatch::watch(pid_t pid, int intervalMs) {
  pid_ = pid;
  intervalNs_ = int64_t(intervalMs) * 1000000;
  if (pid <= 0 || pid == getpid()) {
    pid_ = 0;
    return;
  }
#if defined(SYS_pidfd_open)
  pidfd_ = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd_ < 0 && errno == ESRCH) dead_ = true;
#endif
}

bool ProcessWatch::alive(bool now) {
  if (pid_ == 0 || dead_) return !dead_;
  int64_t t = coarseNowNs();
  if (!now && t < nextCheckNs_) return true;
  nextCheckNs_ = t + intervalNs_;
  dead_ = !lookNow();
  return !dead_;
}

bool ProcessWatch::lookNow() {
  if (pidfd_ >= 0) {
    // A pidfd turns readable when the process exits (zombie included).
    pollfd p{pidfd_, POLLIN, 0};
    return poll(&p, 1, 0) == 0;
  }
  return !(kill(pid_, 0) != 0 && errno == ESRCH);
}

}  // namespace attn
