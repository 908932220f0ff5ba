#include "transports/shm/shm_copy.h"

#include <sched.h>

#include <cerrno>
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

void waitWhileBusy(const std::atomic<uint32_t>& busy) {
  while (busy.load(std::memory_order_seq_cst) != 0) sched_yield();
}

}  // namespace attn::shm
