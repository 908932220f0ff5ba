#include "transports/tcp/tcp_connection.h"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "src/core/settings.h"
#include "src/core/error.h"
#include "src/core/log.h"

namespace attn::tcp {
namespace {

constexpr size_t kHdr = sizeof(ChunkHeader);
constexpr int kMaxIov = 64;
constexpr size_t kStripeAlign = 4096;

}  // namespace

TcpOptions TcpOptions::fromEnv() {
  TcpOptions o;
  // Each clamped into the table's range (settings.def).
  static_assert(settingInfo(Setting::kTcpNsocks).hi == kMaxSockets);
  static_assert(settingInfo(Setting::kTcpStripeMin).lo == int64_t(kStripeAlign));
  o.nsocks = int(settingInt<Setting::kTcpNsocks>());
  o.stripeMin = size_t(settingInt<Setting::kTcpStripeMin>());
  o.sockBuf = int(settingInt<Setting::kTcpSockbuf>());
  return o;
}

TcpConnection::TcpConnection(int peer, std::vector<int> fds, const TcpOptions& opt,
                             std::string peerName, std::shared_ptr<TcpRegistry> registry)
    : Connection(peer), opt_(opt), peerName_(std::move(peerName)), registry_(std::move(registry)) {
  socks_.resize(fds.size());
  for (size_t i = 0; i < fds.size(); ++i) {
    socks_[i].fd = fds[i];
    socks_[i].index = uint32_t(i);
  }
  std::lock_guard<std::mutex> g(registry_->mu);
  registry_->conns.push_back(this);
}

TcpConnection::~TcpConnection() {
  {
    std::lock_guard<std::mutex> g(registry_->mu);
    auto& v = registry_->conns;
    v.erase(std::remove(v.begin(), v.end(), this), v.end());
  }
  close();
}

// ---------------------------------------------------------------------------
// Posting

attnResult_t TcpConnection::postSend(const void* buf, size_t bytes, Request* req) {
  if (broken_) {
    req->fail(attnRemoteError, brokenWhy_);
    return setError(attnRemoteError, "%s", brokenWhy_.c_str());
  }
  const uint64_t seq = sendSeq_++;
  sendOps_.push_back(SendOp{req, bytes, 0});
  SendOp* op = &sendOps_.back();
  // Large messages: one stripe per socket (at most), page-aligned.
  const size_t k = socks_.size();
  size_t nstripes = 1;
  if (bytes > opt_.stripeMin) nstripes = std::min(k, (bytes + opt_.stripeMin - 1) / opt_.stripeMin);
  size_t stripe = (bytes + nstripes - 1) / nstripes;
  stripe = (stripe + kStripeAlign - 1) / kStripeAlign * kStripeAlign;
  const char* p = static_cast<const char*>(buf);
  size_t off = 0, i = 0;
  do {
    size_t len = std::min(stripe, bytes - off);
    Sock& s = socks_[(seq + i) % k];
    s.sendq.push_back(Chunk{ChunkHeader{seq, bytes, off, len}, p + off, 0, op});
    ++op->chunksLeft;
    off += len;
    ++i;
  } while (off < bytes);
  ATTN_TRACE(kLogNet, "tcp: send seq %lu (%zu bytes, %zu chunks) to %s", (unsigned long)seq,
             bytes, op->chunksLeft, peerName_.c_str());
  publishPollFds();
  return attnSuccess;
}

attnResult_t TcpConnection::postRecv(void* buf, size_t capacity, Request* req) {
  if (broken_) {
    req->fail(attnRemoteError, brokenWhy_);
    return setError(attnRemoteError, "%s", brokenWhy_.c_str());
  }
  recvOps_.emplace_back(req, static_cast<char*>(buf), capacity);
  publishPollFds();
  return attnSuccess;
}

bool TcpConnection::idle() const { return sendOps_.empty() && recvOps_.empty(); }

// ---------------------------------------------------------------------------
// Progress

attnResult_t TcpConnection::progress(bool* progressed) {
  const attnResult_t r = progressLocked(progressed);
  publishPollFds();
  return r;
}

attnResult_t TcpConnection::progressLocked(bool* progressed) {
  *progressed = false;
  if (broken_) return setError(brokenCode_, "%s", brokenWhy_.c_str());
  for (Sock& s : socks_) {
    ATTN_CHECK(progressSend(s, progressed));
    // Nothing posted: leave incoming bytes in the kernel (no syscall).
    if (!recvOps_.empty()) ATTN_CHECK(progressRecv(s, progressed));
  }
  popFinished();
  if (peerGone() && !idle())
    return breakLink(attnRemoteError, peerName_ + ": connection closed by peer");
  return attnSuccess;
}

attnResult_t TcpConnection::progressSend(Sock& s, bool* progressed) {
  while (!s.sendq.empty()) {
    iovec iov[kMaxIov];
    int n = 0;
    size_t want = 0;
    for (auto it = s.sendq.begin(); it != s.sendq.end() && n + 2 <= kMaxIov; ++it) {
      if (it->sent < kHdr)
        iov[n++] = {reinterpret_cast<char*>(&it->hdr) + it->sent, kHdr - it->sent};
      size_t dataSent = it->sent > kHdr ? it->sent - kHdr : 0;
      if (it->hdr.len > dataSent)
        iov[n++] = {const_cast<char*>(it->data) + dataSent, it->hdr.len - dataSent};
    }
    for (int i = 0; i < n; ++i) want += iov[i].iov_len;
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = size_t(n);
    ssize_t r = sendmsg(s.fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return attnSuccess;
      return breakLink(attnRemoteError, peerName_ + ": send failed: " + strerror(errno));
    }
    *progressed = true;
    size_t left = size_t(r);
    while (!s.sendq.empty()) {
      Chunk& c = s.sendq.front();
      size_t take = std::min(left, kHdr + c.hdr.len - c.sent);
      c.sent += take;
      left -= take;
      if (c.sent < kHdr + c.hdr.len) break;
      if (--c.op->chunksLeft == 0) c.op->req->complete(c.op->bytes);
      s.sendq.pop_front();
    }
    if (size_t(r) < want) return attnSuccess;  // socket buffer full
  }
  return attnSuccess;
}

attnResult_t TcpConnection::progressRecv(Sock& s, bool* progressed) {
  while (!s.eof && s.fd >= 0) {
    if (!s.inPayload) {
      if (s.hdrGot < kHdr) {
        ssize_t r = recv(s.fd, reinterpret_cast<char*>(&s.hdr) + s.hdrGot, kHdr - s.hdrGot,
                         MSG_DONTWAIT);
        if (r == 0) {
          if (s.hdrGot > 0)
            return breakLink(attnRemoteError, peerName_ + ": connection closed mid-message");
          s.eof = true;  // clean end of this socket's stream
          return attnSuccess;
        }
        if (r < 0) {
          if (errno == EINTR) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) return attnSuccess;
          return breakLink(attnRemoteError, peerName_ + ": receive failed: " + strerror(errno));
        }
        *progressed = true;
        s.hdrGot += size_t(r);
        if (s.hdrGot < kHdr) continue;
        ATTN_CHECK(admitHeader(s));
      }
      bool parked = false;
      ATTN_CHECK(startChunk(s, &parked));
      if (parked) return attnSuccess;  // its receive is not posted yet
      continue;
    }
    RecvOp* target = nullptr;
    ATTN_CHECK(payloadTarget(s, &target));
    RecvOp& op = *target;
    // offset + len <= total <= capacity (MessageClaims::claim).
    size_t want = s.hdr.len - s.payloadGot;
    ssize_t r = recv(s.fd, op.buf + s.hdr.offset + s.payloadGot, want, MSG_DONTWAIT);
    if (r == 0) return breakLink(attnRemoteError, peerName_ + ": connection closed mid-message");
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return attnSuccess;
      return breakLink(attnRemoteError, peerName_ + ": receive failed: " + strerror(errno));
    }
    *progressed = true;
    s.payloadGot += size_t(r);
    op.got += size_t(r);
    if (s.payloadGot == s.hdr.len) {
      s.inPayload = false;
      s.hdrGot = 0;
      // The claims are disjoint: all of the message arrived, no chunk of it
      // is still being read on another socket.
      if (op.got == op.claims.total()) finishRecv(op);
    }
    if (size_t(r) < want) return attnSuccess;  // drained for now
  }
  return attnSuccess;
}

