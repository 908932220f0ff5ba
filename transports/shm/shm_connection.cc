#include "transports/shm/shm_connection.h"

#include "src/core/error.h"
#include "src/core/log.h"

namespace attn::shm {

ShmConnection::ShmConnection(int peer, Parts p)
    : Connection(peer),
      peerBellSeg_(std::move(p.peerBellSeg)),
      myBell_(std::move(p.myBell)),
      peerPid_(p.peerPid),
      sender_(std::move(p.out), static_cast<Bell*>(peerBellSeg_->base()), p.outMode, p.directMin,
              p.mappedMin, peer, p.hugePages, p.closeWait),
      receiver_(std::move(p.in), static_cast<Bell*>(peerBellSeg_->base()),
                PeerMemory{p.inMode, p.peerPid}, peer, p.mapCache, p.hugePages,
                p.hugePagesMin) {
  if (!p.sameProcess) watch_.watch(p.peerPid, p.livenessMs);
}

// Tells the peer we are gone. Requests still queued here are abandoned, not
// failed: their owner may already have freed them.
ShmConnection::~ShmConnection() {
  if (broken_) return;
  markClosed(kClosed);
}

void ShmConnection::markClosed(uint32_t reason) {
  receiver_.markClosed(reason);
  if (!sender_.markClosed())
    ATTN_WARN(kLogShm,
              "peer %d still holds its reader's busy flag on our channel at the communicator's "
              "deadline (or abort); giving up waiting for it",
              peer());
}

attnResult_t ShmConnection::failPost(Request* req) {
  req->fail(brokenCode_, brokenWhy_);
  return setError(brokenCode_, "%s", brokenWhy_.c_str());
}

attnResult_t ShmConnection::postSend(const void* buf, size_t bytes, Request* req) {
  if (broken_) return failPost(req);
  sender_.post(buf, bytes, req);
  return attnSuccess;
}

attnResult_t ShmConnection::postRecv(void* buf, size_t capacity, Request* req) {
  if (broken_) return failPost(req);
  receiver_.post(buf, capacity, req);
  return attnSuccess;
}

attnResult_t ShmConnection::progress(bool* progressed) {
  *progressed = false;
  if (broken_) return setError(brokenCode_, "%s", brokenWhy_.c_str());
  myBell_->observe();  // before looking at shared state: see LocalBell
  // Read the peer's state before moving data: whatever it published before
  // it closed or died is then visible below and still gets delivered.
  const PeerState peer = peerState();
  std::string why;
  attnResult_t r = sender_.progress(progressed, &why);
  if (r == attnSuccess) r = receiver_.progress(progressed, &why);
  if (r != attnSuccess) {
    breakLink(r, why, r == attnInvalidUsage ? kTruncated : kClosed);
    return setError(r, "%s", why.c_str());
  }
  if (*progressed) {
    myBell_->disarm();
    return attnSuccess;
  }
  if (peer == PeerState::kOk || idle()) return attnSuccess;
  return failFor(peer);
}

ShmConnection::PeerState ShmConnection::peerState() {
  const uint32_t outReason = sender_.header()->receiverClosed.load(std::memory_order_acquire);
  if (outReason == kTruncated) return PeerState::kTruncated;
  if (outReason != kOpen ||
      receiver_.header()->senderClosed.load(std::memory_order_acquire) != kOpen)
    return PeerState::kClosed;
  if (!watch_.alive()) return PeerState::kDead;  // rate-limited, cheap
  return PeerState::kOk;
}

attnResult_t ShmConnection::failFor(PeerState state) {
  const std::string p = "peer " + std::to_string(peer());
  attnResult_t code = attnRemoteError;
  std::string why;
  if (state == PeerState::kTruncated) {
    const ChannelHeader* out = sender_.header();
    code = attnInvalidUsage;
    why = p + " refused a message of " + std::to_string(out->truncMsgBytes) +
          " bytes: its receive holds " + std::to_string(out->truncCapacity) + " bytes (truncated)";
  } else if (state == PeerState::kClosed) {
    why = p + " closed the connection";
  } else {
    why = p + " (pid " + std::to_string(peerPid_) + ") died";
  }
  breakLink(code, why, kClosed);
  return setError(code, "%s", why.c_str());
}

void ShmConnection::breakLink(attnResult_t code, const std::string& why, uint32_t reason) {
  if (broken_) return;
  broken_ = true;
  brokenCode_ = code;
  brokenWhy_ = why;
  // Tell the peer first; markClosed also waits until a same-process reader
  // is out of our send buffers, before their owners learn they failed.
  markClosed(reason);
  sender_.failAll(code, why);
  receiver_.failAll(code, why);
  ATTN_INFO(kLogShm, "connection to peer %d broken: %s", peer(), why.c_str());
}

void ShmConnection::close() {
  breakLink(attnRemoteError, "connection to peer " + std::to_string(peer()) + " closed", kClosed);
}

}  // namespace attn::shm
