#include "transports/shm/shm_process.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <mutex>
#include <random>

namespace attn::shm {
namespace {

uint64_t gProbeToken = 0;
std::once_flag gProbeOnce;

int64_t coarseNowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);  // vDSO, a few ns
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

}  // namespace

ProcessProbe processProbe() {
  std::call_once(gProbeOnce, [] {
    std::random_device rd;
    gProbeToken = (uint64_t(rd()) << 32 | rd()) ^ uint64_t(getpid()) ^ 1;
  });
  // Forked children inherit the token, so mix in the pid at read time.
  return {gProbeToken ^ (uint64_t(getpid()) << 40), reinterpret_cast<uint64_t>(&gProbeToken)};
}

void allowCmaReaders() {
  static std::once_flag once;
  std::call_once(once, [] {
    FILE* f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
    if (!f) return;  // no Yama: classic same-uid rule applies
    int scope = 0;
    if (fscanf(f, "%d", &scope) != 1) scope = 0;
    fclose(f);
    if (scope == 1) prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  });
}

bool cmaProbe(pid_t pid, const ProcessProbe& probe) {
  // The peer's token as it computes it (its own pid mixed in).
  uint64_t value = 0;
  if (cmaRead(pid, &value, probe.address, sizeof(value)) != 0) return false;
  return (value ^ (uint64_t(pid) << 40)) == probe.token;
}

int cmaRead(pid_t pid, void* dst, uint64_t remoteAddr, size_t bytes) {
  size_t done = 0;
  while (done < bytes) {
    iovec local{static_cast<char*>(dst) + done, bytes - done};
    iovec remote{reinterpret_cast<void*>(remoteAddr + done), bytes - done};
    ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EFAULT;
    done += static_cast<size_t>(n);
  }
  return 0;
}

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

}  // namespace attn::shm
