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

#include "src/core/auth.h"
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
  ATTN_REQUIRE(nranks <= kMaxRanks, "bootstrap: nranks=%d exceeds the bootstrap's bound of %d ranks",
               nranks, kMaxRanks);
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
  peerMail_.assign(nranks_, PeerMail{});
  try {
    rx_ = std::thread([this] {
      rxLoop();
      auth::threadDone();  // it checked proofs: free libcrypto's state of this thread
    });
  } catch (const std::exception& e) {
    return setError(attnSystemError, "bootstrap: cannot start receive thread: %s", e.what());
  }
  ATTN_INFO(kLogBoot, "bootstrap rank %d/%d listening on %s (%s), root %s", rank_, nranks_,
            formatAddress(listenAddr_).c_str(), ifname.c_str(), formatAddress(root).c_str());
  return joinRoot(root);
}

// One attempt: dial the root, say hello, answer its challenge, then wait
// for its reply and check that the root proved the secret before reading it.
attnResult_t SocketBootstrap::helloRoot(const SocketAddress& root, const Deadline& deadline,
                                        const std::string& what, RootAnswer* answer,
                                        bool* fatal) {
  *fatal = false;
  auth::Nonce mine, theirs;
  ATTN_CHECK(auth::freshNonce(&mine));
  const RootHello h = makeRootHello(nonce_, rank_, nranks_, timeoutMs_, listenAddr_, mine);
  int fd = -1;
  ATTN_CHECK(socketConnect(root, deadline, cancel(), what.c_str(), &fd));
  std::vector<uint8_t> frame;
  attnResult_t rc = sendFrame(fd, &h, sizeof(h), deadline, cancel(), what.c_str());
  if (rc == attnSuccess)
    rc = recvFrame(fd, kMaxUnauthFrame, &frame, deadline, cancel(), what.c_str());
  if (rc == attnSuccess && !parseChallenge(frame.data(), frame.size(), kRootChallengeMagic, &theirs))
    rc = setError(attnRemoteError, "%s: malformed challenge (not an attncomm root of this "
                  "version?)", what.c_str());
  if (rc == attnSuccess) {
    const Proof p = makeRootProof(secret_, h, theirs);
    rc = sendFrame(fd, &p, sizeof(p), deadline, cancel(), what.c_str());
  }
  if (rc == attnSuccess) {
    std::string waitWhat = what + ": waiting for all " + std::to_string(nranks_) + " ranks";
    rc = recvFrame(fd, rootReplyBound(nranks_), &frame, deadline, cancel(), waitWhat.c_str());
  }
  closeSocket(&fd);
  if (rc != attnSuccess) return rc;
  switch (parseRootReply(frame.data(), frame.size(), secret_, h, theirs, answer)) {
    case ReplyCheck::kOk: return attnSuccess;
    case ReplyCheck::kForged:
      *fatal = true;
      return setError(attnRemoteError, "%s: the root's reply is not signed with this "
                      "communicator's secret: whatever answers there is not its root (a wrong or "
                      "stale unique id, or another program on that port); its address table is "
                      "ignored", what.c_str());
    case ReplyCheck::kMalformed: break;
  }
  *fatal = true;
  return setError(attnRemoteError, "%s: malformed reply", what.c_str());
}

attnResult_t SocketBootstrap::joinRoot(const SocketAddress& root) {
  Deadline deadline = Deadline::afterMs(timeoutMs_);
  std::string what = "bootstrap rank " + std::to_string(rank_) + ": root " + formatAddress(root);
  RootAnswer r;
  // The root closes, without a word, connections it does not trust and the
  // oldest ones when flooded: try a few times, then give up (a wrong secret
  // looks the same from here).
  constexpr int kAttempts = 5;
  for (int attempt = 1;; ++attempt) {
    bool fatal = false;
    attnResult_t rc = helloRoot(root, deadline, what, &r, &fatal);
    if (rc == attnSuccess) break;
    if (fatal || rc != attnRemoteError || cancel().set() || deadline.expired()) return rc;
    if (attempt == kAttempts)
      return setError(attnRemoteError, "%s: the root closed the connection %d times without "
                      "answering (wrong secret or unique id?)", what.c_str(), kAttempts);
    ATTN_INFO(kLogBoot, "%s: connection closed before the reply, retrying", what.c_str());
    std::this_thread::sleep_for(std::chrono::milliseconds(deadline.sliceMs(10 << attempt)));
  }

  switch (r.status) {
    case kRootOk: break;
    case kRootDuplicateRank:
      return setError(attnInvalidUsage, "%s: rank %d joined twice", what.c_str(), rank_);
    case kRootSizeMismatch:
      return setError(attnInvalidUsage, "%s: this rank says nranks=%d, other ranks said %d",
                      what.c_str(), nranks_, r.nranks);
    case kRootBadSize:
      return setError(attnInvalidArgument, "%s: the root refused rank %d of nranks=%d (nranks "
                      "must be in [1, %d])", what.c_str(), rank_, nranks_, r.nranks);
    case kRootTimedOut:
      return setError(attnTimeout, "%s: root timed out with %d of %d ranks joined", what.c_str(),
                      r.joined, r.nranks);
    case kRootFailed:
      return setError(attnRemoteError, "%s: the root failed (see its log) with %d of %d ranks "
                      "joined", what.c_str(), r.joined, r.nranks);
    default:
      return setError(attnRemoteError, "%s: unknown status %d", what.c_str(), r.status);
  }
  peerAddr_ = std::move(r.addrs);
  ATTN_INFO(kLogBoot, "bootstrap rank %d: all %d ranks met", rank_, nranks_);
  return attnSuccess;
}

