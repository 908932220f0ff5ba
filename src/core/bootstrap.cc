// One rank's side of the bootstrap (see bootstrap_socket.h): join the root,
// then tagged send/recv between ranks over authenticated sockets, with
// allGather (ring) and barrier built on them.
#include "src/core/bootstrap_socket.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <list>
#include <thread>

#include "src/core/bootstrap_wire.h"
#include "src/core/error.h"
#include "src/core/log.h"

namespace attn {

using namespace boot;

attnResult_t Bootstrap::create(const attnUniqueId& id, int rank, int nranks, int timeoutMs,
                               const std::atomic<bool>* abortFlag,
                               std::unique_ptr<Bootstrap>* out) {
  ATTN_REQUIRE(out != nullptr, "bootstrap: NULL output");
  ATTN_REQUIRE(nranks > 0 && rank >= 0 && rank < nranks,
               "bootstrap: rank %d is not in [0, %d)", rank, nranks);
  UniqueIdData data;
  ATTN_CHECK(decodeUniqueId(id, &data));
  std::unique_ptr<SocketBootstrap> b;
  ATTN_CHECK(SocketBootstrap::create(data, rank, nranks, timeoutMs, abortFlag, &b));
  *out = std::move(b);
  return attnSuccess;
}

attnResult_t SocketBootstrap::create(const UniqueIdData& id, int rank, int nranks, int timeoutMs,
                                     const std::atomic<bool>* abortFlag,
                                     std::unique_ptr<SocketBootstrap>* out) {
  std::unique_ptr<SocketBootstrap> b(new SocketBootstrap(rank, nranks, timeoutMs, abortFlag));
  ATTN_CHECK(b->start(id));
  *out = std::move(b);
  return attnSuccess;
}

SocketBootstrap::SocketBootstrap(int rank, int nranks, int timeoutMs,
                                 const std::atomic<bool>* abortFlag)
    : rank_(rank), nranks_(nranks), timeoutMs_(timeoutMs), abortFlag_(abortFlag) {}

SocketBootstrap::~SocketBootstrap() {
  close();
  for (int& fd : outFd_) closeSocket(&fd);
  closeSocket(&listenFd_);
  closeSocket(&wakeFd_);
}

void SocketBootstrap::close() {
  closed_.store(true);
  if (wakeFd_ >= 0) {
    uint64_t one = 1;
    (void)!::write(wakeFd_, &one, sizeof(one));
  }
  {
    std::lock_guard<std::mutex> g(mu_);
    cv_.notify_all();
  }
  // Joined once, by whichever thread closes first; never by rx_ itself.
  if (rx_.joinable() && rx_.get_id() != std::this_thread::get_id())
    std::call_once(joinOnce_, [this] { rx_.join(); });
}

attnResult_t SocketBootstrap::start(const UniqueIdData& id) {
  std::memcpy(secret_, id.secret, 16);
  nonce_ = id.nonce;
  SocketAddress root;
  if (!deserializeAddress(id.address, id.addressLen, &root))
    return setError(attnInvalidArgument, "bootstrap: unique id holds no valid root address");

  SocketAddress local;
  std::string ifname;
  ATTN_CHECK(findInterface(&root, &ifname, &local));
  ATTN_CHECK(socketListen(local, false, &listenFd_, &listenAddr_));
  wakeFd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wakeFd_ < 0) return setError(attnSystemError, "bootstrap: eventfd: %s", strerror(errno));
  outFd_.assign(nranks_, -1);
  outMu_ = std::make_unique<std::mutex[]>(nranks_);
  peerGone_.assign(nranks_, false);
  try {
    rx_ = std::thread([this] { rxLoop(); });
  } catch (const std::exception& e) {
    return setError(attnSystemError, "bootstrap: cannot start receive thread: %s", e.what());
  }
  ATTN_INFO(kLogBoot, "bootstrap rank %d/%d listening on %s (%s), root %s", rank_, nranks_,
            formatAddress(listenAddr_).c_str(), ifname.c_str(), formatAddress(root).c_str());
  return joinRoot(root);
}

