// The receiving half of a shm connection: matches ring slots with posted
// receives in order and copies the bytes out (from the slot, or straight
// from the sender's buffer for a direct message).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>

#include "src/core/transport.h"
#include "transports/shm/shm_channel.h"

namespace attn::shm {

class Receiver {
 public:
  // mode: how this side reads direct messages (decided at connect).
  Receiver(Channel ch, Bell* peerBell, DirectMode mode, int peer);

  void post(void* buf, size_t capacity, Request* req);
  // Copies what has arrived. On failure returns the code, with *why set:
  // attnInvalidUsage for a truncated message, attnRemoteError when the
  // sender's buffer could not be read (it closed or died).
  attnResult_t progress(bool* progressed, std::string* why);
  bool idle() const { return q_.empty(); }
  // True when a published slot is waiting (data or a direct message).
  bool hasPublished() const;
  void failAll(attnResult_t code, const std::string& why);

  ChannelHeader* header() const { return ch_.hdr; }
  DirectMode mode() const { return mode_; }
  // Marks our side closed; reason is a CloseReason.
  void markClosed(uint32_t reason);

 private:
  struct Op {
    uint8_t* buf;
    size_t capacity;
    Request* req;
    bool started = false;
    size_t total = 0;
    size_t got = 0;
  };
  void consumeSlot();
  attnResult_t copyDirect(Op& op, const SlotHeader& s, size_t n, std::string* why);

  Channel ch_;
  Bell* peerBell_;
  DirectMode mode_;
  int peer_;
  pid_t senderPid_;
  uint64_t tail_ = 0;
  std::deque<Op> q_;
};

}  // namespace attn::shm