// ---------------------------------------------------------------------------
// Receive side

bool SocketBootstrap::deliver(int from, std::vector<uint8_t>&& frame) {
  DataHeader h;
  std::memcpy(&h, frame.data(), sizeof(h));
  std::lock_guard<std::mutex> g(mu_);
  if (from != rank_) {
    PeerMail& m = peerMail_[from];
    if (m.frames >= kMaxQueuedFrames || frame.size() > kMaxQueuedBytes - m.bytes) return false;
    ++m.frames;
    m.bytes += frame.size();
  }
  mail_[Key{from, h.kind, h.tag}].push_back(std::move(frame));
  cv_.notify_all();
  return true;
}

void SocketBootstrap::markGone(int from, bool cutOff) {
  std::lock_guard<std::mutex> g(mu_);
  peerMail_[from].gone = true;
  if (cutOff) peerMail_[from].cutOff = true;
  cv_.notify_all();
}

void SocketBootstrap::rxLoop() {
  // Nothing may escape the thread (that would end the process): a failure
  // here fails the waits instead.
  try {
    rxServe();
  } catch (const std::exception& e) {
    ATTN_WARN(kLogBoot, "bootstrap rank %d: receive thread failed: %s", rank_, e.what());
    std::lock_guard<std::mutex> g(mu_);
    rxError_ = e.what();
    cv_.notify_all();
  }
}

namespace {

// A connection accepted by rxServe: first the handshake (from < 0), then
// data frames from rank `from`.
struct RxConn {
  int fd = -1;
  FrameReader reader;
  std::string ip;     // source IP, which the claimed rank is bound to
  std::string where;  // source address, for messages
  bool challenged = false;
  PeerHello hello{};
  auth::Nonce nonce{};  // ours, sent in the challenge
  int from = -1;
  RxConn() = default;
  RxConn(const RxConn&) = delete;
  RxConn& operator=(const RxConn&) = delete;
  ~RxConn() { closeSocket(&fd); }
};

}  // namespace

