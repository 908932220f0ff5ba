#include "transports/shm/shm_peer_regions.h"

#include <sys/mman.h>

#include <cerrno>
#include <string>

#include "src/core/log.h"
#include "src/core/shareable_memory.h"

namespace attn::shm {

PeerRegions::PeerRegions(pid_t pid, int peer, size_t maxRegions)
    : pid_(pid), peer_(peer), maxRegions_(maxRegions < 1 ? 1 : maxRegions) {}

PeerRegions::~PeerRegions() {
  for (Mapping& m : lru_) munmap(m.base, m.bytes);
}

const uint8_t* PeerRegions::lookup(const SlotView& s) {
  if (s.regionOffset > s.regionBytes || s.msgBytes > s.regionBytes - s.regionOffset) return nullptr;
  const Key key{s.regionPid, s.regionSerial};
  auto it = byKey_.find(key);
  if (it != byKey_.end()) {
    if (it->second->bytes < s.regionBytes) return nullptr;  // not the region we mapped
    lru_.splice(lru_.begin(), lru_, it->second);
    return lru_.front().base + s.regionOffset;
  }
  if (refused_) return nullptr;
  const uint8_t* base = mapRegion(s);
  return base ? base + s.regionOffset : nullptr;
}

// Opens the peer's descriptor (checked to be the region the slot names:
// the number may since have been reused for another file) and maps it.
const uint8_t* PeerRegions::mapRegion(const SlotView& s) {
  ShareableRegion r;
  r.ownerPid = s.regionPid;
  r.fd = s.regionFd;
  r.serial = s.regionSerial;
  std::string why;
  int err = 0;
  void* p = mapPeerShareable(pid_, r, s.regionBytes, /*writable=*/false, /*populate=*/true, &why, &err);
  if (!p) {
    if (err == EACCES || err == EPERM) {
      refused_ = true;
      ATTN_INFO(kLogShm, "peer %d: cannot open its shareable memory (%s); reading it with CMA", peer_, why.c_str());
    }
    return nullptr;
  }
  if (lru_.size() >= maxRegions_) {
    Mapping& old = lru_.back();
    munmap(old.base, old.bytes);
    byKey_.erase(old.key);
    lru_.pop_back();
  }
  const Key key{s.regionPid, s.regionSerial};
  lru_.push_front(Mapping{key, static_cast<uint8_t*>(p), s.regionBytes});
  byKey_[key] = lru_.begin();
  ATTN_TRACE(kLogShm, "peer %d: mapped its region %lld-%llu (%llu bytes)", peer_,
             (long long)s.regionPid, (unsigned long long)s.regionSerial,
             (unsigned long long)s.regionBytes);
  return static_cast<uint8_t*>(p);
}

}  // namespace attn::shm
