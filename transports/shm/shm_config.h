// Tunables of the shared-memory transport, read from the environment at
// connect time (the README's table lists them).
#pragma once

#include <cstddef>
#include <cstdint>

namespace attn::shm {

struct Config {
  // Defaults measured on a 2-core VM, 4 ranks, ring all-gather and
  // ping-pong: single copy wins from ~32-64 KiB up; below, the eager ring
  // (sender's send completes at once) is as fast and needs no round trip.
  uint32_t nslots = 16;             // ATTN_SHM_SLOTS: ring slots per direction
  size_t slotBytes = 256 * 1024;    // ATTN_SHM_SLOT_BYTES: bytes per slot
  bool cma = true;                  // ATTN_SHM_CMA: single copy between processes
  size_t cmaMin = 64 * 1024;        // ATTN_SHM_CMA_MIN: smallest message sent by CMA
  size_t memcpyMin = 32 * 1024;     // ATTN_SHM_MEMCPY_MIN: smallest message copied
                                    // straight from the sender (same process)
  bool map = true;                  // ATTN_SHM_MAP: map peers' attnMemAlloc regions
  size_t mapMin = 32 * 1024;        // ATTN_SHM_MAP_MIN: smallest such message read by memcpy
  size_t mapCache = 64;             // ATTN_SHM_MAP_CACHE: regions kept mapped per peer
  bool hugePages = true;            // ATTN_SHM_HUGEPAGES: CMA buffers to huge pages
  int spinUs = 5;                   // ATTN_SHM_SPIN_US: poll before sleeping
  int livenessMs = 50;              // how often a peer process is checked

  static Config fromEnv();
};

// Bytes the receiver copies per progress() call from a direct message: keeps
// progress() short (~0.5 ms) so other connections and close() get their turn.
constexpr size_t kDirectPieceBytes = 1u << 20;

}  // namespace attn::shm