void SocketBootstrap::rxServe() {
  std::list<RxConn> conns;
  size_t unauth = 0;
  // Per rank: the source IP of its first authenticated connection (empty:
  // none yet) and whether a connection from it is open.
  struct Binding {
    std::string ip;
    bool live = false;
  };
  std::vector<Binding> bound(static_cast<size_t>(nranks_));
  auto cutOff = [&](int r) {
    std::lock_guard<std::mutex> g(mu_);
    return peerMail_[r].cutOff;
  };

  // One handshake frame from a stranger; false: drop the connection.
  auto handshake = [&](RxConn& c, const std::vector<uint8_t>& body) {
    if (!c.challenged) {
      if (!parsePeerHello(body.data(), body.size(), nonce_, rank_, nranks_, &c.hello)) {
        ATTN_INFO(kLogBoot, "bootstrap rank %d: dropping a connection from %s: malformed hello, "
                  "or one for another rank or communicator", rank_, c.where.c_str());
        return false;
      }
      if (auth::freshNonce(&c.nonce) != attnSuccess) return false;
      const Challenge ch = makeChallenge(kPeerChallengeMagic, c.nonce);
      c.challenged = sendFrameNow(c.fd, &ch, sizeof(ch));
      return c.challenged;
    }
    const int claimed = c.hello.from;
    if (!checkPeerProof(body.data(), body.size(), secret_, c.hello, c.nonce)) {
      ATTN_INFO(kLogBoot, "bootstrap rank %d: dropping a connection from %s claiming rank %d: "
                "its proof does not match the secret", rank_, c.where.c_str(), claimed);
      return false;
    }
    Binding& b = bound[size_t(claimed)];
    PeerStatus status = kPeerOk;
    if (cutOff(claimed)) {
      status = kPeerRefused;
      ATTN_WARN(kLogBoot, "bootstrap rank %d: refusing a connection from %s claiming rank %d: "
                "that rank was cut off", rank_, c.where.c_str(), claimed);
    } else if (!b.ip.empty() && b.ip != c.ip) {
      status = kPeerRefused;
      ATTN_WARN(kLogBoot, "bootstrap rank %d: refusing a connection from %s claiming rank %d, "
                "which is bound to %s", rank_, c.where.c_str(), claimed, b.ip.c_str());
    } else if (b.live) {
      status = kPeerBusy;
      ATTN_WARN(kLogBoot, "bootstrap rank %d: refusing a connection from %s claiming rank %d "
                "while that rank's connection is open", rank_, c.where.c_str(), claimed);
    }
    const PeerAck ack = makePeerAck(secret_, c.hello, c.nonce, status);
    if (!sendFrameNow(c.fd, &ack, sizeof(ack)) || status != kPeerOk) return false;
    if (b.ip.empty()) b.ip = c.ip;
    b.live = true;
    c.from = claimed;
    --unauth;
    std::lock_guard<std::mutex> g(mu_);
    peerMail_[size_t(claimed)].gone = false;
    return true;
  };

  // One data frame from an authenticated peer; false: cut it off.
  auto data = [&](RxConn& c, std::vector<uint8_t>& body) {
    if (body.size() < sizeof(DataHeader)) {
      ATTN_WARN(kLogBoot, "bootstrap rank %d: short frame from peer %d", rank_, c.from);
      markGone(c.from, false);
      return false;
    }
    if (!deliver(c.from, std::move(body))) {
      ATTN_WARN(kLogBoot, "bootstrap rank %d: peer %d (%s) has more than %zu frames or %zu bytes "
                "queued unread: closing its connection", rank_, c.from, c.where.c_str(),
                kMaxQueuedFrames, kMaxQueuedBytes);
      markGone(c.from, true);
      return false;
    }
    return true;
  };

  while (!closed_.load()) {
    std::vector<pollfd> fds{{wakeFd_, POLLIN, 0}, {listenFd_, POLLIN, 0}};
    for (auto& c : conns) fds.push_back({c.fd, POLLIN, 0});
    if (poll(fds.data(), fds.size(), 200) <= 0) continue;
    if (fds[0].revents) break;

    size_t i = 2;
    for (auto it = conns.begin(); it != conns.end(); ++i) {
      RxConn& c = *it;
      bool keep = true;
      while (fds[i].revents && keep) {
        const size_t limit = c.from < 0 ? kMaxUnauthFrame : kMaxDataFrame + sizeof(DataHeader);
        FrameReader::Status st = c.reader.read(c.fd, limit);
        if (st == FrameReader::kAgain) break;
        if (st != FrameReader::kFrame) {
          const char* why = st == FrameReader::kTooLong ? "oversized frame" : "closed";
          if (c.from >= 0) {
            if (st != FrameReader::kClosed)
              ATTN_WARN(kLogBoot, "bootstrap rank %d: connection from peer %d failed (%s)", rank_,
                        c.from, st == FrameReader::kTooLong ? why : strerror(c.reader.lastErrno()));
            markGone(c.from, false);
          } else {
            ATTN_INFO(kLogBoot, "bootstrap rank %d: dropping a connection from %s (%s)", rank_,
                      c.where.c_str(), why);
          }
          keep = false;
          break;
        }
        keep = c.from < 0 ? handshake(c, c.reader.body()) : data(c, c.reader.body());
        c.reader.next();
      }
      if (keep) {
        ++it;
        continue;
      }
      if (c.from < 0) --unauth;
      else bound[size_t(c.from)].live = false;
      it = conns.erase(it);
    }

    if (fds[1].revents) {
      for (;;) {
        int fd = -1;
        if (socketAcceptNow(listenFd_, &fd) != attnSuccess || fd < 0) break;
        if (unauth >= kMaxPendingConns) {  // evict the oldest stranger
          auto old = std::find_if(conns.begin(), conns.end(), [](const RxConn& c) { return c.from < 0; });
          conns.erase(old);
          --unauth;
        }
        RxConn& c = conns.emplace_back();
        c.fd = fd;
        SocketAddress src;
        src.len = sizeof(src.storage);
        if (getpeername(fd, src.sa(), &src.len) == 0) {
          c.ip = addressIp(src);
          c.where = formatAddress(src);
        } else {
          c.where = "an unknown address";
        }
        ++unauth;
      }
    }
  }
}

