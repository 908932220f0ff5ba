#include "transports/shm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "src/core/error.h"

namespace attn::shm {

attnResult_t Segment::create(const std::string& name, size_t bytes,
                             std::unique_ptr<Segment>* out) {
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
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  e = errno;
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name.c_str());
    return setError(attnSystemError, "shm: mmap(%s, %zu) failed: %s", name.c_str(), bytes, strerror(e));
  }
  out->reset(new Segment(name, p, bytes, /*ownsName=*/true));
  return attnSuccess;
}

attnResult_t Segment::open(const std::string& name, size_t bytes,
                           std::unique_ptr<Segment>* out) {
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
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
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
  if (base_) munmap(base_, size_);
}

}  // namespace attn::shm