attnResult_t TcpConnection::admitHeader(Sock& s) {
  const ChunkVerdict v = s.window.admit(s.hdr.seq, s.index, uint32_t(socks_.size()));
  return v == ChunkVerdict::kOk ? attnSuccess : badChunk(s.hdr, v);
}

attnResult_t TcpConnection::badChunk(const ChunkHeader& h, ChunkVerdict v) {
  char why[256];
  snprintf(why, sizeof(why),
           ": protocol error (bad chunk: %s; seq %lu total %lu offset %lu len %lu)",
           chunkVerdictText(v), (unsigned long)h.seq, (unsigned long)h.total,
           (unsigned long)h.offset, (unsigned long)h.len);
  return breakLink(attnRemoteError, peerName_ + why);
}

attnResult_t TcpConnection::startChunk(Sock& s, bool* parked) {
  const ChunkHeader& h = s.hdr;
  char why[256];
  if (h.seq < recvFrontSeq_) {
    snprintf(why, sizeof(why), ": protocol error (chunk for finished message %lu)",
             (unsigned long)h.seq);
    return breakLink(attnRemoteError, peerName_ + why);
  }
  if (h.seq - recvFrontSeq_ >= recvOps_.size()) {
    *parked = true;
    return attnSuccess;
  }
  RecvOp& op = recvOps_[h.seq - recvFrontSeq_];
  if (op.done) {
    snprintf(why, sizeof(why), ": protocol error (chunk for finished message %lu)",
             (unsigned long)h.seq);
    return breakLink(attnRemoteError, peerName_ + why);
  }
  const ChunkVerdict v = op.claims.claim(h, op.capacity, uint32_t(socks_.size()));
  if (v == ChunkVerdict::kTruncated) {
    snprintf(why, sizeof(why), ": message of %lu bytes truncated (receive posted %zu)",
             (unsigned long)h.total, op.capacity);
    std::string msg = peerName_ + why;
    op.req->fail(attnInvalidUsage, msg);
    op.done = true;
    return breakLink(attnInvalidUsage, msg);
  }
  if (v != ChunkVerdict::kOk) return badChunk(h, v);
  if (h.len == 0) {  // the one chunk of an empty message
    s.hdrGot = 0;
    finishRecv(op);
  } else {
    s.inPayload = true;
    s.payloadGot = 0;
  }
  return attnSuccess;
}