// One attempt: dial the root, send the hello, wait for the reply.
attnResult_t SocketBootstrap::helloRoot(const SocketAddress& root, const Deadline& deadline,
                                        const std::string& what, std::vector<uint8_t>* reply) {
  int fd = -1;
  ATTN_CHECK(socketConnect(root, deadline, cancel(), what.c_str(), &fd));
  RootHello h{};
  h.magic = kRootHelloMagic;
  h.version = kWireVersion;
  std::memcpy(h.secret, secret_, 16);
  h.nonce = nonce_;
  h.rank = rank_;
  h.nranks = nranks_;
  h.timeoutMs = timeoutMs_ > 0 ? timeoutMs_ : 0;
  h.addrLen = serializeAddress(listenAddr_, h.addr);
  attnResult_t rc = sendFrame(fd, &h, sizeof(h), deadline, cancel(), what.c_str());
  if (rc == attnSuccess) {
    std::string waitWhat = what + ": waiting for all " + std::to_string(nranks_) + " ranks";
    rc = recvFrame(fd, sizeof(RootReply) + nranks_ * sizeof(AddrSlot), reply, deadline,
                   cancel(), waitWhat.c_str());
  }
  closeSocket(&fd);
  return rc;
}

attnResult_t SocketBootstrap::joinRoot(const SocketAddress& root) {
  Deadline deadline = Deadline::afterMs(timeoutMs_);
  std::string what = "bootstrap rank " + std::to_string(rank_) + ": root " + formatAddress(root);
  std::vector<uint8_t> reply;
  // The root closes, without a word, connections it does not trust and the
  // oldest ones when flooded: try a few times, then give up (a wrong secret
  // looks the same from here).
  constexpr int kAttempts = 5;
  for (int attempt = 1;; ++attempt) {
    attnResult_t rc = helloRoot(root, deadline, what, &reply);
    if (rc == attnSuccess) break;
    if (rc != attnRemoteError || cancel().set() || deadline.expired()) return rc;
    if (attempt == kAttempts)
      return setError(attnRemoteError, "%s: the root closed the connection %d times without "
                      "answering (wrong secret or unique id?)", what.c_str(), kAttempts);
    ATTN_INFO(kLogBoot, "%s: connection closed before the reply, retrying", what.c_str());
    std::this_thread::sleep_for(std::chrono::milliseconds(deadline.sliceMs(10 << attempt)));
  }

  RootReply r;
  if (reply.size() < sizeof(r))
    return setError(attnRemoteError, "%s: malformed reply", what.c_str());
  std::memcpy(&r, reply.data(), sizeof(r));
  if (r.magic != kRootReplyMagic)
    return setError(attnRemoteError, "%s: malformed reply (magic)", what.c_str());
  switch (r.status) {
    case kRootOk: break;
    case kRootDuplicateRank:
      return setError(attnInvalidUsage, "%s: rank %d joined twice", what.c_str(), rank_);
    case kRootSizeMismatch:
      return setError(attnInvalidUsage, "%s: this rank says nranks=%d, other ranks said %d",
                      what.c_str(), nranks_, r.nranks);
    case kRootTimedOut:
      return setError(attnTimeout, "%s: root timed out with %d of %d ranks joined", what.c_str(),
                      r.joined, r.nranks);
    default:
      return setError(attnRemoteError, "%s: unknown status %d", what.c_str(), r.status);
  }
  if (r.nranks != nranks_ || reply.size() != sizeof(r) + nranks_ * sizeof(AddrSlot))
    return setError(attnRemoteError, "%s: malformed address table", what.c_str());
  peerAddr_.resize(nranks_);
  for (int i = 0; i < nranks_; ++i) {
    AddrSlot s;
    std::memcpy(&s, reply.data() + sizeof(r) + i * sizeof(AddrSlot), sizeof(s));
    if (!deserializeAddress(s.addr, s.len, &peerAddr_[i]))
      return setError(attnRemoteError, "%s: bad address for rank %d", what.c_str(), i);
  }
  ATTN_INFO(kLogBoot, "bootstrap rank %d: all %d ranks met", rank_, nranks_);
  return attnSuccess;
}

// ---------------------------------------------------------------------------
// Receive side

void SocketBootstrap::deliver(int from, std::vector<uint8_t>&& frame) {
  DataHeader h;
  std::memcpy(&h, frame.data(), sizeof(h));
  std::lock_guard<std::mutex> g(mu_);
  mail_[Key{from, h.kind, h.tag}].push_back(std::move(frame));
  cv_.notify_all();
}

