#include "transports/shm/shm_receiver.h"

#include <cerrno>
#include <cstring>

#include "src/core/error.h"
#include "src/core/log.h"
#include "transports/shm/shm_bell.h"
#include "transports/shm/shm_config.h"

namespace attn::shm {

Receiver::Receiver(Channel ch, Bell* peerBell, PeerMemory peerMemory, int peer, size_t mapCache,
                   HugePageAdvisor* hugePages, size_t hugePagesMin)
    : ch_(std::move(ch)),
      peerBell_(peerBell),
      peerMemory_(peerMemory),
      regions_(peerMemory.pid, peer, mapCache),
      peer_(peer),
      hugePages_(hugePages),
      hugePagesMin_(hugePagesMin) {}

void Receiver::post(void* buf, size_t capacity, Request* req) {
  Op op{static_cast<uint8_t*>(buf), capacity, req};
  op.index = posted_++;
  if (hugePages_ != nullptr && peerMemory_.mode == kDirectCma && capacity >= hugePagesMin_)
    hugePages_->use(buf, capacity);
  q_.push_back(op);
}

void Receiver::consumeSlot() {
  ++tail_;
  // release: our reads of the slot happen before the sender reuses it.
  ch_.hdr->tail.store(tail_, std::memory_order_release);
  ringBell(peerBell_);
}

// One piece per call keeps progress() short on huge messages.
attnResult_t Receiver::copyDirectPiece(Op& op, std::string* why) {
  size_t n = op.total - op.got < kDirectPieceBytes ? op.total - op.got : kDirectPieceBytes;
  ChannelHeader* h = ch_.hdr;
  int err = guardedCopy(peerMemory_, op.buf + op.got, op.slot.addr + op.got, n, h->readerBusy,
                        h->senderClosed);
  if (err != 0) {
    const std::string p = "peer " + std::to_string(peer_);
    *why = err == ECANCELED ? p + " closed the connection during a transfer"
           : err == ESRCH   ? p + " (pid " + std::to_string(peerMemory_.pid) + ") died"
                            : "reading " + std::to_string(n) + " bytes from " + p +
                                " with process_vm_readv failed: " + strerror(err);
    return attnRemoteError;
  }
  op.got += n;
  return attnSuccess;
}

// The region stays mapped here whatever the sender does, so no busy flag:
// only a close during the copy makes the bytes suspect.
attnResult_t Receiver::copyMappedPiece(Op& op, const uint8_t* src, std::string* why) {
  size_t n = op.total - op.got < kDirectPieceBytes ? op.total - op.got : kDirectPieceBytes;
  std::memcpy(op.buf + op.got, src + op.got, n);
  if (ch_.hdr->senderClosed.load(std::memory_order_acquire) != kOpen) {
    *why = "peer " + std::to_string(peer_) + " closed the connection during a transfer";
    return attnRemoteError;
  }
  op.got += n;
  return attnSuccess;
}

attnResult_t Receiver::acceptSlot(Op& op, const SlotView& v, std::string* why) {
  const SlotExpect e{op.index, op.started, op.total, op.got, op.capacity, ch_.slotBytes,
                     peerMemory_.mode};
  const SlotVerdict verdict = checkSlot(v, e);
  if (verdict == SlotVerdict::kTruncated) {
    *why = "peer " + std::to_string(peer_) + " sent a message of " + std::to_string(v.msgBytes) +
           " bytes to a receive of " + std::to_string(op.capacity) + " bytes (truncated)";
    // Details for the sender; published by markClosed(kTruncated).
    ch_.hdr->truncMsgBytes = v.msgBytes;
    ch_.hdr->truncCapacity = op.capacity;
    return attnInvalidUsage;
  }
  if (verdict != SlotVerdict::kOk) {
    char detail[192];
    snprintf(detail, sizeof(detail),
             " (message #%llu, slot %llu: kind %u, message #%llu of %llu bytes, chunk %llu+%llu)",
             (unsigned long long)op.index, (unsigned long long)tail_, v.kind,
             (unsigned long long)v.msgIndex, (unsigned long long)v.msgBytes,
             (unsigned long long)v.offset, (unsigned long long)v.chunkBytes);
    *why = "peer " + std::to_string(peer_) + ": protocol error in its shm ring: " +
           slotVerdictText(verdict) + detail;
    return attnRemoteError;
  }
  op.started = true;
  op.total = v.msgBytes;  // <= capacity: checked
  return attnSuccess;
}

attnResult_t Receiver::progress(bool* progressed, std::string* why) {
  while (!q_.empty()) {
    Op& op = q_.front();
    const SlotHeader& s = ch_.slot(tail_);
    // acquire: pairs with the sender's release of seq (Sender::publish).
    // A direct message under way holds its slot: nothing there is read again.
    if (!op.direct && s.seq.load(std::memory_order_acquire) != tail_ + 1) break;
    if (!op.direct) {
      const SlotView v = copySlotHeader(s);
      ATTN_CHECK(acceptSlot(op, v, why));
      if (v.kind == kSlotInline) {
        // chunkBytes <= slotBytes (the checked layout's) and <= what the receive has left.
        if (v.chunkBytes)
          std::memcpy(op.buf + op.got,
                      v.chunkBytes <= kSlotInlineBytes ? s.small : ch_.slotData(tail_),
                      v.chunkBytes);
        op.got += v.chunkBytes;
        consumeSlot();
      } else {
        op.direct = true;
        op.slot = v;  // every piece reads from where the checked copy says
      }
    }
    if (op.direct) {
      const uint8_t* mapped = op.slot.kind == kSlotMapped && peerMemory_.mode == kDirectCma
                                  ? regions_.lookup(op.slot)
                                  : nullptr;
      attnResult_t r = mapped ? copyMappedPiece(op, mapped, why) : copyDirectPiece(op, why);
      if (r != attnSuccess) return r;
      *progressed = true;
      if (op.got < op.total) return attnSuccess;
      consumeSlot();  // also tells the sender its buffer is free
    }
    *progressed = true;
    if (op.got == op.total) {
      ATTN_TRACE(kLogShm, "received #%llu, %zu bytes from peer %d", (unsigned long long)op.index,
                 op.total, peer_);
      op.req->complete(op.total);
      q_.pop_front();
    }
  }
  return attnSuccess;
}

void Receiver::failAll(attnResult_t code, const std::string& why) {
  for (Op& op : q_) op.req->fail(code, why);
  q_.clear();
}

void Receiver::markClosed(uint32_t reason) {
  uint32_t open = kOpen;
  ch_.hdr->receiverClosed.compare_exchange_strong(open, reason, std::memory_order_seq_cst);
  ringBell(peerBell_);
}

}  // namespace attn::shm
