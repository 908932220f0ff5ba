// Raw clients of the bootstrap's handshakes (src/core/bootstrap_wire.h) for
// tests that play a rank, an impostor or a replaying attacker: they speak
// the protocol through the library's own builders, with whatever secret,
// claims and source address the test chooses.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "src/core/auth.h"
#include "src/core/bootstrap_wire.h"
#include "src/core/socket.h"

namespace attn::testing {

// A blocking TCP connection to `to`, from `fromIp` when given (e.g.
// "127.0.0.2" to look like another host on loopback); -1 on failure.
inline int dialFrom(const SocketAddress& to, const char* fromIp = nullptr) {
  const int fd = socket(to.family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (fromIp != nullptr) {
    SocketAddress src;
    if (parseAddress(std::string(fromIp) + ":0", &src) != attnSuccess ||
        bind(fd, src.sa(), src.len) != 0) {
      ::close(fd);
      return -1;
    }
  }
  if (connect(fd, to.sa(), to.len) != 0) {
    ::close(fd);
    return -1;
  }
  setNoDelay(fd);
  return fd;
}

inline bool sendBody(int fd, const void* body, size_t n) {
  return sendFrame(fd, body, n, Deadline::afterMs(5000), Cancel{}, "test client") == attnSuccess;
}

// The next frame, or false when the other side closed (or said nothing
// within timeoutMs).
inline bool recvBody(int fd, std::vector<uint8_t>* body, size_t bound, int timeoutMs = 5000) {
  return recvFrame(fd, bound, body, Deadline::afterMs(timeoutMs), Cancel{}, "test client") ==
         attnSuccess;
}

// The rank's side of the root handshake on a connected socket.
struct RootExchange {
  boot::RootHello hello{};
  auth::Nonce rootNonce{};
  std::vector<uint8_t> challenge;  // the challenge frame as received
  std::vector<uint8_t> proof;      // the proof frame as sent
  bool challenged = false;         // a well-formed challenge arrived
  bool replied = false;            // a reply frame arrived after the proof
  std::vector<uint8_t> reply;
};

inline RootExchange rootHandshake(int fd, const uint8_t secret[16], uint64_t commNonce, int rank,
                                  int nranks, const SocketAddress& listen,
                                  int replyTimeoutMs = 10000) {
  RootExchange x;
  auth::Nonce mine;
  auth::freshNonce(&mine);
  x.hello = boot::makeRootHello(commNonce, rank, nranks, 0, listen, mine);
  if (!sendBody(fd, &x.hello, sizeof(x.hello)) ||
      !recvBody(fd, &x.challenge, boot::kMaxUnauthFrame) ||
      !boot::parseChallenge(x.challenge.data(), x.challenge.size(), boot::kRootChallengeMagic,
                            &x.rootNonce))
    return x;
  x.challenged = true;
  const boot::Proof p = boot::makeRootProof(secret, x.hello, x.rootNonce);
  x.proof.assign(reinterpret_cast<const uint8_t*>(&p), reinterpret_cast<const uint8_t*>(&p) + sizeof(p));
  if (!sendBody(fd, &p, sizeof(p))) return x;
  x.replied = recvBody(fd, &x.reply, boot::rootReplyBound(boot::kMaxRanks), replyTimeoutMs);
  return x;
}

// The dialer's side of the peer handshake; the listener's signed status, or
// -1 when it closed the connection or its answer is not signed with `secret`.
inline int peerHandshake(int fd, const uint8_t secret[16], uint64_t commNonce, int from, int to) {
  auth::Nonce mine, theirs;
  auth::freshNonce(&mine);
  const boot::PeerHello h = boot::makePeerHello(commNonce, from, to, mine);
  std::vector<uint8_t> body;
  if (!sendBody(fd, &h, sizeof(h)) || !recvBody(fd, &body, boot::kMaxUnauthFrame) ||
      !boot::parseChallenge(body.data(), body.size(), boot::kPeerChallengeMagic, &theirs))
    return -1;
  const boot::Proof p = boot::makePeerProof(secret, h, theirs);
  int32_t status = -1;
  if (!sendBody(fd, &p, sizeof(p)) || !recvBody(fd, &body, sizeof(boot::PeerAck)) ||
      !boot::parsePeerAck(body.data(), body.size(), secret, h, theirs, &status))
    return -1;
  return status;
}

// Everything that arrives on connections to `listenFd` (non-blocking, any
// number of them) for `ms`, concatenated; the first complete frame on each
// is answered with `answer` (a frame body) when not empty, so a dialer that
// waits for a challenge goes on to its next step.
inline std::vector<uint8_t> captureConnections(int listenFd, int ms,
                                               const std::vector<uint8_t>& answer = {}) {
  struct Conn {
    int fd;
    std::vector<uint8_t> got;
    bool answered;
  };
  std::vector<Conn> conns;
  const Deadline end = Deadline::afterMs(ms);
  while (!end.expired()) {
    std::vector<pollfd> fds{{listenFd, POLLIN, 0}};
    for (auto& c : conns) fds.push_back({c.fd, POLLIN, 0});
    if (poll(fds.data(), fds.size(), end.sliceMs(20)) <= 0) continue;
    for (size_t i = 0; i < conns.size(); ++i) {
      Conn& c = conns[i];
      if (c.fd < 0 || !fds[i + 1].revents) continue;
      uint8_t buf[4096];
      const ssize_t n = ::recv(c.fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n <= 0) {
        ::close(c.fd);
        c.fd = -1;
        continue;
      }
      c.got.insert(c.got.end(), buf, buf + n);
      uint32_t len = 0;
      if (!c.answered && !answer.empty() && c.got.size() >= 4 &&
          (std::memcpy(&len, c.got.data(), 4), c.got.size() >= 4 + size_t(len))) {
        c.answered = true;
        sendBody(c.fd, answer.data(), answer.size());
      }
    }
    if (fds[0].revents) {
      int fd = -1;
      while (socketAcceptNow(listenFd, &fd) == attnSuccess && fd >= 0) conns.push_back({fd, {}, false});
    }
  }
  std::vector<uint8_t> all;
  for (auto& c : conns) {
    if (c.fd >= 0) ::close(c.fd);
    all.insert(all.end(), c.got.begin(), c.got.end());
  }
  return all;
}

inline bool containsBytes(const std::vector<uint8_t>& hay, const uint8_t* needle, size_t n) {
  return std::search(hay.begin(), hay.end(), needle, needle + n) != hay.end();
}

// A challenge frame body with `magic` and a random nonce.
inline std::vector<uint8_t> challengeBody(uint32_t magic) {
  auth::Nonce n;
  auth::freshNonce(&n);
  const boot::Challenge c = boot::makeChallenge(magic, n);
  const auto* p = reinterpret_cast<const uint8_t*>(&c);
  return std::vector<uint8_t>(p, p + sizeof(c));
}

}  // namespace attn::testing