void SocketBootstrap::rxLoop() {
  struct Conn {
    int fd;
    FrameReader reader;
    int from;  // -1 until the peer proved the secret
  };
  std::list<Conn> conns;
  size_t unauth = 0;
  auto markGone = [&](int from) {
    std::lock_guard<std::mutex> g(mu_);
    peerGone_[from] = true;
    cv_.notify_all();
  };

  while (!closed_.load()) {
    std::vector<pollfd> fds{{wakeFd_, POLLIN, 0}, {listenFd_, POLLIN, 0}};
    for (auto& c : conns) fds.push_back({c.fd, POLLIN, 0});
    if (poll(fds.data(), fds.size(), 200) <= 0) continue;
    if (fds[0].revents) break;

    size_t i = 2;
    for (auto it = conns.begin(); it != conns.end(); ++i) {
      Conn& c = *it;
      bool drop = false;
      while (fds[i].revents && !drop) {
        size_t bound = c.from < 0 ? kMaxUnauthFrame : kMaxDataFrame + sizeof(DataHeader);
        FrameReader::Status st = c.reader.read(c.fd, bound);
        if (st == FrameReader::kAgain) break;
        if (st != FrameReader::kFrame) {
          if (c.from >= 0) {
            if (st != FrameReader::kClosed)
              ATTN_WARN(kLogBoot, "bootstrap rank %d: connection from peer %d failed (%s)",
                        rank_, c.from, st == FrameReader::kTooLong ? "oversized frame"
                                                                  : strerror(c.reader.lastErrno()));
            markGone(c.from);
          } else {
            ATTN_INFO(kLogBoot, "bootstrap rank %d: dropping unauthenticated connection (%s)",
                      rank_, st == FrameReader::kTooLong ? "oversized frame" : "closed");
          }
          drop = true;
          break;
        }
        auto& body = c.reader.body();
        if (c.from < 0) {
          PeerHello h;
          bool ok = body.size() == sizeof(h);
          if (ok) std::memcpy(&h, body.data(), sizeof(h));
          ok = ok && h.magic == kPeerHelloMagic && h.version == kWireVersion &&
               secretsEqual(h.secret, secret_, 16) && h.nonce == nonce_ && h.to == rank_ &&
               h.from >= 0 && h.from < nranks_;
          if (!ok) {
            ATTN_INFO(kLogBoot, "bootstrap rank %d: dropping connection with a bad hello", rank_);
            drop = true;
            break;
          }
          c.from = h.from;
          --unauth;
          std::lock_guard<std::mutex> g(mu_);
          peerGone_[c.from] = false;
        } else if (body.size() < sizeof(DataHeader)) {
          ATTN_WARN(kLogBoot, "bootstrap rank %d: short frame from peer %d", rank_, c.from);
          markGone(c.from);
          drop = true;
          break;
        } else {
          deliver(c.from, std::move(body));
        }
        c.reader.next();
      }
      if (drop) {
        if (c.from < 0) --unauth;
        closeSocket(&c.fd);
        it = conns.erase(it);
      } else {
        ++it;
      }
    }

    if (fds[1].revents) {
      for (;;) {
        int fd = -1;
        if (socketAcceptNow(listenFd_, &fd) != attnSuccess || fd < 0) break;
        if (unauth >= kMaxPendingConns) {  // evict the oldest stranger
          auto old = std::find_if(conns.begin(), conns.end(), [](const Conn& c) { return c.from < 0; });
          closeSocket(&old->fd);
          conns.erase(old);
          --unauth;
        }
        conns.push_back(Conn{fd, FrameReader(), -1});
        ++unauth;
      }
    }
  }
  for (auto& c : conns) closeSocket(&c.fd);
}

attnResult_t SocketBootstrap::takeLocked(const Key& key, void* data, size_t bytes) {
  auto it = mail_.find(key);
  std::vector<uint8_t> frame = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) mail_.erase(it);
  const size_t got = frame.size() - sizeof(DataHeader);
  if (got != bytes)
    return setError(attnInvalidUsage,
                    "bootstrap rank %d: message from peer %d (tag %u) has %zu bytes, expected %zu",
                    rank_, std::get<0>(key), std::get<2>(key), got, bytes);
  if (bytes) std::memcpy(data, frame.data() + sizeof(DataHeader), bytes);
  return attnSuccess;
}

