#include "transports/shm/shm_bell.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

namespace attn::shm {
namespace {

inline void cpuPause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

int64_t nowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

bool moved(Bell* const* bells, const uint32_t* expected, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (bells[i]->seq.load(std::memory_order_acquire) != expected[i]) return true;
  return false;
}

void futexWaitOne(Bell* bell, uint32_t expected, int timeoutUs) {
  timespec ts{timeoutUs / 1000000, (timeoutUs % 1000000) * 1000L};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&bell->seq), FUTEX_WAIT, expected, &ts,
          nullptr, 0);
}

// Waits on several bells at once (Linux >= 5.16). False when unsupported.
bool futexWaitMany(Bell* const* bells, const uint32_t* expected, size_t n, int timeoutUs) {
#if defined(SYS_futex_waitv)
  constexpr size_t kMax = 128;  // FUTEX_WAITV_MAX
  if (n > kMax) return false;
  futex_waitv w[kMax] = {};
  for (size_t i = 0; i < n; ++i) {
    w[i].val = expected[i];
    w[i].uaddr = reinterpret_cast<uint64_t>(&bells[i]->seq);
    w[i].flags = FUTEX_32;  // shared: no FUTEX_PRIVATE_FLAG
  }
  timespec abs;
  clock_gettime(CLOCK_MONOTONIC, &abs);
  int64_t ns = abs.tv_nsec + int64_t(timeoutUs) * 1000;
  abs.tv_sec += ns / 1000000000;
  abs.tv_nsec = ns % 1000000000;
  long r = syscall(SYS_futex_waitv, w, n, 0, &abs, CLOCK_MONOTONIC);
  return !(r < 0 && errno == ENOSYS);
#else
  return false;
#endif
}

}  // namespace

void ringBell(Bell* bell) {
  // The change we announce is stored; the fence orders it before the load of
  // watchers, and pairs with the one in watchBell: either the owner's poll
  // after arming sees the change, or we see it armed and bump.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (bell->watchers.load(std::memory_order_relaxed) == 0) return;
  // seq_cst on both sides pairs with the sleeper's sleepers++ / seq check:
  // either we see the sleeper, or it sees the new seq and does not sleep.
  bell->seq.fetch_add(1, std::memory_order_seq_cst);
  if (bell->sleepers.load(std::memory_order_seq_cst) != 0)
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&bell->seq), FUTEX_WAKE, INT_MAX, nullptr,
            nullptr, 0);
}

void watchBell(Bell* bell) {
  bell->watchers.fetch_add(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void unwatchBell(Bell* bell) { bell->watchers.fetch_sub(1, std::memory_order_release); }

bool spinOnBells(Bell* const* bells, const uint32_t* expected, size_t n, int spinUs) {
  if (spinUs <= 0) return moved(bells, expected, n);
  const int64_t end = nowNs() + int64_t(spinUs) * 1000;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (moved(bells, expected, n)) return true;
      cpuPause();
    }
    if (nowNs() >= end) return false;
    // Ranks may share cores: let a runnable one have ours while we poll.
    sched_yield();
  }
}

void waitBells(Bell* const* bells, const uint32_t* expected, size_t n, int timeoutUs) {
  if (n == 0 || timeoutUs <= 0) return;
  for (size_t i = 0; i < n; ++i) bells[i]->sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (!moved(bells, expected, n)) {
    if (n == 1) {
      futexWaitOne(bells[0], expected[0], timeoutUs);
    } else if (!futexWaitMany(bells, expected, n, timeoutUs)) {
      // Old kernel: sleep on the first bell in short slices so the others
      // are looked at often enough.
      futexWaitOne(bells[0], expected[0], timeoutUs < 1000 ? timeoutUs : 1000);
    }
  }
  for (size_t i = 0; i < n; ++i) bells[i]->sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

}  // namespace attn::shm
