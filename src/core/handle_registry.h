// The handles the C API has given out and not yet taken back (attnComm_t,
// attnKvPool_t, attnPlan_t), process-wide, so an entry point tells a live
// handle from a destroyed, never-created or wrong-type one without reading
// the memory it points to. Lookups take one of 64 small locks, chosen by
// the handle's address: ranks that are threads of one process, each on its
// own communicator, rarely meet on one.
#pragma once

#include <atomic>
#include <cstdint>

#include "attncomm.h"

namespace attn {

enum class HandleKind : uint8_t { kComm = 1, kKvPool = 2, kPlan = 3 };
// "communicator", "KV pool", "plan".
const char* handleKindName(HandleKind k);

enum class HandleState : uint8_t {
  kLive,       // usable
  kClosing,    // its destroy has begun
  kUnknown,    // never given out, or destroyed
  kOtherKind,  // a live handle of another kind
};

struct HandleLookup {
  HandleState state = HandleState::kUnknown;
  HandleKind kind = HandleKind::kComm;  // what it is (kOtherKind: the other kind)
};

// Makes `h` a live handle of `kind`. `pins` (a communicator's activeCalls)
// counts the calls that hold it (acquireHandle). False when out of memory.
bool registerHandle(const void* h, HandleKind kind, std::atomic<int>* pins = nullptr) noexcept;

// Looks `h` up as a `kind`. When it is live, adds one to its pins, under
// the same lock its destroy takes: a handle returned pinned cannot be freed
// until the pin is dropped. One being closed is not live: the library's own
// work for it never comes back through the API.
HandleLookup acquireHandle(const void* h, HandleKind kind) noexcept;
// Looks `h` up without pinning it.
HandleLookup lookupHandle(const void* h, HandleKind kind) noexcept;

// The start of a destroy: a live `h` becomes closing (new calls are
// refused). Returns what `h` was: only kLive lets the caller go on.
HandleLookup beginClose(const void* h, HandleKind kind) noexcept;
// The end of a destroy: `h` is forgotten (do this before freeing it).
void forgetHandle(const void* h) noexcept;

// Sets the calling thread's error for a handle that `lookup` refused and
// returns attnInvalidArgument: "<what>: communicator 0x.. was destroyed or
// never created", "... is a KV pool handle, not a communicator", ...
attnResult_t badHandle(const char* what, const void* h, HandleKind want, const HandleLookup& lookup);

}  // namespace attn
