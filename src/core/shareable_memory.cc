#include "src/core/shareable_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <shared_mutex>

#include "src/core/error.h"
#include "src/core/log.h"

namespace attn {
namespace {

struct Registry {
  std::shared_mutex mu;
  std::map<uintptr_t, ShareableRegion> byBase;  // ordered: lookup by address
  // Regions alive: lets every send skip the lock while nobody allocated.
  std::atomic<size_t> live{0};
  std::atomic<uint64_t> nextSerial{1};
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: frees may run at exit
  return *r;
}

}  // namespace

std::string shareableName(int64_t ownerPid, uint64_t serial) {
  return "attn-mem-" + std::to_string(ownerPid) + "-" + std::to_string(serial);
}

void* mapPeerShareable(int64_t holder, const ShareableRegion& r, size_t bytes, bool writable, bool populate,
                       std::string* why, int* errnoOut) {
  *errnoOut = 0;
  const std::string path = "/proc/" + std::to_string(holder) + "/fd/" + std::to_string(r.fd);
  int fd = open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) {
    *errnoOut = errno;
    *why = "opening " + path + " failed: " + strerror(*errnoOut);
    return nullptr;
  }
  char link[256];
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  ssize_t n = readlink(self.c_str(), link, sizeof(link) - 1);
  link[n > 0 ? n : 0] = '\0';
  const std::string want = "/memfd:" + shareableName(r.ownerPid, r.serial) + " ";
  struct stat st{};
  if (strncmp(link, want.c_str(), want.size()) != 0 || fstat(fd, &st) != 0 ||
      static_cast<uint64_t>(st.st_size) < bytes) {
    close(fd);
    *why = path + " is no longer region " + shareableName(r.ownerPid, r.serial) + " of " +
           std::to_string(bytes) + " bytes";
    return nullptr;
  }
  // A region its owner could shrink would turn our reads of the mapping
  // into SIGBUS: map only memfds sealed against that (shareableAlloc seals
  // its own; a peer that did not is read by CMA instead).
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
    close(fd);
    *why = path + " (region " + shareableName(r.ownerPid, r.serial) +
           ") is not sealed against shrinking";
    return nullptr;
  }
  // Populate on request: one pass over the page tables instead of a fault
  // per page during the copies.
  void* p = mmap(nullptr, bytes, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED | (populate ? MAP_POPULATE : 0),
                 fd, 0);
  const int mapErrno = errno;
  close(fd);
  if (p == MAP_FAILED) {
    *errnoOut = mapErrno;
    *why = "mapping " + path + " failed: " + strerror(mapErrno);
    return nullptr;
  }
  return p;
}

attnResult_t shareableAlloc(size_t bytes, void** ptr) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  if (bytes > (size_t(1) << 48)) return setError(attnInvalidArgument, "attnMemAlloc: %zu bytes is too large", bytes);
  const size_t len = (bytes + page - 1) / page * page;
  Registry& reg = registry();
  const uint64_t serial = reg.nextSerial.fetch_add(1);
  const int64_t pid = getpid();
  int fd = memfd_create(shareableName(pid, serial).c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  const int memfdErrno = errno;
  // Sealed at its size: peers that map it can trust it never shrinks.
  if (fd >= 0 && (ftruncate(fd, static_cast<off_t>(len)) != 0 ||
                  fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0)) {
    int e = errno;
    close(fd);
    return setError(attnSystemError, "attnMemAlloc: sizing and sealing a memfd of %zu bytes failed: %s",
                    len, strerror(e));
  }
  void* p = fd >= 0 ? mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                    : mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    if (fd >= 0) close(fd);
    return setError(attnSystemError, "attnMemAlloc: mapping %zu bytes failed: %s", len, strerror(e));
  }
  if (fd < 0)
    ATTN_INFO(kLogInit, "attnMemAlloc: memfd_create failed (%s); peers will copy with CMA",
              strerror(memfdErrno));
  ShareableRegion r{reinterpret_cast<uintptr_t>(p), len, fd, pid, serial};
  {
    std::unique_lock lock(reg.mu);
    reg.byBase[r.base] = r;
    reg.live.fetch_add(1);
  }
  *ptr = p;
  return attnSuccess;
}

attnResult_t shareableFree(void* ptr) {
  Registry& reg = registry();
  ShareableRegion r;
  {
    std::unique_lock lock(reg.mu);
    auto it = reg.byBase.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == reg.byBase.end())
      return setError(attnInvalidArgument, "attnMemFree: %p did not come from attnMemAlloc (or was freed)", ptr);
    r = it->second;
    reg.byBase.erase(it);
    reg.live.fetch_sub(1);
  }
  munmap(reinterpret_cast<void*>(r.base), r.bytes);
  if (r.fd >= 0) close(r.fd);
  return attnSuccess;
}

bool findShareable(const void* ptr, size_t bytes, ShareableRegion* out) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
  Registry& reg = registry();
  if (reg.live.load(std::memory_order_relaxed) == 0) return false;
  std::shared_lock lock(reg.mu);
  auto it = reg.byBase.upper_bound(a);
  if (it == reg.byBase.begin()) return false;
  --it;
  const ShareableRegion& r = it->second;
  if (a - r.base > r.bytes || bytes > r.bytes - (a - r.base)) return false;
  *out = r;
  return true;
}

attnResult_t ShareableBuffer::reserve(size_t bytes) {
  if (bytes <= capacity_ && data_) return attnSuccess;
  size_t want = std::max(bytes, capacity_ + capacity_ / 4);
  if (want == 0) want = 1;
  release();
  void* p = nullptr;
  if (shareableAlloc(want, &p) == attnSuccess) {
    shareable_ = true;
  } else {
    clearThreadLastError();  // fine: peers copy from the heap with CMA
    p = malloc(want);
    if (!p) return setError(attnSystemError, "out of memory for a %zu-byte buffer", want);
    shareable_ = false;
  }
  data_ = static_cast<char*>(p);
  capacity_ = want;
  return attnSuccess;
}

void ShareableBuffer::release() {
  if (!data_) return;
  if (shareable_) shareableFree(data_);
  else free(data_);
  data_ = nullptr;
  capacity_ = 0;
}

}  // namespace attn