attnResult_t SocketBootstrap::takeLocked(const Key& key, void* data, size_t bytes) {
  auto it = mail_.find(key);
  std::vector<uint8_t> frame = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) mail_.erase(it);
  if (std::get<0>(key) != rank_) {
    PeerMail& m = peerMail_[size_t(std::get<0>(key))];
    --m.frames;
    m.bytes -= frame.size();
  }
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
  if (!rxError_.empty())
    return setError(attnRemoteError, "bootstrap rank %d: receive thread failed (%s) while waiting "
                    "for %s", rank_, rxError_.c_str(), who().c_str());
  if (peer >= 0 && peerMail_[peer].cutOff)
    return setError(attnRemoteError, "bootstrap rank %d: peer %d was cut off for queueing more "
                    "than %zu frames or %zu bytes unread (tag %u not received)", rank_, peer,
                    kMaxQueuedFrames, kMaxQueuedBytes, tag);
  if (peer >= 0 && peerMail_[peer].gone)
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

attnResult_t SocketBootstrap::handshakePeer(int fd, int peer, const Deadline& deadline,
                                            const std::string& what, int32_t* status) {
  auth::Nonce mine, theirs;
  ATTN_CHECK(auth::freshNonce(&mine));
  const PeerHello h = makePeerHello(nonce_, rank_, peer, mine);
  std::vector<uint8_t> frame;
  ATTN_CHECK(sendFrame(fd, &h, sizeof(h), deadline, cancel(), what.c_str()));
  ATTN_CHECK(recvFrame(fd, kMaxUnauthFrame, &frame, deadline, cancel(), what.c_str()));
  if (!parseChallenge(frame.data(), frame.size(), kPeerChallengeMagic, &theirs))
    return setError(attnRemoteError, "%s: malformed challenge", what.c_str());
  const Proof p = makePeerProof(secret_, h, theirs);
  ATTN_CHECK(sendFrame(fd, &p, sizeof(p), deadline, cancel(), what.c_str()));
  ATTN_CHECK(recvFrame(fd, sizeof(PeerAck), &frame, deadline, cancel(), what.c_str()));
  if (!parsePeerAck(frame.data(), frame.size(), secret_, h, theirs, status))
    return setError(attnRemoteError, "%s: the listener did not prove the secret (its answer is "
                    "not signed with it): not peer %d", what.c_str(), peer);
  return attnSuccess;
}

// Connects and authenticates both ways before any data goes out. A peer
// that still holds this rank's previous connection answers "busy" until it
// has seen that one close: retry then.
attnResult_t SocketBootstrap::dialLocked(int peer, const Deadline& deadline) {
  std::string what = "bootstrap rank " + std::to_string(rank_) + ": connect to peer " +
                     std::to_string(peer) + " at " + formatAddress(peerAddr_[peer]);
  for (int backoffMs = 1;; backoffMs = std::min(backoffMs * 2, 100)) {
    int fd = -1;
    ATTN_CHECK(socketConnect(peerAddr_[peer], deadline, cancel(), what.c_str(), &fd,
                             ConnectTarget::kPeer));
    int32_t status = kPeerRefused;
    attnResult_t rc = handshakePeer(fd, peer, deadline, what, &status);
    if (rc == attnSuccess && status == kPeerOk) {
      outFd_[peer] = fd;
      return attnSuccess;
    }
    closeSocket(&fd);
    if (rc != attnSuccess) return rc;
    if (status != kPeerBusy)
      return setError(attnRemoteError, "%s: peer %d refused this rank (bound to another address, "
                      "or cut off)", what.c_str(), peer);
    if (cancel().set() || deadline.expired())
      return setError(deadline.expired() ? attnTimeout : attnRemoteError,
                      "%s: peer %d still holds an earlier connection from rank %d", what.c_str(),
                      peer, rank_);
    std::this_thread::sleep_for(std::chrono::milliseconds(deadline.sliceMs(backoffMs)));
  }
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
