// A small registration cache: large buffers are registered once
// (ucp_mem_map) and the handle is handed to UCX with each request
// (ucp_request_param_t.memh, UCX >= 1.13), so repeated collectives on the
// same buffers skip the per-request registration of the rendezvous path.
//
// Reuse: an entry serves any request inside its range. Staleness: a buffer
// freed and reallocated at the same address must not reuse the old pages'
// registration, so the cache listens to UCM's "memory unmapped" events and
// drops overlapping entries (the event handler only records ranges in a
// lock-free ring; the cache drains it on its next use). Where UCM events are
// off (UCX_MEM_EVENTS=no) the cache stays off and UCX registers by itself.
//
// Not thread-safe: the caller holds the worker's mutex.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace attn::ucx {

class UcxRegCache {
 public:
  struct Entry {
    uintptr_t base = 0;
    size_t len = 0;
    ucp_mem_h memh = nullptr;
    int refs = 0;        // in-flight requests using it
    bool dead = false;   // unmapped underneath or evicted: unmap when refs == 0
    uint64_t lastUse = 0;
  };

  // minBytes: smaller buffers are not registered (0: cache off).
  UcxRegCache(ucp_context_h context, size_t minBytes, size_t maxEntries);
  ~UcxRegCache();
  UcxRegCache(const UcxRegCache&) = delete;
  UcxRegCache& operator=(const UcxRegCache&) = delete;

  bool enabled() const { return enabled_; }
  // A registration covering [p, p+n), or null (small, cache off, or
  // ucp_mem_map failed: UCX then registers on its own). Pair with release.
  Entry* acquire(const void* p, size_t n);
  void release(Entry* e);

  size_t hits() const { return hits_; }
  size_t misses() const { return misses_; }
  size_t size() const { return entries_.size(); }

  // Called by the UCM event handler (any thread, inside munmap & co).
  void noteUnmapped(uintptr_t addr, size_t len);

 private:
  void drainInvalidations();
  void dropOverlapping(uintptr_t addr, size_t len);
  void dropAll();
  void retire(size_t i);  // removes entries_[i] (unmaps now or when released)
  void unmap(Entry* e);

  ucp_context_h context_;
  size_t minBytes_, maxEntries_;
  bool enabled_ = false;
  bool listening_ = false;
  std::vector<Entry*> entries_;  // live, searched linearly (small)
  std::vector<Entry*> retired_;  // dead but still in use
  uint64_t clock_ = 0;
  size_t hits_ = 0, misses_ = 0;

  // Unmapped ranges, multi-producer (event handler) / single consumer.
  static constexpr size_t kRing = 256;
  struct Slot {
    std::atomic<uint64_t> seq{0};  // index + 1 once written
    std::atomic<uintptr_t> addr{0};
    std::atomic<size_t> len{0};
  };
  Slot ring_[kRing];
  std::atomic<uint64_t> head_{0};
  uint64_t tail_ = 0;
};

}  // namespace attn::ucx
