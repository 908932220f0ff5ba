// The bootstrap root: a thread that waits for every rank's hello, challenges
// it to prove the secret (bootstrap_wire.h), and sends everyone the table of
// listen addresses, signed for each rank. One poll loop reads all candidate
// connections without blocking, so a silent, garbled or unauthenticated
// client is dropped without delaying the real ranks.
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "src/core/auth.h"
#include "src/core/bootstrap.h"
#include "src/core/bootstrap_wire.h"
#include "src/core/settings.h"
#include "src/core/error.h"
#include "src/core/log.h"
#include "src/core/socket.h"

namespace attn {
namespace {

using namespace boot;

// Extra time the root waits beyond a rank's own timeout, so that rank sees
// its own attnTimeout rather than the root going away.
constexpr int64_t kRootGraceMs = 1000;

// A connection that has not joined yet: first its hello is read and a
// challenge sent, then its proof is checked.
struct Pending {
  int fd;
  FrameReader reader;
  std::string from;         // source address, for messages
  bool challenged = false;  // hello read, challenge sent, proof awaited
  RootHello hello{};
  auth::Nonce nonce{};      // ours, sent in the challenge
};

// A rank that proved the secret and joined: what its reply is signed over.
struct Joined {
  int fd = -1;
  RootHello hello{};
  auth::Nonce nonce{};
};

std::string peerName(int fd) {
  SocketAddress a;
  a.len = sizeof(a.storage);
  if (getpeername(fd, a.sa(), &a.len) != 0) return "an unknown address";
  return formatAddress(a);
}

class RootServer {
 public:
  RootServer(int listenFd, const SocketAddress& addr, const uint8_t secret[16], uint64_t nonce)
      : listenFd_(listenFd), addr_(addr), nonce_(nonce) {
    std::memcpy(secret_, secret, 16);
  }
  ~RootServer() { closeSockets(); }
  // Also for a child of fork(), which holds copies of the sockets but not
  // the thread serving them.
  void closeSockets() {
    closeSocket(&listenFd_);
    for (auto& p : pending_) closeSocket(&p.fd);
    for (auto& j : joined_) closeSocket(&j.fd);
  }

  std::atomic<bool> stop{false};
  std::atomic<bool> done{false};

  void run() {
    ErrorContext ctx("bootstrap root " + formatAddress(addr_));
    // Nothing may escape the thread (that would end the process): an
    // allocation that fails is reported and ends this root only.
    try {
      serveAll();
      // Its port is free again at once (attnCommInitFromEnv may start another
      // root there), not when the next root reaps this one.
      closeSocket(&listenFd_);
      for (auto& p : pending_) closeSocket(&p.fd);
    } catch (const std::exception& e) {
      ATTN_WARN(kLogBoot, "bootstrap root %s: giving up: %s", formatAddress(addr_).c_str(),
                e.what());
      try {
        replyAll(kRootFailed);
      } catch (const std::exception&) {
      }
      closeSockets();
    }
    done.store(true);
  }

 private:
  void serveAll() {
    deadline_ = Deadline::afterMs(settingInt<Setting::kBootstrapTimeoutMs>());
    ATTN_INFO(kLogBoot, "bootstrap root listening on %s", formatAddress(addr_).c_str());
    while (!stop.load()) {
      if (nranks_ > 0 && joinedCount_ == nranks_) {
        distribute();
        break;
      }
      if (deadline_.expired()) {
        ATTN_WARN(kLogBoot, "bootstrap root: timed out with %d of %d ranks joined", joinedCount_,
                  nranks_);
        replyAll(kRootTimedOut);
        break;
      }
      pollOnce();
    }
  }

