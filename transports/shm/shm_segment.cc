#include "transports/shm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

#include "src/core/error.h"

namespace attn::shm {
namespace {

// Segments this process created, by name (see the header).
struct Registry {
  std::mutex mu;
  pid_t pid = 0;  // a forked child starts with an empty registry
  std::map<std::string, std::weak_ptr<Segment>> byName;
};
Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: segments may outlive statics
  return *r;
}

}  // namespace

attnResult_t Segment::create(const std::string& name, size_t bytes,
                             std::shared_ptr<Segment>* out) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0)
    return setError(attnSystemError, "shm: shm_open(%s) failed: %s", name.c_str(), strerror(errno));
  // Reserve the pages now: a sparse file on a full /dev/shm would fail later
  // with SIGBUS on first touch; here it fails cleanly, at connect.
  int e = ftruncate(fd, static_cast<off_t>(bytes)) != 0 ? errno : 0;
  if (e == 0) e = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (e != 0 && e != EOPNOTSUPP && e != EINVAL) {
    close(fd);
    shm_unlink(name.c_str());
    return setError(attnSystemError,
                    "shm: reserving %zu bytes for %s failed: %s (is /dev/shm too small? "
                    "ATTN_SHM_SLOTS / ATTN_SHM_SLOT_BYTES shrink the rings)",
                    bytes, name.c_str(), strerror(e));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  e = errno;
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name.c_str());
    return setError(attnSystemError, "shm: mmap(%s, %zu) failed: %s", name.c_str(), bytes, strerror(e));
  }
  std::shared_ptr<Segment> seg(new Segment(name, p, bytes, /*ownsName=*/true));
  Registry& reg = registry();
  std::lock_guard<std::mutex> g(reg.mu);
  if (reg.pid != getpid()) {
    reg.byName.clear();
    reg.pid = getpid();
  }
  reg.byName[name] = seg;
  *out = std::move(seg);
  return attnSuccess;
}

attnResult_t Segment::open(const std::string& name, size_t bytes,
                           std::shared_ptr<Segment>* out) {
  {
    Registry& reg = registry();
    std::lock_guard<std::mutex> g(reg.mu);
    auto it = reg.byName.find(name);
    if (reg.pid == getpid() && it != reg.byName.end()) {
      if (auto mine = it->second.lock(); mine && (bytes == 0 || mine->size() == bytes)) {
        *out = std::move(mine);
        return attnSuccess;
      }
    }
  }
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0)
    return setError(attnSystemError, "shm: shm_open(%s) of a peer's segment failed: %s",
                    name.c_str(), strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || (bytes != 0 && static_cast<size_t>(st.st_size) != bytes) ||
      st.st_size == 0) {
    close(fd);
    return setError(attnInternalError, "shm: segment %s has %lld bytes, expected %zu",
                    name.c_str(), (long long)st.st_size, bytes);
  }
  size_t size = static_cast<size_t>(st.st_size);
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  int e = errno;
  close(fd);
  if (p == MAP_FAILED)
    return setError(attnSystemError, "shm: mmap(%s, %zu) failed: %s", name.c_str(), size, strerror(e));
  out->reset(new Segment(name, p, size, /*ownsName=*/false));
  return attnSuccess;
}

void Segment::unlink() {
  shm_unlink(name_.c_str());  // ENOENT when the peer already did: fine
  linked_ = false;
}

Segment::~Segment() {
  if (linked_) shm_unlink(name_.c_str());
  {
    Registry& reg = registry();
    std::lock_guard<std::mutex> g(reg.mu);
    auto it = reg.byName.find(name_);
    if (it != reg.byName.end() && it->second.expired()) reg.byName.erase(it);
  }
  if (base_) munmap(base_, size_);
}

}  // namespace attn::shm
