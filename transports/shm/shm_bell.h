// Doorbells: a futex word per rank in shared memory. A peer that changes
// something this rank may wait for (publishes a slot, frees one, closes)
// rings it; a rank with nothing to do sleeps on it. The futexes are
// process-shared (no FUTEX_PRIVATE_FLAG), so this works between processes.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "transports/shm/shm_layout.h"
#include "transports/shm/shm_segment.h"

namespace attn::shm {

// Bumps the bell and wakes its sleepers, if any (no syscall otherwise); does
// nothing while no thread of the owner watches it. Call after the change.
void ringBell(Bell* bell);

// The owner's side: between watchBell and unwatchBell peers ring this bell.
// After watchBell, poll once more before waiting on it.
void watchBell(Bell* bell);
void unwatchBell(Bell* bell);

// Sleeps until bells[i]->seq != expected[i] for some i, or `timeoutUs`
// passes. Returns at once when that is already so; spurious returns happen.
void waitBells(Bell* const* bells, const uint32_t* expected, size_t n, int timeoutUs);

// Spins (cpu pause) for up to `spinUs` microseconds waiting for a bell to
// move; true when one did.
bool spinOnBells(Bell* const* bells, const uint32_t* expected, size_t n, int spinUs);

// This rank's own bell (one per connect() call), shared by its connections
// and the transport that sleeps on it.
//
// Lost wake-ups: a ring that lands between a progress() pass and the sleep
// must still wake us. So progress() notes the bell's value *before* it looks
// at shared state (observe), and the sleep waits for the bell to move past
// that value. A pass that made progress disarms it, so the next pass notes
// a fresh value. Peers ring only while the bell is watched (watchBell, from
// the transport's armWait); what changed before that rang nobody, and the
// poll the engine makes after arming finds it. Atomics only because the
// engine may call waitForActivity from another thread than progress().
struct LocalBell {
  std::shared_ptr<Segment> seg;
  Bell* bell = nullptr;
  std::atomic<uint32_t> snapshot{0};
  std::atomic<bool> armed{false};

  void observe() {
    if (!armed.load(std::memory_order_relaxed)) {
      snapshot.store(bell->seq.load(std::memory_order_seq_cst), std::memory_order_relaxed);
      armed.store(true, std::memory_order_relaxed);
    }
  }
  void disarm() { armed.store(false, std::memory_order_relaxed); }
  // The value to sleep against; consumes the snapshot.
  uint32_t expected() {
    if (armed.exchange(false, std::memory_order_relaxed))
      return snapshot.load(std::memory_order_relaxed);
    return bell->seq.load(std::memory_order_seq_cst);
  }
};

}  // namespace attn::shm
