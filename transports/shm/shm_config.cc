#include "transports/shm/shm_config.h"

#include "src/core/settings.h"
#include "src/core/log.h"
#include "transports/shm/shm_header_check.h"

namespace attn::shm {

Config Config::fromEnv() {
  // Defaults, ranges and what an out-of-range value becomes are the table's
  // (src/core/settings.def); the slot bounds are those a peer checks our
  // channel header against (shm_header_check.h).
  static_assert(settingInfo(Setting::kShmSlots).lo == kMinSlots && settingInfo(Setting::kShmSlots).hi == kMaxSlots);
  static_assert(settingInfo(Setting::kShmSlotBytes).lo == int64_t(kMinSlotBytes) &&
                settingInfo(Setting::kShmSlotBytes).hi == int64_t(kMaxSlotBytes));
  Config c;
  c.nslots = static_cast<uint32_t>(settingInt<Setting::kShmSlots>());
  c.slotBytes = static_cast<size_t>(settingInt<Setting::kShmSlotBytes>() + 63) / 64 * 64;  // keep slots line-aligned
  c.cma = settingBool<Setting::kShmCma>();
  c.cmaMin = static_cast<size_t>(settingInt<Setting::kShmCmaMin>());
  c.memcpyMin = static_cast<size_t>(settingInt<Setting::kShmMemcpyMin>());
  c.map = settingBool<Setting::kShmMap>();
  c.mapMin = static_cast<size_t>(settingInt<Setting::kShmMapMin>());
  c.mapCache = static_cast<size_t>(settingInt<Setting::kShmMapCache>());
  c.hugePages = settingBool<Setting::kShmHugePages>();
  c.spinUs = static_cast<int>(settingInt<Setting::kShmSpinUs>());
  return c;
}

}  // namespace attn::shm
