// The other process behind a connection: is it still alive, and can we read
// its memory (cross-memory attach, process_vm_readv)?
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace attn::shm {

// A random value unique to this process and the address it lives at: a peer
// that reads it back through CMA proves both that CMA is permitted and that
// the pid it used names this very process (no pid-namespace confusion).
struct ProcessProbe {
  uint64_t token;
  uint64_t address;
};
ProcessProbe processProbe();

// Lets any process of ours read this one's memory where the Yama LSM would
// otherwise forbid it (ptrace_scope 1). Done once per process, only there.
void allowCmaReaders();

// True when process_vm_readv from `pid` at probe.address yields probe.token.
bool cmaProbe(pid_t pid, const ProcessProbe& probe);

// Copies `bytes` from `remoteAddr` in process `pid` into `dst`. Returns 0 or
// an errno (ESRCH: the process is gone, EFAULT: bad remote range).
int cmaRead(pid_t pid, void* dst, uint64_t remoteAddr, size_t bytes);

// Watches a peer process for death, cheaply: looks at most once per
// `intervalMs` (a pidfd when the kernel has them, so a zombie or a reused
// pid is not mistaken for a live peer).
class ProcessWatch {
 public:
  ProcessWatch() = default;
  ~ProcessWatch();
  ProcessWatch(const ProcessWatch&) = delete;
  ProcessWatch& operator=(const ProcessWatch&) = delete;

  // pid <= 0 or our own process: never reports death.
  void watch(pid_t pid, int intervalMs);
  // False once the process has exited (sticky). Rate-limited unless `now`.
  bool alive(bool now = false);

 private:
  bool lookNow();
  pid_t pid_ = 0;
  int pidfd_ = -1;
  int64_t intervalNs_ = 0;
  int64_t nextCheckNs_ = 0;
  bool dead_ = false;
};

}  // namespace attn::shm
