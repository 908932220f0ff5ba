#include "transports/tcp/tcp_setup.h"

#include <poll.h>
#include <unistd.h>

#include <cstring>
#include <list>
#include <map>
#include <string>

#include "src/core/auth.h"
#include "src/core/bootstrap.h"
#include "src/core/error.h"
#include "src/core/log.h"
#include "transports/tcp/tcp_handshake.h"

namespace attn::tcp {
namespace {

// What each rank publishes through the bootstrap.
struct RankSlot {
  uint32_t addrLen;
  uint8_t addr[kAddressBytes];
  int32_t nsocks;  // sockets this rank dials per higher peer
};

// Bound on a setup frame from a peer that has not been checked yet.
constexpr size_t kMaxSetupFrame = 4096;
// Unchecked connections kept at once while waiting for the lower ranks.
constexpr size_t kMaxCandidates = 256;

std::string peerAddress(int fd, std::string* ip) {
  SocketAddress a;
  a.len = sizeof(a.storage);
  if (getpeername(fd, a.sa(), &a.len) != 0) return "an unknown address";
  *ip = addressIp(a);
  return formatAddress(a);
}

// A socket this rank dialled: hello sent; then the challenge is answered
// and the acceptor's signed ack awaited.
struct Dialed {
  int peer;
  int index;
  int fd;  // owned by the PeerSockets it serves
  TcpHello hello;
  FrameReader reader;
  auth::Nonce acceptorNonce{};
  bool proved = false;
  bool done = false;
};

// A socket accepted from a stranger: hello, challenge, proof.
struct Candidate {
  int fd = -1;
  FrameReader reader;
  std::string ip, where;
  bool challenged = false;
  TcpHello hello{};
  auth::Nonce nonce{};  // ours
  Candidate() = default;
  Candidate(const Candidate&) = delete;
  Candidate& operator=(const Candidate&) = delete;
  ~Candidate() { closeSocket(&fd); }
};

class Setup {
 public:
  Setup(const TransportContext& ctx, const TcpOptions& opt)
      : ctx_(ctx), opt_(opt), deadline_(Deadline::afterMs(ctx.timeoutMs)),
        cancel_{ctx.abortFlag, nullptr},
        commHash_(ctx.peers ? ctx.peers[ctx.rank].commHash : 0) {}

  // On failure every socket it opened is closed again.
  attnResult_t run(const std::vector<int>& peers, std::vector<PeerSockets>* out) {
    attnResult_t rc = connectAll(peers, out);
    closeSocket(&listenFd_);
    if (rc != attnSuccess)
      for (auto& ps : *out)
        for (int& fd : ps.fds) closeSocket(&fd);
    return rc;
  }

 private:
  attnResult_t connectAll(const std::vector<int>& peers, std::vector<PeerSockets>* out);
  attnResult_t dial(int peer, PeerSockets* ps);
  // Serves dialled and accepted sockets together until every one is
  // authenticated both ways.
  attnResult_t handshakes(std::vector<PeerSockets>* out);
  attnResult_t onDialedFrame(Dialed& d, const std::vector<uint8_t>& body);
  // False when the candidate is finished with (adopted or refused).
  bool onCandidateFrame(Candidate& c, const std::vector<uint8_t>& body,
                        std::vector<PeerSockets>* out);
  attnResult_t timedOut(const std::vector<PeerSockets>& out) const;
  const uint8_t* secret() const { return ctx_.bootstrap->secret(); }

