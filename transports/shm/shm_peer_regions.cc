#include "transports/shm/shm_peer_regions.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "src/core/log.h"
#include "src/core/shareable_memory.h"

namespace attn::shm {

PeerRegions::PeerRegions(pid_t pid, int peer, size_t maxRegions)
    : pid_(pid), peer_(peer), maxRegions_(maxRegions < 1 ? 1 : maxRegions) {}

PeerRegions::~PeerRegions() {
  for (Mapping& m : lru_) munmap(m.base, m.bytes);
}

const uint8_t* PeerRegions::lookup(const SlotHeader& s) {
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

// Opens the peer's descriptor and checks it is the region the slot names
// before mapping it: the number may since have been reused for another file.
const uint8_t* PeerRegions::mapRegion(const SlotHeader& s) {
  const std::string path = "/proc/" + std::to_string(pid_) + "/fd/" + std::to_string(s.regionFd);
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == EACCES || errno == EPERM) {
      refused_ = true;
      ATTN_INFO(kLogShm, "peer %d: cannot open its shareable memory (%s); reading it with CMA",
                peer_, strerror(errno));
    }
    return nullptr;
  }
  char link[256];
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  ssize_t n = readlink(self.c_str(), link, sizeof(link) - 1);
  link[n > 0 ? n : 0] = '\0';
  const std::string want = "/memfd:" + shareableName(s.regionPid, s.regionSerial) + " ";
  struct stat st{};
  if (strncmp(link, want.c_str(), want.size()) != 0 || fstat(fd, &st) != 0 ||
      static_cast<uint64_t>(st.st_size) < s.regionBytes) {
    close(fd);
    return nullptr;
  }
  // Populate now: one pass over the page tables instead of a fault per page
  // during the copies.
  void* p = mmap(nullptr, s.regionBytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return nullptr;
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