attnResult_t SocketBootstrap::waitFailsLocked(int peer, uint32_t tag, const Deadline& deadline) {
  auto who = [&] { return peer >= 0 ? "peer " + std::to_string(peer) : std::string("any peer"); };
  if (closed_.load())
    return setError(attnRemoteError, "bootstrap rank %d: closed while waiting for %s", rank_, who().c_str());
  if (abortFlag_ && abortFlag_->load())
    return setError(attnRemoteError, "bootstrap rank %d: aborted while waiting for %s", rank_, who().c_str());
  if (peer >= 0 && peerGone_[peer])
    return setError(attnRemoteError, "bootstrap rank %d: peer %d closed its connection (tag %u not received)",
                    rank_, peer, tag);
  if (deadline.expired())
    return setError(attnTimeout, "bootstrap rank %d: timed out waiting for %s (tag %u)", rank_, who().c_str(),
                    tag);
  return attnSuccess;
}

attnResult_t SocketBootstrap::recvFrom(int peer, uint32_t kind, uint32_t tag, void* data,
                                       size_t bytes, const Deadline& deadline) {
  const Key key{peer, kind, tag};
  std::unique_lock<std::mutex> g(mu_);
  for (;;) {
    if (mail_.count(key)) return takeLocked(key, data, bytes);
    ATTN_CHECK(waitFailsLocked(peer, tag, deadline));
    // Short slices: the abort flag is set without notifying us.
    cv_.wait_for(g, std::chrono::milliseconds(deadline.sliceMs(50)));
  }
}

attnResult_t SocketBootstrap::recvAny(uint32_t tag, void* data, size_t bytes, const std::vector<int>& awaited,
                                      int* from) {
  ATTN_REQUIRE(data != nullptr || bytes == 0, "bootstrap recvAny: NULL data");
  ATTN_REQUIRE(from != nullptr, "bootstrap recvAny: NULL sender");
  for (int p : awaited)
    ATTN_REQUIRE(p >= 0 && p < nranks_, "bootstrap recvAny: peer %d not in [0, %d)", p, nranks_);
  const Deadline deadline = Deadline::afterMs(timeoutMs_);
  std::unique_lock<std::mutex> g(mu_);
  for (;;) {
    for (int p = 0; p < nranks_; ++p) {
      const Key key{p, kUserFrame, tag};
      if (!mail_.count(key)) continue;
      *from = p;
      return takeLocked(key, data, bytes);
    }
    if (awaited.empty()) ATTN_CHECK(waitFailsLocked(-1, tag, deadline));
    for (int p : awaited) ATTN_CHECK(waitFailsLocked(p, tag, deadline));
    cv_.wait_for(g, std::chrono::milliseconds(deadline.sliceMs(50)));
  }
}

// ---------------------------------------------------------------------------
// Send side

attnResult_t SocketBootstrap::dialLocked(int peer, const Deadline& deadline) {
  std::string what = "bootstrap rank " + std::to_string(rank_) + ": connect to peer " +
                     std::to_string(peer) + " at " + formatAddress(peerAddr_[peer]);
  int fd = -1;
  ATTN_CHECK(socketConnect(peerAddr_[peer], deadline, cancel(), what.c_str(), &fd,
                           ConnectTarget::kPeer));
  PeerHello h{};
  h.magic = kPeerHelloMagic;
  h.version = kWireVersion;
  std::memcpy(h.secret, secret_, 16);
  h.nonce = nonce_;
  h.from = rank_;
  h.to = peer;
  attnResult_t rc = sendFrame(fd, &h, sizeof(h), deadline, cancel(), what.c_str());
  if (rc != attnSuccess) {
    closeSocket(&fd);
    return rc;
  }
  outFd_[peer] = fd;
  return attnSuccess;
}

