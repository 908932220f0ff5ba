// What lives in shared memory: the layout of one directed channel
// (sender -> receiver) and of a rank's doorbell. Both processes map the same
// bytes, so everything here is plain data plus lock-free atomics (which are
// address-free on the platforms we build for).
#pragma once

#include <atomic>
#include <cstddef>  // offsetof
#include <cstdint>

namespace attn::shm {

constexpr uint32_t kChannelMagic = 0x41534843;  // "ASHC"
constexpr uint32_t kLayoutVersion = 3;
constexpr size_t kCacheLine = 64;
constexpr size_t kPage = 4096;

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared atomics must be lock-free");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "shared atomics must be lock-free");

// Why a side stopped using the channel (written once, read by the other side).
enum CloseReason : uint32_t {
  kOpen = 0,
  kClosed = 1,     // close(), destruction or an error on that side
  kTruncated = 2,  // the receiver got a message longer than its buffer
};

// How the receiver reads a message the sender did not copy into the ring.
// Chosen by the receiver at connect time (it is the side that reads).
enum DirectMode : uint32_t {
  kDirectNone = 0,    // ring only
  kDirectMemcpy = 1,  // same address space: memcpy from the sender's buffer
  kDirectCma = 2,     // another process: process_vm_readv from its buffer
};

enum SlotKind : uint32_t {
  kSlotInline = 0,  // slot data holds bytes [offset, offset+chunkBytes)
  kSlotDirect = 1,  // the whole message sits at `addr` in the sender
  kSlotMapped = 2,  // as direct, and inside a shareable region the receiver
                    // may map (region* fields); CMA from `addr` otherwise
};


// A futex word that peers bump after changing something this rank may be
// waiting for. They bump it only while `watchers` (threads of this rank
// between armWait and disarmWait) is non-zero: a rank that polls sees the
// change itself, and an atomic add on a line the other core reads is the
// dearest part of a small message. `sleepers` lets a ringer skip the wake
// syscall when nobody sleeps.
struct alignas(kCacheLine) Bell {
  std::atomic<uint32_t> seq;
  std::atomic<uint32_t> sleepers;
  std::atomic<uint32_t> watchers;
};

// Bytes of a chunk that travel inside its slot header rather than in the
// slot's data area (see SlotHeader).
constexpr size_t kSlotInlineBytes = 144;

// Written by the sender, then published by `seq` (and head); read by the
// receiver after it sees `seq`. A small message is one cache-line pair: the
// receiver polls `seq` in the same lines as the fields and, up to
// kSlotInlineBytes, the data (`small`), instead of missing on head, the
// header and the data area in turn.
struct alignas(2 * kCacheLine) SlotHeader {
  std::atomic<uint64_t> seq;  // slot number + 1 once published (stored last)
  uint64_t msgIndex;          // the sender's message number (0, 1, ...)
  uint64_t msgBytes;          // size of the whole message
  uint64_t offset;            // inline: where this chunk goes in the message
  uint64_t chunkBytes;        // inline: bytes in this slot
  uint32_t kind;              // SlotKind
  int32_t regionFd;           // mapped: the region's descriptor in the sender
  uint8_t small[kSlotInlineBytes];  // inline chunks up to kSlotInlineBytes
  uint64_t addr;              // direct: the sender's buffer address
  int64_t regionPid;          // mapped: the region's name (shareable_memory.h) ...
  uint64_t regionSerial;
  uint64_t regionBytes;   // ... its size ...
  uint64_t regionOffset;  // ... and where the message starts in it
};
static_assert(sizeof(SlotHeader) == 4 * kCacheLine, "slot headers are two cache-line pairs");
static_assert(offsetof(SlotHeader, small) + 80 <= 2 * kCacheLine, "80 inline bytes share the first pair");

struct ChannelHeader {
  // Set by the creator (the sender) before the name is shared; constant after.
  uint32_t magic;
  uint32_t version;
  uint32_t nslots;
  uint32_t senderRank;
  uint64_t slotBytes;
  int64_t senderPid;
  uint64_t totalBytes;  // size of the mapping

  // Set by the receiver during connect, before its ack.
  alignas(kCacheLine) std::atomic<uint32_t> directMode;

  // Slots consumed (receiver), on a line of its own. Slots published are
  // told by each slot's seq.
  alignas(kCacheLine) std::atomic<uint64_t> tail;

  alignas(kCacheLine) std::atomic<uint32_t> senderClosed;    // CloseReason
  std::atomic<uint32_t> receiverClosed;                      // CloseReason
  uint64_t truncMsgBytes;   // kTruncated: the message's size ...
  uint64_t truncCapacity;   // ... and the receive's capacity

  // Raised by the receiver around each piece it copies from the sender's
  // buffer, so close() on the sender can wait before the caller frees it
  // (see shm_copy.h).
  alignas(kCacheLine) std::atomic<uint32_t> readerBusy;
};

constexpr size_t roundUp(size_t n, size_t a) { return (n + a - 1) / a * a; }

// Offsets inside a channel mapping.
struct ChannelLayout {
  size_t slotHeadersOffset;
  size_t dataOffset;
  size_t totalBytes;

  // For sizes this process chose (shm_config.h bounds them).
  static ChannelLayout make(uint32_t nslots, uint64_t slotBytes) {
    ChannelLayout l;
    l.slotHeadersOffset = roundUp(sizeof(ChannelHeader), kPage);
    l.dataOffset = l.slotHeadersOffset + roundUp(nslots * sizeof(SlotHeader), kPage);
    l.totalBytes = l.dataOffset + nslots * slotBytes;
    return l;
  }
  // The same for sizes read from a peer's header: false when any of it
  // overflows.
  static bool fit(uint32_t nslots, uint64_t slotBytes, ChannelLayout* out) {
    ChannelLayout l;
    uint64_t headers = 0, data = 0;
    l.slotHeadersOffset = roundUp(sizeof(ChannelHeader), kPage);
    if (__builtin_mul_overflow(uint64_t(nslots), uint64_t(sizeof(SlotHeader)), &headers) ||
        headers > UINT64_MAX - kPage ||
        __builtin_add_overflow(uint64_t(l.slotHeadersOffset), roundUp(headers, kPage), &l.dataOffset) ||
        __builtin_mul_overflow(uint64_t(nslots), slotBytes, &data) ||
        __builtin_add_overflow(uint64_t(l.dataOffset), data, &l.totalBytes))
      return false;
    *out = l;
    return true;
  }
};

}  // namespace attn::shm