  const TransportContext& ctx_;
  const TcpOptions& opt_;
  Deadline deadline_;
  Cancel cancel_;
  uint64_t commHash_;
  int listenFd_ = -1;
  std::vector<RankSlot> slots_;
  std::map<int, size_t> lowerIndex_;  // lower peer rank -> index in peers
  std::map<int, std::string> boundIp_;  // lower peer -> source IP of its first socket
  int expected_ = 0;                  // sockets still to accept
  std::list<Dialed> dialed_;
  size_t dialedLeft_ = 0;             // dialled sockets not yet acknowledged
};

attnResult_t Setup::connectAll(const std::vector<int>& peers, std::vector<PeerSockets>* out) {
  const int rank = ctx_.rank, nranks = ctx_.nranks;
  std::vector<bool> seen(nranks, false);
  for (int p : peers) {
    if (p < 0 || p >= nranks || p == rank || seen[p])
      return setError(attnInvalidArgument, "tcp: bad peer list (peer %d, rank %d of %d)", p,
                      rank, nranks);
    seen[p] = true;
  }

  SocketAddress local, bound;
  ATTN_CHECK(parseAddress(ctx_.bootstrap->localIp(), &local));
  ATTN_CHECK(socketListen(local, false, &listenFd_, &bound));

  slots_.assign(nranks, RankSlot{});
  slots_[rank].addrLen = serializeAddress(bound, slots_[rank].addr);
  slots_[rank].nsocks = opt_.nsocks;
  ATTN_CHECK(ctx_.bootstrap->allGather(slots_.data(), sizeof(RankSlot)));

  out->assign(peers.size(), PeerSockets{});
  for (size_t i = 0; i < peers.size(); ++i) {
    const int p = peers[i];
    if (!deserializeAddress(slots_[p].addr, slots_[p].addrLen, &(*out)[i].addr) ||
        slots_[p].nsocks < 1 || slots_[p].nsocks > kMaxSockets)
      return setError(attnRemoteError, "tcp: rank %d published a bad address", p);
    if (p < rank) {
      lowerIndex_[p] = i;
      (*out)[i].fds.assign(slots_[p].nsocks, -1);
      expected_ += slots_[p].nsocks;
    }
  }

  // Dial first (connections complete in the peers' backlogs and the hellos
  // fit in socket buffers, so nothing waits on a peer yet), then serve both
  // sides of every handshake in one loop.
  for (size_t i = 0; i < peers.size(); ++i)
    if (peers[i] > rank) ATTN_CHECK(dial(peers[i], &(*out)[i]));
  ATTN_CHECK(handshakes(out));

  for (auto& ps : *out)
    for (int fd : ps.fds) {
      ATTN_CHECK(setNonBlocking(fd, true));
      setNoDelay(fd);
      setBufferSizes(fd, opt_.sockBuf);
    }
  return attnSuccess;
}

attnResult_t Setup::dial(int peer, PeerSockets* ps) {
  std::string what = "tcp: rank " + std::to_string(ctx_.rank) + " connecting to peer " +
                     std::to_string(peer) + " at " + formatAddress(ps->addr);
  for (int k = 0; k < opt_.nsocks; ++k) {
    int fd = -1;
    ATTN_CHECK(socketConnect(ps->addr, deadline_, cancel_, what.c_str(), &fd,
                             ConnectTarget::kPeer));
    ps->fds.push_back(fd);
    auth::Nonce nonce;
    ATTN_CHECK(auth::freshNonce(&nonce));
    const TcpHello h = makeTcpHello(ctx_.rank, peer, k, opt_.nsocks, nonce);
    ATTN_CHECK(sendFrame(fd, &h, sizeof(h), deadline_, cancel_, what.c_str()));
    dialed_.push_back(Dialed{peer, k, fd, h, FrameReader()});
    ++dialedLeft_;
  }
  return attnSuccess;
}

attnResult_t Setup::onDialedFrame(Dialed& d, const std::vector<uint8_t>& body) {
  const std::string what = "tcp: rank " + std::to_string(ctx_.rank) + ", socket " +
                           std::to_string(d.index) + " to peer " + std::to_string(d.peer);
  if (!d.proved) {
    if (!parseTcpChallenge(body.data(), body.size(), &d.acceptorNonce))
      return setError(attnRemoteError, "%s: malformed challenge", what.c_str());
    const TcpProof p = makeTcpProof(secret(), commHash_, d.hello, d.acceptorNonce);
    if (!sendFrameNow(d.fd, &p, sizeof(p)))
      return setError(attnRemoteError, "%s: cannot send the proof", what.c_str());
    d.proved = true;
    return attnSuccess;
  }
  int32_t status = kTcpRefused;
  if (!parseTcpAck(body.data(), body.size(), secret(), commHash_, d.hello, d.acceptorNonce,
                   &status))
    return setError(attnRemoteError, "%s: the listener did not prove the secret (its answer is "
                    "not signed with it for this communicator)", what.c_str());
  if (status != kTcpAccepted)
    return setError(attnRemoteError, "%s: refused by the peer", what.c_str());
  d.done = true;
  --dialedLeft_;
  return attnSuccess;
}

bool Setup::onCandidateFrame(Candidate& c, const std::vector<uint8_t>& body,
                             std::vector<PeerSockets>* out) {
  const int rank = ctx_.rank;
  if (!c.challenged) {
    if (!parseTcpHello(body.data(), body.size(), rank, ctx_.nranks, &c.hello) ||
        !lowerIndex_.count(c.hello.from)) {
      ATTN_INFO(kLogNet, "tcp: rank %d dropped a connection from %s: malformed or unexpected "
                "hello", rank, c.where.c_str());
      return false;
    }
    if (auth::freshNonce(&c.nonce) != attnSuccess) return false;
    const TcpChallenge ch = makeTcpChallenge(c.nonce);
    c.challenged = sendFrameNow(c.fd, &ch, sizeof(ch));
    return c.challenged;
  }
  const TcpHello& h = c.hello;
  if (!checkTcpProof(body.data(), body.size(), secret(), commHash_, h, c.nonce)) {
    ATTN_INFO(kLogNet, "tcp: rank %d dropped a connection from %s claiming rank %d: its proof "
              "does not match the secret", rank, c.where.c_str(), h.from);
    return false;
  }
  // Authenticated: the claim is judged. The K sockets of one peer must come
  // from where its first one came from.
  auto& fds = (*out)[lowerIndex_.at(h.from)].fds;
  auto bound = boundIp_.find(h.from);
  TcpAckStatus status = kTcpAccepted;
  if (h.nsocks != int(fds.size()) || fds[h.index] >= 0) {
    status = kTcpRefused;
    ATTN_WARN(kLogNet, "tcp: rank %d refused socket %d of %d from %s claiming rank %d "
              "(expected %zu sockets, or a duplicate)", rank, h.index, h.nsocks, c.where.c_str(),
              h.from, fds.size());
  } else if (bound != boundIp_.end() && bound->second != c.ip) {
    status = kTcpRefused;
    ATTN_WARN(kLogNet, "tcp: rank %d refused a socket from %s claiming rank %d, whose other "
              "sockets come from %s", rank, c.where.c_str(), h.from, bound->second.c_str());
  }
  const TcpAck ack = makeTcpAck(secret(), commHash_, h, c.nonce, status);
  if (!sendFrameNow(c.fd, &ack, sizeof(ack)) || status != kTcpAccepted) return false;
  if (bound == boundIp_.end()) boundIp_[h.from] = c.ip;
  fds[h.index] = c.fd;
  c.fd = -1;  // now owned by *out
  --expected_;
  return false;
}

attnResult_t Setup::timedOut(const std::vector<PeerSockets>& out) const {
  std::string missing;
  auto add = [&](int p) {
    const std::string s = std::to_string(p);
    if (missing.find(" " + s + ",") == std::string::npos) missing += " " + s + ",";
  };
  for (auto& [p, i] : lowerIndex_)
    for (int fd : out[i].fds)
      if (fd < 0) add(p);
  for (const Dialed& d : dialed_)
    if (!d.done) add(d.peer);
  if (!missing.empty()) missing.pop_back();
  return setError(attnTimeout, "tcp: rank %d timed out connecting with peer(s)%s", ctx_.rank,
                  missing.c_str());
}

attnResult_t Setup::handshakes(std::vector<PeerSockets>* out) {
  std::list<Candidate> cands;
  while (expected_ > 0 || dialedLeft_ > 0) {
    if (cancel_.set())
      return setError(attnRemoteError, "tcp: rank %d aborted while peers connect", ctx_.rank);
    if (deadline_.expired()) return timedOut(*out);
    std::vector<pollfd> fds{{listenFd_, POLLIN, 0}};
    for (auto& d : dialed_) fds.push_back({d.done ? -1 : d.fd, POLLIN, 0});
    for (auto& c : cands) fds.push_back({c.fd, POLLIN, 0});
    if (poll(fds.data(), fds.size(), deadline_.sliceMs(100)) <= 0) continue;

    size_t i = 1;
    for (auto& d : dialed_) {
      if (!fds[i++].revents || d.done) continue;
      while (!d.done) {
        FrameReader::Status st = d.reader.read(d.fd, kMaxSetupFrame);
        if (st == FrameReader::kAgain) break;
        if (st != FrameReader::kFrame)
          return setError(attnRemoteError, "tcp: rank %d: peer %d closed socket %d during the "
                          "handshake (%s)", ctx_.rank, d.peer, d.index,
                          st == FrameReader::kTooLong ? "oversized frame" : "connection closed");
        ATTN_CHECK(onDialedFrame(d, d.reader.body()));
        d.reader.next();
      }
    }
    for (auto it = cands.begin(); it != cands.end(); ++i) {
      bool keep = fds[i].revents == 0;
      while (!keep) {
        FrameReader::Status st = it->reader.read(it->fd, kMaxSetupFrame);
        if (st == FrameReader::kAgain) {
          keep = true;
          break;
        }
        if (st != FrameReader::kFrame) {
          ATTN_INFO(kLogNet, "tcp: rank %d dropped a connection from %s before it was "
                    "authenticated", ctx_.rank, it->where.c_str());
          break;
        }
        keep = onCandidateFrame(*it, it->reader.body(), out);
        it->reader.next();
        if (!keep) break;
      }
      it = keep ? std::next(it) : cands.erase(it);
    }
    if (fds[0].revents) {
      for (;;) {
        int fd = -1;
        ATTN_CHECK(socketAcceptNow(listenFd_, &fd));
        if (fd < 0) break;
        if (cands.size() >= kMaxCandidates) cands.pop_front();  // flooded: the oldest stranger goes
        Candidate& c = cands.emplace_back();
        c.fd = fd;
        c.where = peerAddress(fd, &c.ip);
      }
    }
  }
  return attnSuccess;
}

}  // namespace

attnResult_t establishSockets(const TransportContext& ctx, const std::vector<int>& peers,
                              const TcpOptions& opt, std::vector<PeerSockets>* out) {
  ATTN_REQUIRE(ctx.bootstrap != nullptr, "tcp: no bootstrap");
  Setup setup(ctx, opt);
  return setup.run(peers, out);
}

}  // namespace attn::tcp