  void pollOnce() {
    std::vector<pollfd> fds;
    fds.push_back({listenFd_, POLLIN, 0});
    for (auto& p : pending_) fds.push_back({p.fd, POLLIN, 0});
    int n = poll(fds.data(), fds.size(), deadline_.sliceMs(100));
    if (n <= 0) return;
    // Read existing clients first (indices match fds[1..]), then accept.
    size_t i = 1;
    for (auto it = pending_.begin(); it != pending_.end(); ++i) {
      if (fds[i].revents == 0) { ++it; continue; }
      if (serve(*it)) {
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
    if (fds[0].revents) acceptAll();
  }

  void acceptAll() {
    for (;;) {
      int fd = -1;
      if (socketAcceptNow(listenFd_, &fd) != attnSuccess || fd < 0) return;
      // At the cap, the oldest connection makes room: a flood of idle
      // clients cannot lock out ranks, which answer at once.
      if (pending_.size() >= kMaxPendingConns) {
        drop(pending_.front(), "evicted (too many pending connections)");
        pending_.pop_front();
      }
      pending_.push_back(Pending{fd, FrameReader(), peerName(fd)});
    }
  }

  // Reads from one client without blocking; true when it is finished with
  // (joined or dropped).
  bool serve(Pending& p) {
    for (;;) {
      FrameReader::Status st = p.reader.read(p.fd, kMaxUnauthFrame);
      if (st == FrameReader::kAgain) return false;
      if (st != FrameReader::kFrame) {
        drop(p, st == FrameReader::kTooLong ? "oversized frame" : "closed or failed before joining");
        return true;
      }
      const auto& body = p.reader.body();
      if (!p.challenged) {
        if (!parseRootHello(body.data(), body.size(), nonce_, &p.hello)) {
          drop(p, "malformed hello, or one for another communicator");
          return true;
        }
        if (auth::freshNonce(&p.nonce) != attnSuccess) {
          drop(p, "no random nonce");
          return true;
        }
        const Challenge c = makeChallenge(kRootChallengeMagic, p.nonce);
        if (!sendFrameNow(p.fd, &c, sizeof(c))) {
          drop(p, "cannot send the challenge");
          return true;
        }
        p.challenged = true;
        p.reader.next();
        continue;
      }
      if (!checkRootProof(body.data(), body.size(), secret_, p.hello, p.nonce)) {
        drop(p, "its proof does not match the secret");
        return true;
      }
      admit(p);
      return true;
    }
  }

  void drop(Pending& p, const char* why) {
    ATTN_INFO(kLogBoot, "bootstrap root: dropping connection from %s: %s", p.from.c_str(), why);
    closeSocket(&p.fd);
  }

  // `p` proved the secret: it joins, or learns why not.
  void admit(Pending& p) {
    const RootHello& h = p.hello;
    if (h.nranks < 1 || h.nranks > kMaxRanks || h.rank < 0 || h.rank >= h.nranks) {
      ATTN_WARN(kLogBoot, "bootstrap root: %s claims rank %d of nranks=%d (nranks must be in "
                "[1, %d])", p.from.c_str(), h.rank, h.nranks, kMaxRanks);
      return refuse(p, kRootBadSize, kMaxRanks);
    }
    if (nranks_ < 0) {
      nranks_ = h.nranks;
      joined_.assign(size_t(nranks_), Joined{});
      table_.assign(size_t(nranks_), AddrSlot{});
    }
    if (h.nranks != nranks_) {
      ATTN_WARN(kLogBoot, "bootstrap root: rank %d (%s) says nranks=%d, others said %d", h.rank,
                p.from.c_str(), h.nranks, nranks_);
      return refuse(p, kRootSizeMismatch, nranks_);
    }
    Joined& j = joined_[size_t(h.rank)];
    if (j.fd >= 0) {
      // The first claimant keeps its place; the second only hears why.
      ATTN_WARN(kLogBoot, "bootstrap root: rank %d claimed again from %s (already joined)", h.rank,
                p.from.c_str());
      return refuse(p, kRootDuplicateRank, nranks_);
    }
    j.fd = p.fd;
    j.hello = h;
    j.nonce = p.nonce;
    p.fd = -1;
    table_[size_t(h.rank)].len = h.addrLen;
    std::memcpy(table_[size_t(h.rank)].addr, h.addr, kAddressBytes);
    ++joinedCount_;
    if (h.timeoutMs > 0)
      deadline_ = deadline_.earlier(Deadline::afterMs(int64_t(h.timeoutMs) + kRootGraceMs));
    ATTN_INFO(kLogBoot, "bootstrap root: rank %d of %d joined from %s (%d/%d)", h.rank, nranks_,
              p.from.c_str(), joinedCount_, nranks_);
  }

  void refuse(Pending& p, RootStatus status, int32_t nranks) {
    RootReplyBuilder reply(status, nranks, joinedCount_, nullptr);
    const auto& msg = reply.signFor(secret_, p.hello, p.nonce);
    (void)sendFrameNow(p.fd, msg.data(), msg.size());
    closeSocket(&p.fd);
  }

  void distribute() {
    RootReplyBuilder reply(kRootOk, nranks_, joinedCount_, &table_);
    for (int rank = 0; rank < nranks_; ++rank) {
      Joined& j = joined_[size_t(rank)];
      std::string what = "bootstrap root: table to rank " + std::to_string(rank);
      const auto& msg = reply.signFor(secret_, j.hello, j.nonce);
      sendFrame(j.fd, msg.data(), msg.size(), Deadline::afterMs(10000), Cancel{&stop},
                what.c_str());
      closeSocket(&j.fd);
    }
    ATTN_INFO(kLogBoot, "bootstrap root: all %d ranks met, exiting", nranks_);
  }

  void replyAll(RootStatus status) {
    RootReplyBuilder reply(status, nranks_, joinedCount_, nullptr);
    for (Joined& j : joined_) {
      if (j.fd < 0) continue;
      const auto& msg = reply.signFor(secret_, j.hello, j.nonce);
      sendFrame(j.fd, msg.data(), msg.size(), Deadline::afterMs(1000), Cancel{&stop},
                "bootstrap root");
      closeSocket(&j.fd);
    }
  }

  int listenFd_;
  SocketAddress addr_;
  uint8_t secret_[16];
  uint64_t nonce_;
  Deadline deadline_ = Deadline::never();
  int nranks_ = -1;
  int joinedCount_ = 0;
  std::vector<Joined> joined_;
  std::vector<AddrSlot> table_;
  std::list<Pending> pending_;
};

// Owns the root threads of this process: finished ones are joined when the
// next root starts, running ones are stopped and joined at exit.
class RootRegistry {
 public:
  // Its destructor joins root threads, which run HMACs (auth.h).
  RootRegistry() { auth::initCrypto(); }
  void start(std::unique_ptr<RootServer> server) {
    std::lock_guard<std::mutex> g(mu_);
    forgetInheritedLocked();
    reapLocked();
    auto s = std::shared_ptr<RootServer>(std::move(server));
    roots_.push_back(Entry{s, std::thread([s] {
      s->run();
      auth::threadDone();
    })});
  }
  ~RootRegistry() {
    std::lock_guard<std::mutex> g(mu_);
    forgetInheritedLocked();
    for (auto& e : roots_) e.server->stop.store(true);
    for (auto& e : roots_) e.thread.join();
  }

 private:
  struct Entry {
    std::shared_ptr<RootServer> server;
    std::thread thread;
  };
  // A child of fork() inherits the entries but not their threads (a parent
  // typically makes the unique id, then forks its ranks): joining one would
  // wait forever. The child closes its copies of their sockets and lets the
  // std::thread objects go unjoined (destroying a joinable one aborts).
  void forgetInheritedLocked() {
    if (owner_ == getpid()) return;
    owner_ = getpid();
    // Never freed (see above); held by a static so leak checkers see it.
    static auto* orphans = new std::vector<std::thread>();
    for (auto& e : roots_) {
      // A root that had finished before the fork stored `done` after its
      // last write to its sockets: reading it orders those writes before
      // ours (its thread was never joined).
      (void)e.server->done.load(std::memory_order_acquire);
      e.server->closeSockets();
      orphans->push_back(std::move(e.thread));
    }
    roots_.clear();
  }
  void reapLocked() {
    for (auto it = roots_.begin(); it != roots_.end();) {
      if (it->server->done.load()) {
        it->thread.join();
        it = roots_.erase(it);
      } else {
        ++it;
      }
    }
  }
  std::mutex mu_;
  pid_t owner_ = getpid();
  std::list<Entry> roots_;
};

RootRegistry& registry() {
  static RootRegistry r;
  return r;
}

attnResult_t makeId(const SocketAddress& addr, const uint8_t secret[16], uint64_t nonce,
                    attnUniqueId* id) {
  UniqueIdData d;
  d.magic = kIdMagic;
  d.version = kIdVersion;
  std::memcpy(d.secret, secret, 16);
  d.addressLen = serializeAddress(addr, d.address);
  d.nonce = nonce;
  return encodeUniqueId(d, id);
}

attnResult_t startRoot(int listenFd, const SocketAddress& addr, const uint8_t secret[16],
                       uint64_t nonce) {
  try {
    registry().start(std::make_unique<RootServer>(listenFd, addr, secret, nonce));
  } catch (const std::exception& e) {
    ::close(listenFd);
    return setError(attnSystemError, "bootstrap root: cannot start thread: %s", e.what());
  }
  return attnSuccess;
}

}  // namespace

attnResult_t bootstrapCreateRoot(attnUniqueId* id) {
  ATTN_REQUIRE(id != nullptr, "attnGetUniqueId: NULL id");
  SocketAddress addr;
  std::string ifname;
  ATTN_CHECK(findInterface(&ifname, &addr));
  int fd = -1;
  SocketAddress bound;
  ATTN_CHECK(socketListen(addr, false, &fd, &bound));
  uint8_t secret[16];
  uint64_t nonce = 0;
  attnResult_t rc = auth::randomBytes(secret, sizeof(secret));
  if (rc == attnSuccess) rc = auth::randomBytes(&nonce, sizeof(nonce));
  if (rc == attnSuccess) rc = makeId(bound, secret, nonce, id);
  if (rc != attnSuccess) {
    ::close(fd);
    return rc;
  }
  ATTN_INFO(kLogBoot, "bootstrap root on interface %s, %s", ifname.c_str(),
            formatAddress(bound).c_str());
  return startRoot(fd, bound, secret, nonce);
}

attnResult_t bootstrapCreateRootAt(const std::string& hostPort, const uint8_t secret[16],
                                   attnUniqueId* id) {
  ATTN_REQUIRE(id != nullptr && secret != nullptr, "bootstrapCreateRootAt: NULL argument");
  SocketAddress addr;
  ATTN_CHECK(parseAddress(hostPort, &addr));
  if (addressPort(addr) == 0)
    return setError(attnInvalidArgument, "bootstrap root address \"%s\": no port", hostPort.c_str());
  int fd = -1;
  SocketAddress bound;
  if (socketListen(addr, true, &fd, &bound) != attnSuccess) {
    // The name may resolve to an address this host cannot bind (NAT, a
    // load-balancer name): listen on every address at that port instead.
    SocketAddress any;
    any.storage.ss_family = sa_family_t(addr.family());
    any.len = addr.len;
    setAddressPort(&any, addressPort(addr));
    ATTN_CHECK(socketListen(any, true, &fd, &bound));
  }
  attnResult_t rc = makeId(addr, secret, nonceFromSecret(secret), id);
  if (rc != attnSuccess) {
    ::close(fd);
    return rc;
  }
  return startRoot(fd, bound, secret, nonceFromSecret(secret));
}

attnResult_t bootstrapIdFor(const std::string& hostPort, const uint8_t secret[16],
                            attnUniqueId* id) {
  ATTN_REQUIRE(id != nullptr && secret != nullptr, "bootstrapIdFor: NULL argument");
  SocketAddress addr;
  ATTN_CHECK(parseAddress(hostPort, &addr));
  if (addressPort(addr) == 0)
    return setError(attnInvalidArgument, "bootstrap root address \"%s\": no port", hostPort.c_str());
  return makeId(addr, secret, nonceFromSecret(secret), id);
}

}  // namespace attn
