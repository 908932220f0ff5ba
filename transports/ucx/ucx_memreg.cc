#include "transports/ucx/ucx_memreg.h"

#include <ucm/api/ucm.h>

#include <algorithm>

#include "src/core/log.h"

namespace attn::ucx {
namespace {

void onUnmapped(ucm_event_type_t type, ucm_event_t* ev, void* arg) {
  if (type != UCM_EVENT_VM_UNMAPPED) return;
  static_cast<UcxRegCache*>(arg)->noteUnmapped(reinterpret_cast<uintptr_t>(ev->vm_unmapped.address),
                                               ev->vm_unmapped.size);
}

constexpr int kEventPriority = 1000;

bool overlaps(uintptr_t a, size_t alen, uintptr_t b, size_t blen) {
  return a < b + blen && b < a + alen;
}

}  // namespace

UcxRegCache::UcxRegCache(ucp_context_h context, size_t minBytes, size_t maxEntries)
    : context_(context), minBytes_(minBytes), maxEntries_(std::max<size_t>(maxEntries, 1)) {
  if (minBytes_ == 0) return;
  listening_ = ucm_set_event_handler(UCM_EVENT_VM_UNMAPPED, kEventPriority, &onUnmapped, this) ==
               UCS_OK;
  enabled_ = listening_;
  if (!enabled_)
    ATTN_INFO(kLogNet, "ucx: memory events unavailable; registration cache off "
                       "(UCX registers rendezvous buffers itself)");
}

UcxRegCache::~UcxRegCache() {
  if (listening_) ucm_unset_event_handler(UCM_EVENT_VM_UNMAPPED, &onUnmapped, this);
  for (Entry* e : entries_) unmap(e);
  for (Entry* e : retired_) unmap(e);  // the worker is idle by now
}

void UcxRegCache::noteUnmapped(uintptr_t addr, size_t len) {
  const uint64_t i = head_.fetch_add(1, std::memory_order_acq_rel);
  Slot& s = ring_[i % kRing];
  s.addr.store(addr, std::memory_order_relaxed);
  s.len.store(len, std::memory_order_relaxed);
  s.seq.store(i + 1, std::memory_order_release);
}

void UcxRegCache::drainInvalidations() {
  const uint64_t head = head_.load(std::memory_order_acquire);
  if (head == tail_) return;
  if (entries_.empty() || head - tail_ > kRing) {
    // Nothing to drop, or the ring overflowed: start afresh.
    if (!entries_.empty()) dropAll();
    tail_ = head;
    return;
  }
  for (; tail_ < head; ++tail_) {
    Slot& s = ring_[tail_ % kRing];
    if (s.seq.load(std::memory_order_acquire) != tail_ + 1) {  // being written or lapped
      dropAll();
      tail_ = head;
      return;
    }
    uintptr_t a = s.addr.load(std::memory_order_relaxed);
    size_t l = s.len.load(std::memory_order_relaxed);
    if (s.seq.load(std::memory_order_acquire) != tail_ + 1) {
      dropAll();
      tail_ = head;
      return;
    }
    dropOverlapping(a, l);
  }
}

UcxRegCache::Entry* UcxRegCache::acquire(const void* p, size_t n) {
  if (!enabled_ || n < minBytes_) return nullptr;
  drainInvalidations();
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  for (Entry* e : entries_)
    if (a >= e->base && a + n <= e->base + e->len) {
      ++hits_;
      ++e->refs;
      e->lastUse = ++clock_;
      return e;
    }
  ++misses_;
  if (entries_.size() >= maxEntries_) {
    // Evict the least recently used (it may still be in flight: retire).
    size_t lru = 0;
    for (size_t i = 1; i < entries_.size(); ++i)
      if (entries_[i]->lastUse < entries_[lru]->lastUse) lru = i;
    retire(lru);
  }
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = const_cast<void*>(p);
  mp.length = n;
  ucp_mem_h memh = nullptr;
  if (ucp_mem_map(context_, &mp, &memh) != UCS_OK) return nullptr;
  Entry* e = new Entry{a, n, memh, 1, false, ++clock_};
  entries_.push_back(e);
  // A mapping change during ucp_mem_map is seen on the next drain.
  return e;
}

void UcxRegCache::release(Entry* e) {
  if (!e) return;
  if (--e->refs > 0 || !e->dead) return;
  auto it = std::find(retired_.begin(), retired_.end(), e);
  if (it != retired_.end()) retired_.erase(it);
  unmap(e);
}

void UcxRegCache::retire(size_t i) {
  Entry* e = entries_[i];
  entries_.erase(entries_.begin() + long(i));
  e->dead = true;
  if (e->refs > 0)
    retired_.push_back(e);
  else
    unmap(e);
}

void UcxRegCache::dropOverlapping(uintptr_t addr, size_t len) {
  for (size_t i = entries_.size(); i-- > 0;)
    if (overlaps(entries_[i]->base, entries_[i]->len, addr, len)) retire(i);
}

void UcxRegCache::dropAll() {
  while (!entries_.empty()) retire(entries_.size() - 1);
}

void UcxRegCache::unmap(Entry* e) {
  ucp_mem_unmap(context_, e->memh);
  delete e;
}

}  // namespace attn::ucx
