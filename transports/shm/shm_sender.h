// The sending half of a shm connection: fills ring slots in posting order.
//
// A message below the direct threshold (or any message when the receiver
// cannot read our memory) is copied into slots, chunk by chunk, each slot
// published as soon as it is full so the receiver copies chunk i while we
// fill chunk i+1; the send completes when the last chunk is in the ring. A
// larger message takes one slot that carries only its address: the receiver
// copies it straight from our buffer (memcpy or CMA), and the send completes
// when the receiver has consumed that slot.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>

#include "src/core/transport.h"
#include "transports/shm/shm_channel.h"

namespace attn::shm {

class Sender {
 public:
  // directMin: smallest message sent by address (0: never).
  Sender(Channel ch, Bell* peerBell, size_t directMin, int peer);

  void post(const void* buf, size_t bytes, Request* req);
  // Publishes what fits in the ring and completes finished sends.
  void progress(bool* progressed);
  bool idle() const { return toSend_.empty() && inFlight_.empty(); }
  void failAll(attnResult_t code, const std::string& why);

  ChannelHeader* header() const { return ch_.hdr; }
  DirectMode mode() const { return static_cast<DirectMode>(ch_.hdr->directMode.load()); }
  // Marks our side closed; in memcpy mode waits until the receiver is out of
  // our buffers, so the caller may free them once its requests failed.
  void markClosed();

 private:
  struct Op {
    const uint8_t* buf;
    size_t bytes;
    Request* req;
    size_t sent = 0;      // inline: bytes already in the ring
    bool direct = false;
    uint64_t slot = 0;    // direct: the slot that carries the address
  };
  void publish();

  Channel ch_;
  Bell* peerBell_;
  size_t directMin_;
  int peer_;
  uint64_t head_ = 0;
  std::deque<Op> toSend_;   // not yet (fully) in the ring
  std::deque<Op> inFlight_; // direct sends the receiver has not read yet
};

}  // namespace attn::shm
