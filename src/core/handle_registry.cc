#include "src/core/handle_registry.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "src/core/error.h"

namespace attn {
namespace {

struct Entry {
  uintptr_t key;  // the handle; 0: empty slot, 1: a slot whose handle was forgotten
  std::atomic<int>* pins;
  HandleKind kind;
  bool closing;
};
constexpr uintptr_t kEmpty = 0, kForgotten = 1;

uint64_t mix(uintptr_t h) { return uint64_t(h) * 0x9E3779B97F4A7C15ull; }

// Open addressing with linear probing: a lookup is a multiply and a few
// loads, no division and no pointer chase (most stripes hold one handle).
class FlatTable {
 public:
  Entry* find(uintptr_t key) {
    if (slots_.empty()) return nullptr;
    for (size_t i = indexOf(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return &slots_[i];
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }
  // May throw std::bad_alloc (growing); the table is unchanged then.
  void insert(const Entry& e) {
    if (Entry* old = find(e.key)) {
      *old = e;
      return;
    }
    if (2 * (used_ + 1) > slots_.size()) rehash(std::max<size_t>(8, 4 * live_ + 4));
    for (size_t i = indexOf(e.key);; i = (i + 1) & mask_)
      if (slots_[i].key == kEmpty || slots_[i].key == kForgotten) {
        used_ += slots_[i].key == kEmpty;
        slots_[i] = e;
        ++live_;
        return;
      }
  }
  void erase(uintptr_t key) {
    if (Entry* e = find(key)) {
      e->key = kForgotten;
      --live_;
    }
  }

 private:
  size_t indexOf(uintptr_t key) const { return size_t((mix(key) << 6) >> (64 - bits_)); }
  void rehash(size_t atLeast) {
    int bits = 3;
    while ((size_t(1) << bits) < atLeast) ++bits;
    std::vector<Entry> old(size_t(1) << bits, Entry{kEmpty, nullptr, HandleKind::kComm, false});
    old.swap(slots_);
    bits_ = bits;
    mask_ = slots_.size() - 1;
    used_ = live_ = 0;
    for (const Entry& e : old)
      if (e.key > kForgotten) insert(e);
  }
  std::vector<Entry> slots_;
  int bits_ = 0;
  size_t mask_ = 0, used_ = 0, live_ = 0;
};

// A lock held for a few loads and stores: spinning beats sleeping.
class SpinLock {
 public:
  void lock() noexcept {
    for (int spins = 0; flag_.exchange(true, std::memory_order_acquire); ++spins)
      while (flag_.load(std::memory_order_relaxed))
        if (++spins > 64) std::this_thread::yield();
  }
  void unlock() noexcept { flag_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> flag_{false};
};

struct alignas(64) Stripe {
  SpinLock mu;
  FlatTable live;
};

constexpr int kStripeBits = 6;
// Never destroyed: handles may be used (and refused) during exit.
Stripe* const gStripes = new Stripe[1 << kStripeBits];

Stripe& stripeOf(const void* h) { return gStripes[mix(reinterpret_cast<uintptr_t>(h)) >> (64 - kStripeBits)]; }

struct Locked {
  explicit Locked(Stripe& s) : s_(s) { s_.mu.lock(); }
  ~Locked() { s_.mu.unlock(); }
  Stripe& s_;
};

HandleLookup lookupLocked(Stripe& s, const void* h, HandleKind kind, Entry** found) {
  const uintptr_t key = reinterpret_cast<uintptr_t>(h);
  Entry* e = key > kForgotten ? s.live.find(key) : nullptr;
  if (!e) return {HandleState::kUnknown, kind};
  *found = e;
  if (e->kind != kind) return {HandleState::kOtherKind, e->kind};
  return {e->closing ? HandleState::kClosing : HandleState::kLive, kind};
}

}  // namespace

const char* handleKindName(HandleKind k) {
  switch (k) {
    case HandleKind::kComm: return "communicator";
    case HandleKind::kKvPool: return "KV pool";
    case HandleKind::kPlan: return "plan";
  }
  return "handle";
}

bool registerHandle(const void* h, HandleKind kind, std::atomic<int>* pins) noexcept {
  Stripe& s = stripeOf(h);
  Locked g(s);
  if (reinterpret_cast<uintptr_t>(h) <= kForgotten) return false;
  try {
    s.live.insert(Entry{reinterpret_cast<uintptr_t>(h), pins, kind, false});
  } catch (...) {
    return false;
  }
  return true;
}

HandleLookup acquireHandle(const void* h, HandleKind kind) noexcept {
  Stripe& s = stripeOf(h);
  Locked g(s);
  Entry* e = nullptr;
  const HandleLookup l = lookupLocked(s, h, kind, &e);
  const bool usable = l.state == HandleState::kLive;
  if (usable && e->pins) e->pins->fetch_add(1, std::memory_order_acq_rel);
  return usable ? HandleLookup{HandleState::kLive, kind} : l;
}

HandleLookup lookupHandle(const void* h, HandleKind kind) noexcept {
  Stripe& s = stripeOf(h);
  Locked g(s);
  Entry* e = nullptr;
  return lookupLocked(s, h, kind, &e);
}

HandleLookup beginClose(const void* h, HandleKind kind) noexcept {
  Stripe& s = stripeOf(h);
  Locked g(s);
  Entry* e = nullptr;
  const HandleLookup l = lookupLocked(s, h, kind, &e);
  if (l.state == HandleState::kLive) e->closing = true;
  return l;
}

void forgetHandle(const void* h) noexcept {
  Stripe& s = stripeOf(h);
  Locked g(s);
  if (reinterpret_cast<uintptr_t>(h) > kForgotten) s.live.erase(reinterpret_cast<uintptr_t>(h));
}

attnResult_t badHandle(const char* what, const void* h, HandleKind want, const HandleLookup& l) {
  const char* wanted = handleKindName(want);
  const char* sep = what && *what ? ": " : "";
  what = what ? what : "";
  if (h == nullptr) return setError(attnInvalidArgument, "%s%sthe %s is NULL", what, sep, wanted);
  switch (l.state) {
    case HandleState::kOtherKind:
      return setError(attnInvalidArgument, "%s%s%p is a %s handle, not a %s", what, sep, h, handleKindName(l.kind),
                      wanted);
    case HandleState::kClosing:
      return setError(attnInvalidArgument, "%s%s%s %p is being destroyed", what, sep, wanted, h);
    default:
      return setError(attnInvalidArgument, "%s%s%p is not a live %s (destroyed, or never created)", what, sep, h,
                      wanted);
  }
}

}  // namespace attn
