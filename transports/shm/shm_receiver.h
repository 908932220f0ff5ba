// The receiving half of a shm connection: matches ring slots with posted
// receives in order and copies the bytes out (from the slot, or straight
// from the sender's buffer for a direct message).
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
  // sender's buffer could not be read (it closed or died).
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
  };
  void consumeSlot();
  attnResult_t copyDirectPiece(Op& op, const SlotHeader& s, std::string* why);
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