attnResult_t SocketBootstrap::sendTo(int peer, uint32_t kind, uint32_t tag, const void* data,
                                     size_t bytes, const Deadline& deadline) {
  if (bytes > kMaxDataFrame)
    return setError(attnInvalidArgument, "bootstrap rank %d: message of %zu bytes to peer %d "
                    "exceeds the %zu-byte bound", rank_, bytes, peer, kMaxDataFrame);
  if (closed_.load())
    return setError(attnRemoteError, "bootstrap rank %d: send to peer %d after close", rank_, peer);
  std::vector<uint8_t> frame(sizeof(DataHeader) + bytes);
  DataHeader h{kind, tag};
  std::memcpy(frame.data(), &h, sizeof(h));
  if (bytes) std::memcpy(frame.data() + sizeof(h), data, bytes);
  if (peer == rank_) {
    deliver(rank_, std::move(frame));
    return attnSuccess;
  }
  std::lock_guard<std::mutex> g(outMu_[peer]);
  if (outFd_[peer] < 0) ATTN_CHECK(dialLocked(peer, deadline));
  std::string what = "bootstrap rank " + std::to_string(rank_) + ": send to peer " +
                     std::to_string(peer);
  attnResult_t rc = sendFrame(outFd_[peer], frame.data(), frame.size(), deadline, cancel(),
                              what.c_str());
  // A frame may be half-sent: the stream is unusable afterwards.
  if (rc != attnSuccess) closeSocket(&outFd_[peer]);
  return rc;
}

// ---------------------------------------------------------------------------
// Public operations

attnResult_t SocketBootstrap::send(int peer, uint32_t tag, const void* data, size_t bytes) {
  ATTN_REQUIRE(peer >= 0 && peer < nranks_, "bootstrap send: peer %d not in [0, %d)", peer, nranks_);
  ATTN_REQUIRE(data != nullptr || bytes == 0, "bootstrap send: NULL data");
  return sendTo(peer, kUserFrame, tag, data, bytes, Deadline::afterMs(timeoutMs_));
}

attnResult_t Bootstrap::sendWithin(int peer, uint32_t tag, const void* data, size_t bytes, int) {
  return send(peer, tag, data, bytes);
}

attnResult_t SocketBootstrap::sendWithin(int peer, uint32_t tag, const void* data, size_t bytes, int timeoutMs) {
  ATTN_REQUIRE(peer >= 0 && peer < nranks_, "bootstrap send: peer %d not in [0, %d)", peer, nranks_);
  ATTN_REQUIRE(data != nullptr || bytes == 0, "bootstrap send: NULL data");
  const int bound = timeoutMs_ > 0 ? std::min(timeoutMs, timeoutMs_) : timeoutMs;
  return sendTo(peer, kUserFrame, tag, data, bytes, Deadline::afterMs(bound));
}

attnResult_t Bootstrap::recvAny(uint32_t tag, void*, size_t, const std::vector<int>&, int*) {
  return setError(attnInternalError, "bootstrap rank %d: this bootstrap cannot receive from any peer (tag %u)",
                  rank(), tag);
}

attnResult_t SocketBootstrap::recv(int peer, uint32_t tag, void* data, size_t bytes) {
  ATTN_REQUIRE(peer >= 0 && peer < nranks_, "bootstrap recv: peer %d not in [0, %d)", peer, nranks_);
  ATTN_REQUIRE(data != nullptr || bytes == 0, "bootstrap recv: NULL data");
  return recvFrom(peer, kUserFrame, tag, data, bytes, Deadline::afterMs(timeoutMs_));
}

// Ring: at step s, pass on the slot received at step s-1 (own slot first).
attnResult_t SocketBootstrap::allGather(void* data, size_t bytesPerRank) {
  ATTN_REQUIRE(data != nullptr || bytesPerRank == 0, "bootstrap allGather: NULL data");
  const uint32_t tag = collSeq_++;
  Deadline deadline = Deadline::afterMs(timeoutMs_);
  auto* p = static_cast<uint8_t*>(data);
  const int next = (rank_ + 1) % nranks_, prev = (rank_ + nranks_ - 1) % nranks_;
  for (int step = 0; step < nranks_ - 1; ++step) {
    int sendSlot = (rank_ - step + nranks_) % nranks_;
    int recvSlot = (rank_ - step - 1 + nranks_) % nranks_;
    ATTN_CHECK(sendTo(next, kInternalFrame, tag, p + sendSlot * bytesPerRank, bytesPerRank,
                      deadline));
    ATTN_CHECK(recvFrom(prev, kInternalFrame, tag, p + recvSlot * bytesPerRank, bytesPerRank,
                        deadline));
  }
  return attnSuccess;
}

attnResult_t SocketBootstrap::barrier() {
  std::vector<uint8_t> slots(nranks_, 0);
  return allGather(slots.data(), 1);
}

}  // namespace attn
