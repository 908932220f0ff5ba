#include "transports/shm/shm_sender.h"

#include <cstring>

#include "src/core/log.h"
#include "transports/shm/shm_bell.h"
#include "transports/shm/shm_copy.h"

namespace attn::shm {

Sender::Sender(Channel ch, Bell* peerBell, DirectMode mode, size_t directMin, size_t mappedMin,
               int peer, HugePageAdvisor* hugePages, WaitLimit closeWait)
    : ch_(std::move(ch)),
      peerBell_(peerBell),
      mode_(mode),
      closeWait_(closeWait),
      directMin_(directMin),
      mappedMin_(mappedMin),
      peer_(peer),
      hugePages_(hugePages) {}

void Sender::post(const void* buf, size_t bytes, Request* req) {
  Op op;
  op.buf = static_cast<const uint8_t*>(buf);
  op.bytes = bytes;
  op.req = req;
  op.index = posted_++;
  if (mappedMin_ != 0 && bytes >= mappedMin_ && findShareable(buf, bytes, &op.region) &&
      op.region.fd >= 0)
    op.direct = true;
  else
    op.direct = directMin_ != 0 && bytes >= directMin_;
  if (op.direct && op.region.fd < 0 && hugePages_ != nullptr && mode() == kDirectCma)
    hugePages_->use(buf, bytes);
  ATTN_TRACE(kLogShm, "send #%llu, %zu bytes to peer %d (%s)", (unsigned long long)op.index, bytes,
             peer_, op.region.fd >= 0 ? "mapped" : op.direct ? "direct" : "ring");
  toSend_.push_back(op);
}

void Sender::publish(SlotHeader& s) {
  // release: the fields and data above are visible to whoever sees seq.
  s.seq.store(head_ + 1, std::memory_order_release);
  ++head_;
  ringBell(peerBell_);
}

attnResult_t Sender::progress(bool* progressed, std::string* why) {
  // The tail is on a line the receiver writes: read it only when waiting
  // for a direct send to be read or for room in the ring.
  if (!inFlight_.empty() || (!toSend_.empty() && head_ - tailSeen_ >= ch_.nslots)) {
    // acquire: the receiver finished with a slot before it moved tail past it.
    const uint64_t t = ch_.hdr->tail.load(std::memory_order_acquire);
    // It only moves forward, and never past what we published.
    if (t < tailSeen_ || t > head_) {
      *why = "peer " + std::to_string(peer_) + ": protocol error in our shm ring (its tail " +
             std::to_string(t) + " is outside [" + std::to_string(tailSeen_) + ", " +
             std::to_string(head_) + "])";
      return attnRemoteError;
    }
    tailSeen_ = t;
  }
  const uint64_t tail = tailSeen_;
  while (!inFlight_.empty() && tail > inFlight_.front().slot) {
    inFlight_.front().req->complete(inFlight_.front().bytes);
    inFlight_.pop_front();
    *progressed = true;
  }
  // A receiver that closed will not read: leave the rest to fail.
  if (ch_.hdr->receiverClosed.load(std::memory_order_acquire) != kOpen) return attnSuccess;
  while (!toSend_.empty() && head_ - tail < ch_.nslots) {
    Op& op = toSend_.front();
    SlotHeader& s = ch_.slot(head_);
    s.msgIndex = op.index;
    s.msgBytes = op.bytes;
    if (op.direct) {
      s.offset = 0;
      s.chunkBytes = 0;
      s.addr = reinterpret_cast<uint64_t>(op.buf);
      s.kind = kSlotDirect;
      if (op.region.fd >= 0) {
        s.kind = kSlotMapped;
        s.regionFd = op.region.fd;
        s.regionPid = op.region.ownerPid;
        s.regionSerial = op.region.serial;
        s.regionBytes = op.region.bytes;
        s.regionOffset = reinterpret_cast<uintptr_t>(op.buf) - op.region.base;
      }
      op.slot = head_;
      publish(s);
      inFlight_.push_back(op);
      toSend_.pop_front();
    } else {
      size_t n = op.bytes - op.sent < ch_.slotBytes ? op.bytes - op.sent : ch_.slotBytes;
      if (n) std::memcpy(n <= kSlotInlineBytes ? s.small : ch_.slotData(head_), op.buf + op.sent, n);
      s.offset = op.sent;
      s.chunkBytes = n;
      s.addr = 0;
      s.kind = kSlotInline;
      op.sent += n;
      publish(s);
      if (op.sent == op.bytes) {
        op.req->complete(op.bytes);
        toSend_.pop_front();
      }
    }
    *progressed = true;
  }
  return attnSuccess;
}

void Sender::failAll(attnResult_t code, const std::string& why) {
  for (Op& op : inFlight_) op.req->fail(code, why);
  for (Op& op : toSend_) op.req->fail(code, why);
  inFlight_.clear();
  toSend_.clear();
}

bool Sender::markClosed() {
  uint32_t open = kOpen;
  ch_.hdr->senderClosed.compare_exchange_strong(open, kClosed, std::memory_order_seq_cst);
  const bool out = mode_ != kDirectMemcpy || waitWhileBusy(ch_.hdr->readerBusy, closeWait_);
  ringBell(peerBell_);
  return out;
}

}  // namespace attn::shm
