#include "transports/tcp/tcp_setup.h"

#include <poll.h>
#include <unistd.h>

#include <cstring>
#include <list>
#include <map>
#include <string>

#include "src/core/bootstrap.h"
#include "src/core/error.h"
#include "src/core/log.h"

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
  TcpHello hello(int to, int index, int nsocks) const;
  attnResult_t dial(int peer, PeerSockets* ps);
  attnResult_t acceptLower(std::vector<PeerSockets>* out);
  // A complete hello arrived on an accepted socket: true if it was adopted.
  bool adopt(int fd, const std::vector<uint8_t>& body, std::vector<PeerSockets>* out);
  attnResult_t awaitAck(int peer, int fd);

  const TransportContext& ctx_;
  const TcpOptions& opt_;
  Deadline deadline_;
  Cancel cancel_;
  uint64_t commHash_;
  int listenFd_ = -1;
  std::vector<RankSlot> slots_;
  std::map<int, size_t> lowerIndex_;  // lower peer rank -> index in peers
  int expected_ = 0;                  // sockets still to accept
};

TcpHello Setup::hello(int to, int index, int nsocks) const {
  TcpHello h{};
  h.magic = kHelloMagic;
  h.version = kWireVersion;
  std::memcpy(h.secret, ctx_.bootstrap->secret(), 16);
  h.commHash = commHash_;
  h.from = ctx_.rank;
  h.to = to;
  h.index = index;
  h.nsocks = nsocks;
  return h;
}

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

  // Dial first (the hellos fit in socket buffers, so nothing waits on the
  // peer yet), then accept from lower ranks, then collect the acks.
  for (size_t i = 0; i < peers.size(); ++i)
    if (peers[i] > rank) ATTN_CHECK(dial(peers[i], &(*out)[i]));
  ATTN_CHECK(acceptLower(out));
  for (size_t i = 0; i < peers.size(); ++i)
    if (peers[i] > rank)
      for (int fd : (*out)[i].fds) ATTN_CHECK(awaitAck(peers[i], fd));

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
    TcpHello h = hello(peer, k, opt_.nsocks);
    ATTN_CHECK(sendFrame(fd, &h, sizeof(h), deadline_, cancel_, what.c_str()));
  }
  return attnSuccess;
}

bool Setup::adopt(int fd, const std::vector<uint8_t>& body, std::vector<PeerSockets>* out) {
  TcpHello h;
  if (body.size() != sizeof(h)) return false;
  std::memcpy(&h, body.data(), sizeof(h));
  if (h.magic != kHelloMagic || h.version != kWireVersion ||
      !secretsEqual(h.secret, ctx_.bootstrap->secret(), 16) || h.commHash != commHash_ ||
      h.to != ctx_.rank)
    return false;
  auto it = lowerIndex_.find(h.from);
  if (it == lowerIndex_.end()) return false;
  auto& fds = (*out)[it->second].fds;
  if (h.nsocks != int(fds.size()) || h.index < 0 || h.index >= h.nsocks || fds[h.index] >= 0)
    return false;
  TcpAck ack{kAckMagic, 0};
  if (sendFrame(fd, &ack, sizeof(ack), deadline_, cancel_, "tcp: ack") != attnSuccess) return false;
  fds[h.index] = fd;
  --expected_;
  return true;
}

attnResult_t Setup::acceptLower(std::vector<PeerSockets>* out) {
  struct Candidate {
    int fd;
    FrameReader reader;
  };
  std::list<Candidate> cands;
  struct Closer {
    std::list<Candidate>* c;
    ~Closer() {
      for (auto& x : *c) closeSocket(&x.fd);
    }
  } closer{&cands};

  while (expected_ > 0) {
    if (cancel_.set())
      return setError(attnRemoteError, "tcp: rank %d aborted while peers connect", ctx_.rank);
    if (deadline_.expired()) {
      std::string missing;
      for (auto& [p, i] : lowerIndex_)
        for (int fd : (*out)[i].fds)
          if (fd < 0) {
            missing += (missing.empty() ? "" : ", ") + std::to_string(p);
            break;
          }
      return setError(attnTimeout, "tcp: rank %d timed out waiting for peer(s) %s to connect",
                      ctx_.rank, missing.c_str());
    }
    std::vector<pollfd> fds{{listenFd_, POLLIN, 0}};
    for (auto& c : cands) fds.push_back({c.fd, POLLIN, 0});
    if (poll(fds.data(), fds.size(), deadline_.sliceMs(100)) <= 0) continue;
    size_t i = 1;
    for (auto it = cands.begin(); it != cands.end(); ++i) {
      if (!fds[i].revents) { ++it; continue; }
      FrameReader::Status st = it->reader.read(it->fd, kMaxSetupFrame);
      if (st == FrameReader::kAgain) { ++it; continue; }
      if (st == FrameReader::kFrame && adopt(it->fd, it->reader.body(), out)) {
        it->fd = -1;  // now owned by *out
      } else {
        ATTN_INFO(kLogNet, "tcp: rank %d dropped an unauthenticated connection", ctx_.rank);
        closeSocket(&it->fd);
      }
      it = cands.erase(it);
    }
    if (fds[0].revents) {
      for (;;) {
        int fd = -1;
        ATTN_CHECK(socketAcceptNow(listenFd_, &fd));
        if (fd < 0) break;
        if (cands.size() >= kMaxCandidates) {  // flooded: the oldest stranger goes
          closeSocket(&cands.front().fd);
          cands.pop_front();
        }
        cands.push_back(Candidate{fd, FrameReader()});
      }
    }
  }
  return attnSuccess;
}

attnResult_t Setup::awaitAck(int peer, int fd) {
  std::string what = "tcp: rank " + std::to_string(ctx_.rank) + " waiting for peer " +
                     std::to_string(peer) + " to accept";
  std::vector<uint8_t> body;
  ATTN_CHECK(recvFrame(fd, sizeof(TcpAck), &body, deadline_, cancel_, what.c_str()));
  TcpAck ack;
  if (body.size() != sizeof(ack))
    return setError(attnRemoteError, "%s: malformed ack", what.c_str());
  std::memcpy(&ack, body.data(), sizeof(ack));
  if (ack.magic != kAckMagic || ack.status != 0)
    return setError(attnRemoteError, "%s: refused", what.c_str());
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
