// The bootstrap root: a thread that waits for every rank's hello, checks the
// secret, and sends everyone the table of listen addresses. One poll loop
// reads all candidate connections without blocking, so a silent, garbled or
// unauthenticated client is dropped without delaying the real ranks.
#include <poll.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "src/core/bootstrap.h"
#include "src/core/bootstrap_wire.h"
#include "src/core/env.h"
#include "src/core/error.h"
#include "src/core/log.h"
#include "src/core/socket.h"

namespace attn {
namespace {

using namespace boot;

constexpr int64_t kDefaultRootTimeoutMs = 300000;
// Extra time the root waits beyond a rank's own timeout, so that rank sees
// its own attnTimeout rather than the root going away.
constexpr int64_t kRootGraceMs = 1000;

struct Pending {
  int fd;
  FrameReader reader;
};

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
    for (int& fd : joinedFd_) closeSocket(&fd);
  }

  std::atomic<bool> stop{false};
  std::atomic<bool> done{false};

  void run() {
    ErrorContext ctx("bootstrap root " + formatAddress(addr_));
    deadline_ = Deadline::afterMs(envInt("ATTN_BOOTSTRAP_TIMEOUT_MS", kDefaultRootTimeoutMs));
    ATTN_INFO(kLogBoot, "bootstrap root listening on %s", formatAddress(addr_).c_str());
    while (!stop.load()) {
      if (nranks_ > 0 && joined_ == nranks_) {
        distribute();
        break;
      }
      if (deadline_.expired()) {
        ATTN_WARN(kLogBoot, "bootstrap root: timed out with %d of %d ranks joined", joined_,
                  nranks_);
        replyAll(kRootTimedOut);
        break;
      }
      pollOnce();
    }
    done.store(true);
  }