attnResult_t TcpConnection::payloadTarget(Sock& s, RecvOp** op) {
  const uint64_t seq = s.hdr.seq;
  if (seq >= recvFrontSeq_ && seq - recvFrontSeq_ < recvOps_.size()) {
    *op = &recvOps_[seq - recvFrontSeq_];
    if (!(*op)->done) return attnSuccess;
  }
  char why[160];
  snprintf(why, sizeof(why), ": protocol error (payload for message %lu, which is no longer queued)",
           (unsigned long)seq);
  return breakLink(attnRemoteError, peerName_ + why);
}

void TcpConnection::finishRecv(RecvOp& op) {
  op.done = true;
  op.req->complete(op.claims.total());
  ATTN_TRACE(kLogNet, "tcp: received %lu bytes from %s", (unsigned long)op.claims.total(),
             peerName_.c_str());
}

void TcpConnection::popFinished() {
  while (!recvOps_.empty() && recvOps_.front().done) {
    recvOps_.pop_front();
    ++recvFrontSeq_;
  }
  while (!sendOps_.empty() && sendOps_.front().chunksLeft == 0) sendOps_.pop_front();
}

// The peer closes all its sockets at once. Once each has delivered its last
// byte (or holds a chunk of a message not yet posted, which nothing posted
// can wait behind), the queued operations can never complete.
bool TcpConnection::peerGone() const {
  bool anyEof = false;
  for (const Sock& s : socks_) {
    if (!s.eof && !s.parked()) return false;
    anyEof |= s.eof;
  }
  return anyEof;
}

// ---------------------------------------------------------------------------
// Failure and close

void TcpConnection::shutDown(attnResult_t code, const std::string& why) {
  if (!broken_) {
    broken_ = true;
    brokenCode_ = code;
    brokenWhy_ = why;
  }
  for (SendOp& op : sendOps_)
    if (op.chunksLeft > 0) op.req->fail(attnRemoteError, why);
  for (RecvOp& op : recvOps_)
    if (!op.done) op.req->fail(attnRemoteError, why);
  sendOps_.clear();
  recvOps_.clear();
  publishPollFds();  // before the descriptors close: a sleeper stops polling them
  for (Sock& s : socks_) {
    s.sendq.clear();
    if (s.fd >= 0) {
      ::shutdown(s.fd, SHUT_RDWR);  // the peer sees the end at once
      ::close(s.fd);
      s.fd = -1;
    }
  }
}

attnResult_t TcpConnection::breakLink(attnResult_t code, const std::string& why) {
  shutDown(code, why);
  return setError(code, "%s", why.c_str());
}

void TcpConnection::close() { shutDown(attnRemoteError, peerName_ + ": connection closed locally"); }

void TcpConnection::publishPollFds() {
  std::vector<pollfd>& fds = scratch_;  // the previous snapshot's storage: no allocation
  fds.clear();
  if (!broken_)
    for (const Sock& s : socks_) {
      if (s.fd < 0) continue;
      short ev = 0;
      if (!s.sendq.empty()) ev |= POLLOUT;
      if (!recvOps_.empty() && !s.eof && !s.parked()) ev |= POLLIN;
      if (ev) fds.push_back(pollfd{s.fd, ev, 0});
    }
  std::lock_guard<std::mutex> g(pollMu_);
  pollFds_.swap(fds);
}

void TcpConnection::addPollFds(std::vector<pollfd>* out) const {
  std::lock_guard<std::mutex> g(pollMu_);
  out->insert(out->end(), pollFds_.begin(), pollFds_.end());
}

}  // namespace attn::tcp
