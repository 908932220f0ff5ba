// The receiving half of a shm connection: matches ring slots with posted
// receives in order and copies the bytes out (from the slot, or straight
// from the sender's buffer for a direct message).
//
// Each slot header is copied out of the ring once and checked
// (shm_header_check.h); only the copy is used, so a peer that rewrites a
// header after publishing it, or writes nonsense, gets its connection
// failed (attnRemoteError naming it) and nothing is written outside the
// posted buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>

#include "src/core/transport.h"
#include "transports/shm/shm_channel.h"
#include "transports/shm/shm_copy.h"
#include "transports/shm/shm_huge_pages.h"
#include "transports/shm/shm_peer_regions.h"

namespace attn::shm {

class Receiver {
 public:
  // peerMemory: how we read direct messages (decided at connect);
  // mapCache: how many of the peer's shareable regions we keep mapped;
  // hugePages (null: never): moves receive buffers of hugePagesMin bytes
  // and up, which CMA fills from a peer process, to huge pages.
  Receiver(Channel ch, Bell* peerBell, PeerMemory peerMemory, int peer, size_t mapCache,
           HugePageAdvisor* hugePages, size_t hugePagesMin);

  void post(void* buf, size_t capacity, Request* req);
  // Copies what has arrived. On failure returns the code, with *why set:
  // attnInvalidUsage for a truncated message, attnRemoteError when the
  // sender's buffer could not be read (it closed or died) or it broke the
  // ring's protocol.
  attnResult_t progress(bool* progressed, std::string* why);
  bool idle() const { return q_.empty(); }
  void failAll(attnResult_t code, const std::string& why);

  ChannelHeader* header() const { return ch_.hdr; }
  DirectMode mode() const { return peerMemory_.mode; }
  size_t mappedRegions() const { return regions_.mapped(); }
  // Marks our side closed; reason is a CloseReason.
  void markClosed(uint32_t reason);

 private:
  struct Op {
    uint8_t* buf;
    size_t capacity;
    Request* req;
    uint64_t index = 0;  // the message number it matches
    bool started = false;
    size_t total = 0;
    size_t got = 0;
    bool direct = false;  // a direct message, read from `slot` piece by piece
    SlotView slot{};      // its slot, as checked when it started
  };
  void consumeSlot();
  // Checks a freshly copied slot against the front receive; on success
  // the receive has started (total known).
  attnResult_t acceptSlot(Op& op, const SlotView& v, std::string* why);
  attnResult_t copyDirectPiece(Op& op, std::string* why);
  attnResult_t copyMappedPiece(Op& op, const uint8_t* src, std::string* why);

  Channel ch_;
  Bell* peerBell_;
  PeerMemory peerMemory_;
  PeerRegions regions_;
  int peer_;
  HugePageAdvisor* hugePages_;
  size_t hugePagesMin_;
  uint64_t tail_ = 0;
  uint64_t posted_ = 0;  // receives posted so far
  std::deque<Op> q_;
};

}  // namespace attn::shm
