// Tunables of the shared-memory transport, read from the environment at
// connect time (the README's table lists them).
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/core/settings.h"

namespace attn::shm {

struct Config {
  // Defaults from the table (src/core/settings.def), measured on a 2-core
  // VM, 4 ranks, ring all-gather and ping-pong: single copy wins from
  // ~32-64 KiB up; below, the eager ring (sender's send completes at once)
  // is as fast and needs no round trip.
  uint32_t nslots = uint32_t(settingDefault(Setting::kShmSlots));        // ring slots per direction
  size_t slotBytes = size_t(settingDefault(Setting::kShmSlotBytes));     // bytes per slot
  bool cma = settingDefault(Setting::kShmCma) != 0;                      // single copy between processes
  size_t cmaMin = size_t(settingDefault(Setting::kShmCmaMin));           // smallest message sent by CMA
  size_t memcpyMin = size_t(settingDefault(Setting::kShmMemcpyMin));     // smallest message copied straight
                                                                         // from the sender (same process)
  bool map = settingDefault(Setting::kShmMap) != 0;                      // map peers' attnMemAlloc regions
  size_t mapMin = size_t(settingDefault(Setting::kShmMapMin));           // smallest such message read by memcpy
  size_t mapCache = size_t(settingDefault(Setting::kShmMapCache));       // regions kept mapped per peer
  bool hugePages = settingDefault(Setting::kShmHugePages) != 0;          // CMA buffers to huge pages
  int spinUs = int(settingDefault(Setting::kShmSpinUs));                 // poll before sleeping
  int livenessMs = 50;              // how often a peer process is checked

  static Config fromEnv();
};

// Bytes the receiver copies per progress() call from a direct message: keeps
// progress() short (~0.5 ms) so other connections and close() get their turn.
constexpr size_t kDirectPieceBytes = 1u << 20;

}  // namespace attn::shm
