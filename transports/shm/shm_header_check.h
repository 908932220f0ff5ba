// The receiver's checks of what a peer wrote into shared memory, as pure
// functions over a private copy of the header: the peer may change the
// shared bytes at any moment, so each header is copied out once and only
// the copy is checked and used (no check-then-read-again). A fuzzer can
// drive these without a channel.
#pragma once

#include <cstddef>
#include <cstdint>

#include "transports/shm/shm_layout.h"

namespace attn::shm {

// Limits a channel header must respect (shm_config.cc clamps the
// environment to the same ones).
constexpr uint32_t kMinSlots = 2;
constexpr uint32_t kMaxSlots = 1024;
constexpr uint64_t kMinSlotBytes = 4096;
constexpr uint64_t kMaxSlotBytes = uint64_t(1) << 30;

// A channel header's constant part, as the creator wrote it.
struct ChannelView {
  uint32_t magic, version, nslots, senderRank;
  uint64_t slotBytes;
  int64_t senderPid;
  uint64_t totalBytes;
};
ChannelView copyChannelHeader(const ChannelHeader& h);

// Whether `v` describes a channel of `senderRank` that fills exactly
// `mappedBytes` (sizes overflow-checked); the layout to use when it does.
// Otherwise *why names the first problem.
bool checkChannelHeader(const ChannelView& v, int senderRank, size_t mappedBytes,
                        ChannelLayout* layout, const char** why);

// One slot header, copied out of the ring (kSlotInline data is not part of
// it: it is read, at the checked length, straight from the slot).
struct SlotView {
  uint64_t msgIndex, msgBytes, offset, chunkBytes;
  uint32_t kind;
  int32_t regionFd;
  uint64_t addr;
  int64_t regionPid;
  uint64_t regionSerial, regionBytes, regionOffset;
};
// Call after the slot's seq was seen published (acquire). An inline slot's
// copy leaves the direct-message fields zero.
SlotView copySlotHeader(const SlotHeader& s);

// What the receiver expects of the next slot: the receive at the front of
// its queue and how far it got.
struct SlotExpect {
  uint64_t msgIndex;  // the message that receive matches
  bool started;       // an earlier slot began it (then total is known)
  uint64_t total;
  uint64_t got;       // bytes copied so far
  uint64_t capacity;  // of the receive
  uint64_t slotBytes;
  DirectMode mode;    // how we read the peer's buffers
};

enum class SlotVerdict : uint8_t {
  kOk,
  kOutOfSequence,  // another message, or not its first chunk
  kSizeChanged,    // total differs from the message's first slot
  kTruncated,      // the message is longer than the receive
  kBadChunk,       // inline chunk not at the next offset, past the slot or the message
  kDirectRefused,  // a direct message to a ring-only receiver
  kBadKind,        // unknown kind, or a direct slot in the middle of a message
};
const char* slotVerdictText(SlotVerdict v);

SlotVerdict checkSlot(const SlotView& v, const SlotExpect& e);

}  // namespace attn::shm
