#include "transports/shm/shm_process.h"

#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <mutex>
#include <random>

#include "src/core/log.h"

namespace attn::shm {
namespace {

uint64_t gProbeToken = 0;
std::once_flag gProbeOnce;
std::atomic<bool> gReadersRequested{false};

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
    gReadersRequested.store(true);
    FILE* f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
    if (!f) return;  // no Yama: classic same-uid rule applies
    int scope = 0;
    if (fscanf(f, "%d", &scope) != 1) scope = 0;
    fclose(f);
    // 2 and 3 admit only CAP_SYS_PTRACE (or nobody): nothing to open.
    if (scope == 1 && prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) == 0)
      ATTN_INFO(kLogShm, "Yama ptrace_scope 1: allowed any process of this user to read this "
                         "one (PR_SET_PTRACER_ANY) for CMA from peer processes");
  });
}

bool cmaReadersRequested() { return gReadersRequested.load(); }

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

}  // namespace attn::shm
