#include "transports/shm/shm_receiver.h"

#include <cerrno>
#include <cstring>

#include "src/core/error.h"
#include "src/core/log.h"
#include "transports/shm/shm_bell.h"
#include "transports/shm/shm_config.h"
#include "transports/shm/shm_process.h"

namespace attn::shm {

Receiver::Receiver(Channel ch, Bell* peerBell, DirectMode mode, int peer)
    : ch_(std::move(ch)),
      peerBell_(peerBell),
      mode_(mode),
      peer_(peer),
      senderPid_(static_cast<pid_t>(ch_.hdr->senderPid)) {}

void Receiver::post(void* buf, size_t capacity, Request* req) {
  q_.push_back(Op{static_cast<uint8_t*>(buf), capacity, req});
}

bool Receiver::hasPublished() const {
  return ch_.hdr->head.load(std::memory_order_acquire) > tail_;
}

void Receiver::consumeSlot() {
  ++tail_;
  // release: our reads of the slot happen before the sender reuses it.
  ch_.hdr->tail.store(tail_, std::memory_order_release);
  ringBell(peerBell_);
}

attnResult_t Receiver::copyDirect(Op& op, const SlotHeader& s, size_t n, std::string* why) {
  uint8_t* dst = op.buf + op.got;
  const uint64_t src = s.addr + op.got;
  if (mode_ == kDirectMemcpy) {
    // Dekker pair with Sender::markClosed: raise busy, then look at closed.
    ch_.hdr->readerBusy.store(1, std::memory_order_seq_cst);
    if (ch_.hdr->senderClosed.load(std::memory_order_seq_cst) != kOpen) {
      ch_.hdr->readerBusy.store(0, std::memory_order_release);
      *why = "peer " + std::to_string(peer_) + " closed the connection during a transfer";
      return attnRemoteError;
    }
    std::memcpy(dst, reinterpret_cast<const void*>(src), n);
    ch_.hdr->readerBusy.store(0, std::memory_order_release);
    return attnSuccess;
  }
  if (mode_ == kDirectCma) {
    // A closed sender may have freed the buffer: do not read garbage.
    if (ch_.hdr->senderClosed.load(std::memory_order_acquire) != kOpen) {
      *why = "peer " + std::to_string(peer_) + " closed the connection during a transfer";
      return attnRemoteError;
    }
    int err = cmaRead(senderPid_, dst, src, n);
    if (err == 0) return attnSuccess;
    if (err == ESRCH)
      *why = "peer " + std::to_string(peer_) + " (pid " + std::to_string(senderPid_) + ") died";
    else
      *why = "reading " + std::to_string(n) + " bytes from peer " + std::to_string(peer_) +
             " (pid " + std::to_string(senderPid_) + ") with process_vm_readv failed: " +
             strerror(err);
    return attnRemoteError;
  }
  *why = "peer " + std::to_string(peer_) + " sent a direct message to a ring-only receiver";
  return attnInternalError;
}

attnResult_t Receiver::progress(bool* progressed, std::string* why) {
  const uint64_t head = ch_.hdr->head.load(std::memory_order_acquire);
  while (!q_.empty() && tail_ < head) {
    Op& op = q_.front();
    const SlotHeader& s = ch_.slot(tail_);
    if (!op.started) {
      if (s.offset != 0) {
        *why = "shm ring from peer " + std::to_string(peer_) + " out of sequence";
        return attnInternalError;
      }
      if (s.msgBytes > op.capacity) {
        *why = "peer " + std::to_string(peer_) + " sent a message of " +
               std::to_string(s.msgBytes) + " bytes to a receive of " +
               std::to_string(op.capacity) + " bytes (truncated)";
        // Details for the sender; published by markClosed(kTruncated).
        ch_.hdr->truncMsgBytes = s.msgBytes;
        ch_.hdr->truncCapacity = op.capacity;
        return attnInvalidUsage;
      }
      op.started = true;
      op.total = s.msgBytes;
    }
    if (s.kind == kSlotInline) {
      if (s.offset != op.got || s.chunkBytes > ch_.slotBytes || s.chunkBytes > op.total - op.got) {
        *why = "shm ring from peer " + std::to_string(peer_) + " holds a malformed chunk";
        return attnInternalError;
      }
      if (s.chunkBytes) std::memcpy(op.buf + op.got, ch_.slotData(tail_), s.chunkBytes);
      op.got += s.chunkBytes;
      consumeSlot();
    } else {
      // One piece per call keeps progress() short on huge messages.
      size_t n = op.total - op.got < kDirectPieceBytes ? op.total - op.got : kDirectPieceBytes;
      attnResult_t r = copyDirect(op, s, n, why);
      if (r != attnSuccess) return r;
      op.got += n;
      *progressed = true;
      if (op.got < op.total) return attnSuccess;
      consumeSlot();  // also tells the sender its buffer is free
    }
    *progressed = true;
    if (op.got == op.total) {
      ATTN_TRACE(kLogShm, "received %zu bytes from peer %d", op.total, peer_);
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
