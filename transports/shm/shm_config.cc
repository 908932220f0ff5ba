#include "transports/shm/shm_config.h"

#include "src/core/env.h"
#include "src/core/log.h"
#include "transports/shm/shm_header_check.h"

namespace attn::shm {

Config Config::fromEnv() {
  Config c;
  int64_t slots = envInt("ATTN_SHM_SLOTS", c.nslots);
  int64_t slotBytes = envInt("ATTN_SHM_SLOT_BYTES", static_cast<int64_t>(c.slotBytes));
  // The bounds a peer checks our channel header against (shm_header_check.h).
  if (slots < kMinSlots || slots > kMaxSlots) {
    ATTN_WARN(kLogShm, "ATTN_SHM_SLOTS=%lld out of [2, 1024]; using %u", (long long)slots, c.nslots);
  } else {
    c.nslots = static_cast<uint32_t>(slots);
  }
  if (slotBytes < int64_t(kMinSlotBytes) || slotBytes > int64_t(kMaxSlotBytes)) {
    ATTN_WARN(kLogShm, "ATTN_SHM_SLOT_BYTES=%lld out of [4096, 1 GiB]; using %zu",
              (long long)slotBytes, c.slotBytes);
  } else {
    c.slotBytes = static_cast<size_t>(slotBytes + 63) / 64 * 64;  // keep slots line-aligned
  }
  c.cma = envBool("ATTN_SHM_CMA", c.cma);
  int64_t cmaMin = envInt("ATTN_SHM_CMA_MIN", static_cast<int64_t>(c.cmaMin));
  int64_t memcpyMin = envInt("ATTN_SHM_MEMCPY_MIN", static_cast<int64_t>(c.memcpyMin));
  c.cmaMin = cmaMin < 1 ? 1 : static_cast<size_t>(cmaMin);
  c.memcpyMin = memcpyMin < 1 ? 1 : static_cast<size_t>(memcpyMin);
  c.map = envBool("ATTN_SHM_MAP", c.map);
  int64_t mapMin = envInt("ATTN_SHM_MAP_MIN", static_cast<int64_t>(c.mapMin));
  int64_t mapCache = envInt("ATTN_SHM_MAP_CACHE", static_cast<int64_t>(c.mapCache));
  c.mapMin = mapMin < 1 ? 1 : static_cast<size_t>(mapMin);
  c.mapCache = mapCache < 1 ? 1 : static_cast<size_t>(mapCache);
  c.hugePages = envBool("ATTN_SHM_HUGEPAGES", c.hugePages);
  int64_t spin = envInt("ATTN_SHM_SPIN_US", c.spinUs);
  c.spinUs = spin < 0 ? 0 : spin > 1000000 ? 1000000 : static_cast<int>(spin);
  return c;
}

}  // namespace attn::shm
