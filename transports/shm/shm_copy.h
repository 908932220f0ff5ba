// Single-copy reads from a peer's buffer: memcpy when the peer shares our
// address space, CMA (process_vm_readv) when it is another process.
//
// The buffer belongs to the peer's caller, who may free it once its request
// fails. A thread of ours reading freed memory would crash us, so every
// piece is copied under a busy flag in shared memory, and the owner's
// close() waits for the flag to drop (Dekker with seq_cst on both sides:
// the reader raises busy, then looks at closed; the owner sets closed, then
// looks at busy). A CMA read of freed memory only yields garbage or EFAULT,
// so a peer process is not waited for: the reader looks at closed again
// after the copy and drops what it read.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "transports/shm/shm_layout.h"

namespace attn::shm {

struct PeerMemory {
  DirectMode mode = kDirectNone;  // kDirectMemcpy or kDirectCma
  pid_t pid = 0;
};

// Copies `n` bytes from the peer's `remote` address to `local`, under
// `busy`, unless `ownerClosed` is set. Returns 0, ECANCELED when the owner
// closed (its buffer may be gone), or the errno of the failed CMA call.
int guardedCopy(const PeerMemory& peer, uint8_t* local, uint64_t remote, size_t n,
                std::atomic<uint32_t>& busy, const std::atomic<uint32_t>& ownerClosed);

// How long an owner waits for a reader to leave its buffers: the
// communicator's timeout (0: no limit) and its abort flag (may be null).
struct WaitLimit {
  int timeoutMs = 0;
  const std::atomic<bool>* abort = nullptr;
};

// The owner's side, same address space only: after marking itself closed,
// waits until the reader is out of its buffers (a reader that works is one
// memcpy piece away from done, never blocked on us). The flag lives in
// memory the peer writes, so the wait ends at the limit too: false then.
bool waitWhileBusy(const std::atomic<uint32_t>& busy, const WaitLimit& limit);

}  // namespace attn::shm