 private:
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
      // At the cap, the oldest silent connection makes room: a flood of idle
      // clients cannot lock out ranks, which send their hello at once.
      if (pending_.size() >= kMaxPendingConns) {
        drop(pending_.front(), "evicted (too many pending connections)");
        pending_.pop_front();
      }
      pending_.push_back(Pending{fd, FrameReader()});
    }
  }

  // Reads from one client; true when it is finished with (joined or dropped).
  bool serve(Pending& p) {
    FrameReader::Status st = p.reader.read(p.fd, kMaxUnauthFrame);
    if (st == FrameReader::kAgain) return false;
    if (st != FrameReader::kFrame) {
      drop(p, st == FrameReader::kTooLong ? "oversized frame" : "closed or failed before hello");
      return true;
    }
    handleHello(p);
    return true;
  }

  void drop(Pending& p, const char* why) {
    ATTN_INFO(kLogBoot, "bootstrap root: dropping connection: %s", why);
    closeSocket(&p.fd);
  }

  void handleHello(Pending& p) {
    const auto& body = p.reader.body();
    if (body.size() != sizeof(RootHello)) return drop(p, "malformed hello (size)");
    RootHello h;
    std::memcpy(&h, body.data(), sizeof(h));
    if (h.magic != kRootHelloMagic || h.version != kWireVersion)
      return drop(p, "malformed hello (magic/version)");
    if (!secretsEqual(h.secret, secret_, 16)) return drop(p, "wrong secret");
    if (h.nonce != nonce_) return drop(p, "hello for another communicator (nonce)");
    SocketAddress peerAddr;
    if (!deserializeAddress(h.addr, h.addrLen, &peerAddr)) return drop(p, "malformed address");
    if (h.nranks <= 0 || h.rank < 0 || h.rank >= h.nranks) return drop(p, "bad rank/nranks");

    // From here on the client is authenticated: tell it what went wrong.
    if (nranks_ < 0) {
      nranks_ = h.nranks;
      joinedFd_.assign(nranks_, -1);
      table_.assign(nranks_, AddrSlot{});
    }
    if (h.nranks != nranks_) {
      ATTN_WARN(kLogBoot, "bootstrap root: rank %d says nranks=%d, others said %d", h.rank,
                h.nranks, nranks_);
      return refuse(p, kRootSizeMismatch);
    }
    if (joinedFd_[h.rank] >= 0) {
      ATTN_WARN(kLogBoot, "bootstrap root: rank %d joined twice", h.rank);
      return refuse(p, kRootDuplicateRank);
    }
    joinedFd_[h.rank] = p.fd;
    p.fd = -1;
    table_[h.rank].len = h.addrLen;
    std::memcpy(table_[h.rank].addr, h.addr, kAddressBytes);
    ++joined_;
    if (h.timeoutMs > 0) deadline_ = deadline_.earlier(Deadline::afterMs(h.timeoutMs + kRootGraceMs));
    ATTN_INFO(kLogBoot, "bootstrap root: rank %d of %d joined from %s (%d/%d)", h.rank, nranks_,
              formatAddress(peerAddr).c_str(), joined_, nranks_);
  }

  void refuse(Pending& p, RootStatus status) {
    RootReply r{kRootReplyMagic, status, nranks_, joined_};
    sendFrame(p.fd, &r, sizeof(r), Deadline::afterMs(1000), Cancel{&stop}, "bootstrap root");
    closeSocket(&p.fd);
  }

  void distribute() {
    std::vector<uint8_t> msg(sizeof(RootReply) + nranks_ * sizeof(AddrSlot));
    RootReply r{kRootReplyMagic, kRootOk, nranks_, joined_};
    std::memcpy(msg.data(), &r, sizeof(r));
    std::memcpy(msg.data() + sizeof(r), table_.data(), nranks_ * sizeof(AddrSlot));
    for (int rank = 0; rank < nranks_; ++rank) {
      std::string what = "bootstrap root: table to rank " + std::to_string(rank);
      sendFrame(joinedFd_[rank], msg.data(), msg.size(), Deadline::afterMs(10000), Cancel{&stop},
                what.c_str());
      closeSocket(&joinedFd_[rank]);
    }
    ATTN_INFO(kLogBoot, "bootstrap root: all %d ranks met, exiting", nranks_);
  }

  void replyAll(RootStatus status) {
    RootReply r{kRootReplyMagic, status, nranks_, joined_};
    for (int& fd : joinedFd_) {
      if (fd < 0) continue;
      sendFrame(fd, &r, sizeof(r), Deadline::afterMs(1000), Cancel{&stop}, "bootstrap root");
      closeSocket(&fd);
    }
  }

  int listenFd_;
  SocketAddress addr_;
  uint8_t secret_[16];
  uint64_t nonce_;
  Deadline deadline_ = Deadline::never();
  int nranks_ = -1;
  int joined_ = 0;
  std::vector<int> joinedFd_;
  std::vector<AddrSlot> table_;
  std::list<Pending> pending_;
};

// Owns the root threads of this process: finished ones are joined when the
// next root starts, running ones are stopped and joined at exit.
class RootRegistry {
 public:
  void start(std::unique_ptr<RootServer> server) {
    std::lock_guard<std::mutex> g(mu_);
    forgetInheritedLocked();
    reapLocked();
    auto s = std::shared_ptr<RootServer>(std::move(server));
    roots_.push_back(Entry{s, std::thread([s] { s->run(); })});
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
    auto* orphans = new std::vector<std::thread>();  // never freed, see above
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

attnResult_t randomBytes(void* out, size_t n) {
  auto* p = static_cast<uint8_t*>(out);
  while (n > 0) {
    ssize_t got = getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return setError(attnSystemError, "getrandom: %s", strerror(errno));
    }
    p += got;
    n -= size_t(got);
  }
  return attnSuccess;
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
  attnResult_t rc = randomBytes(secret, sizeof(secret));
  if (rc == attnSuccess) rc = randomBytes(&nonce, sizeof(nonce));
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
