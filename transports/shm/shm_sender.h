// The sending half of a shm connection: fills ring slots in posting order.
//
// A message below the direct threshold (or any message when the receiver
// cannot reach our memory) is copied into slots, chunk by chunk, each slot
// published as soon as it is full so the receiver copies chunk i while we
// fill chunk i+1; the send completes when the last chunk is in the ring.
//
// A larger message takes one slot that carries only its address: the
// receiver copies it once, straight from our buffer (memcpy or CMA), and
// the send completes when the receiver has consumed that slot. A message
// inside a shareable region (attnMemAlloc) also names the region, and a
// receiver in another process maps it once and copies with memcpy rather
// than CMA (shm_peer_regions.h). (We tried
// letting the sender write into an already posted receive instead: no gain
// on small messages, and slower large ring all-gathers, because a late rank
// then had two copies to do in one step.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>

#include "src/core/shareable_memory.h"
#include "src/core/transport.h"
#include "transports/shm/shm_channel.h"
#include "transports/shm/shm_copy.h"
#include "transports/shm/shm_huge_pages.h"

namespace attn::shm {

class Sender {
 public:
  // mode: how the receiver reads our direct messages, as it said at connect
  // (read once: the header's copy is the peer's to scribble on);
  // directMin: smallest message sent by address (0: never); mappedMin: the
  // same for messages inside a shareable region (attnMemAlloc), which the
  // receiver maps instead (0: never); hugePages: moves the buffers the
  // receiver reads with CMA to huge pages (null: leave them); closeWait:
  // how long markClosed waits for a same-process reader.
  Sender(Channel ch, Bell* peerBell, DirectMode mode, size_t directMin, size_t mappedMin, int peer,
         HugePageAdvisor* hugePages, WaitLimit closeWait);

  void post(const void* buf, size_t bytes, Request* req);
  // Publishes what fits in the ring and completes finished sends. Fails
  // (attnRemoteError, *why set) when the receiver's tail is impossible.
  attnResult_t progress(bool* progressed, std::string* why);
  bool idle() const { return toSend_.empty() && inFlight_.empty(); }
  void failAll(attnResult_t code, const std::string& why);

  ChannelHeader* header() const { return ch_.hdr; }
  // How the receiver reads our direct messages (it decided at connect).
  size_t mappedMin() const { return mappedMin_; }
  DirectMode mode() const { return mode_; }
  // Marks our side closed and waits until a receiver thread is out of our
  // send buffers, so their owners may free them once their requests failed.
  // False when the reader was still busy at the wait's limit.
  bool markClosed();

 private:
  struct Op {
    const uint8_t* buf = nullptr;
    size_t bytes = 0;
    Request* req = nullptr;
    uint64_t index = 0;   // message number on this channel
    size_t sent = 0;      // inline: bytes already in the ring
    bool direct = false;
    uint64_t slot = 0;    // direct: the slot that carries the address
    ShareableRegion region;  // fd >= 0: direct, from this region
  };
  void publish(SlotHeader& s);

  Channel ch_;
  Bell* peerBell_;
  DirectMode mode_;
  WaitLimit closeWait_;
  size_t directMin_;
  size_t mappedMin_;
  int peer_;
  HugePageAdvisor* hugePages_;
  uint64_t head_ = 0;
  uint64_t tailSeen_ = 0;    // the receiver's tail when last read
  uint64_t posted_ = 0;      // messages posted so far
  std::deque<Op> toSend_;    // not yet (fully) in the ring
  std::deque<Op> inFlight_;  // direct sends the receiver has not read yet
};

}  // namespace attn::shm
