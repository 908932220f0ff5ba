#include "src/device/retained_memory.h"

#include <cuda_runtime_api.h>

#include <map>
#include <mutex>

#include "src/core/settings.h"
#include "src/core/log.h"
#include "src/device/cuda_check.h"
#include "src/device/device_scope.h"
#include "src/device/parked_streams.h"

namespace attn::retained {
namespace {

constexpr size_t kMiB = size_t(1) << 20;

// Small requests round to a power of two (from 256 bytes), larger ones to
// whole MiB: sizes repeat, so blocks fit later requests.
size_t roundSize(size_t bytes) {
  if (bytes >= kMiB) return (bytes + kMiB - 1) / kMiB * kMiB;
  size_t s = 256;
  while (s < bytes) s <<= 1;
  return s;
}

struct Cache {
  std::mutex mu;  // also held while blocks are freed: no hold starts meanwhile
  std::map<int, std::multimap<size_t, void*>> free;  // by where, then size
  int holds = 0;
  size_t cap = 0;  // readCapBytes(), read when a device communicator is made
  Stats stats;
};

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: used until exit
  return *c;
}

void freeBlock(int where, void* p) {
  if (where == kHost) {
    if (cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
    return;
  }
  DeviceScope dev;
  if (dev.enter(where) == attnSuccess && cudaFree(p) == cudaSuccess) return;
  (void)cudaGetLastError();
}

// Bytes the cache keeps while device communicators exist; blocks beyond it
// go back to CUDA when that is safe (parked_streams.h).
size_t readCapBytes() {
  const int64_t mib = settingInt<Setting::kRetainedCacheMb>();  // >= 0
  return size_t(mib) * kMiB;
}

constexpr int kAnywhere = -2;  // `where` of freeLocked / trimLocked: every place

// With the lock held: frees cached blocks of `where`, largest first, until
// at most `keep` bytes stay cached. Returns the bytes freed.
size_t freeLocked(Cache& c, int where, size_t keep) {
  size_t n = 0, bytes = 0;
  for (auto& [w, blocks] : c.free) {
    if (where != kAnywhere && w != where) continue;
    while (!blocks.empty() && c.stats.cachedBytes > keep) {
      auto last = std::prev(blocks.end());
      freeBlock(w, last->second);
      c.stats.cachedBytes -= last->first;
      bytes += last->first;
      ++n;
      blocks.erase(last);
    }
  }
  c.stats.freed += n;
  if (n) ATTN_INFO(kLogInit, "retained memory: %zu cached blocks (%zu MiB) given back to CUDA, %zu MiB kept", n,
                   bytes / kMiB, c.stats.cachedBytes / kMiB);
  return bytes;
}

// freeLocked while device communicators exist: only if no stream of the
// process is parked on a proxy; else the blocks wait for a later release.
size_t trimLocked(Cache& c, int where, size_t keep) {
  if (c.stats.cachedBytes <= keep) return 0;
  size_t bytes = 0;
  if (!parked::whileNoneParked([&] { bytes = freeLocked(c, where, keep); })) {
    ++c.stats.trimsDeferred;
    ATTN_TRACE(kLogInit, "retained memory: %zu MiB cached, trim deferred (a stream is parked on a proxy)",
               c.stats.cachedBytes / kMiB);
  }
  return bytes;
}

}  // namespace

attnResult_t acquire(int where, size_t bytes, Block* out) {
  if (bytes == 0) return setError(attnInternalError, "retained memory: a request for 0 bytes");
  const size_t want = roundSize(bytes);
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> g(c.mu);
    auto& blocks = c.free[where];
    auto it = blocks.lower_bound(want);
    if (it != blocks.end() && it->first / 2 <= want) {
      *out = Block{it->second, it->first};
      blocks.erase(it);
      c.stats.cachedBytes -= out->bytes;
      ++c.stats.reused;
      return attnSuccess;
    }
  }
  void* p = nullptr;
  auto allocate = [&] {
    return where == kHost ? cudaHostAlloc(&p, want, cudaHostAllocPortable) : cudaMalloc(&p, want);
  };
  cudaError_t e = allocate();
  if (e == cudaErrorMemoryAllocation) {
    // What the cache holds of this kind may be what is missing: give it back
    // (when safe) and try once more, as PyTorch's caching allocator does.
    (void)cudaGetLastError();
    size_t freed;
    {
      std::lock_guard<std::mutex> g(c.mu);
      freed = trimLocked(c, where, 0);
    }
    if (freed) e = allocate();
  }
  ATTN_CUDA_CHECK(e);
  std::lock_guard<std::mutex> g(c.mu);
  ++c.stats.allocated;
  *out = Block{p, want};
  return attnSuccess;
}

void release(int where, const Block& b) {
  if (!b.ptr) return;
  Cache& c = cache();
  std::lock_guard<std::mutex> g(c.mu);
  if (c.holds == 0) {
    freeBlock(where, b.ptr);
    ++c.stats.freed;
    return;
  }
  c.free[where].emplace(b.bytes, b.ptr);
  c.stats.cachedBytes += b.bytes;
  (void)trimLocked(c, kAnywhere, c.cap);
}

CommHold::CommHold() {
  Cache& c = cache();
  const size_t cap = readCapBytes();
  std::lock_guard<std::mutex> g(c.mu);
  ++c.holds;
  c.cap = cap;
}

CommHold::~CommHold() {
  Cache& c = cache();
  std::lock_guard<std::mutex> g(c.mu);
  if (--c.holds == 0) (void)freeLocked(c, kAnywhere, 0);  // no communicator, no proxy: nothing is parked
}

Stats stats() {
  Cache& c = cache();
  std::lock_guard<std::mutex> g(c.mu);
  Stats s = c.stats;
  s.holds = c.holds;
  return s;
}

}  // namespace attn::retained
