#include "src/device/retained_memory.h"

#include <cuda_runtime_api.h>

#include <map>
#include <mutex>

#include "src/core/log.h"
#include "src/device/cuda_check.h"
#include "src/device/device_scope.h"

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

// Called with the lock held and no hold left.
void freeAllLocked(Cache& c) {
  size_t n = 0, bytes = 0;
  for (auto& [where, blocks] : c.free)
    for (auto& [size, p] : blocks) {
      freeBlock(where, p);
      ++n;
      bytes += size;
    }
  c.free.clear();
  c.stats.freed += n;
  c.stats.cachedBytes = 0;
  if (n) ATTN_INFO(kLogInit, "no device communicator left: %zu cached blocks (%zu MiB) given back to CUDA", n,
                   bytes / kMiB);
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
  if (where == kHost) {
    ATTN_CUDA_CHECK(cudaHostAlloc(&p, want, cudaHostAllocPortable));
  } else {
    ATTN_CUDA_CHECK(cudaMalloc(&p, want));
  }
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
}

CommHold::CommHold() {
  Cache& c = cache();
  std::lock_guard<std::mutex> g(c.mu);
  ++c.holds;
}

CommHold::~CommHold() {
  Cache& c = cache();
  std::lock_guard<std::mutex> g(c.mu);
  if (--c.holds == 0) freeAllLocked(c);
}

Stats stats() {
  Cache& c = cache();
  std::lock_guard<std::mutex> g(c.mu);
  Stats s = c.stats;
  s.holds = c.holds;
  return s;
}

}  // namespace attn::retained
