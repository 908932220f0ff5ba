#include "transports/shm/shm_copy.h"

#include <sched.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "transports/shm/shm_process.h"

namespace attn::shm {

int guardedCopy(const PeerMemory& peer, uint8_t* local, uint64_t remote, size_t n,
                std::atomic<uint32_t>& busy, const std::atomic<uint32_t>& ownerClosed) {
  busy.store(1, std::memory_order_seq_cst);
  if (ownerClosed.load(std::memory_order_seq_cst) != kOpen) {
    busy.store(0, std::memory_order_release);
    return ECANCELED;
  }
  int err = 0;
  if (peer.mode == kDirectMemcpy)
    std::memcpy(local, reinterpret_cast<const void*>(remote), n);
  else
    err = cmaRead(peer.pid, local, remote, n);
  busy.store(0, std::memory_order_release);
  // The owner closed while we copied: the bytes may be torn (CMA).
  if (ownerClosed.load(std::memory_order_acquire) != kOpen) return ECANCELED;
  return err;
}

bool waitWhileBusy(const std::atomic<uint32_t>& busy, const WaitLimit& limit) {
  using Clock = std::chrono::steady_clock;
  const auto end = Clock::now() + std::chrono::milliseconds(limit.timeoutMs);
  for (unsigned spins = 0; busy.load(std::memory_order_seq_cst) != 0; ++spins) {
    if (spins % 64 == 63) {  // the clock and the flag now and then, not every pass
      if (limit.abort && limit.abort->load(std::memory_order_relaxed)) return false;
      if (limit.timeoutMs > 0 && Clock::now() > end) return false;
    }
    sched_yield();
  }
  return true;
}

}  // namespace attn::shm
