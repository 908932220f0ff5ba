// The authentication handshakes (src/core/bootstrap_wire.h for rank <->
// root and rank <-> rank, transports/tcp/tcp_handshake.h for the TCP
// transport's sockets) and the secret's text (src/core/env_secret.h): every
// frame a listener or a dialer reads before it trusts the other side.
//
// The first input byte picks the parser; the rest is the frame. A fuzzer
// cannot forge an HMAC, so the modes that reach what is read after a
// signature checks out build the frame from the input and sign it with the
// harness's secret, as a peer that knows the secret but lies in the fields
// would. Properties: a frame from someone without the secret is never
// accepted; an accepted reply's table has exactly the ranks asked for, each
// a valid address.
#include <arpa/inet.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "tests/fuzz/fuzz_input.h"

#include "src/core/auth.h"
#include "src/core/bootstrap_wire.h"
#include "src/core/env_secret.h"
#include "transports/tcp/tcp_handshake.h"

namespace {

using namespace attn;

constexpr uint8_t kSecret[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
constexpr uint64_t kCommNonce = 0x1234567890abcdefull;
constexpr uint64_t kCommHash = 0xfeedfacecafebeefull;

auth::Nonce nonceOf(uint8_t fill) {
  auth::Nonce n;
  std::memset(n.bytes, fill, sizeof(n.bytes));
  return n;
}

SocketAddress loopback(int port) {
  SocketAddress a;
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_port = htons(uint16_t(port));
  in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::memcpy(&a.storage, &in, sizeof(in));
  a.len = sizeof(in);
  return a;
}

using attn::fuzz::Input;

// The frame exactly as long as the input's rest, so a read past it is seen.
std::unique_ptr<uint8_t[]> frameOf(const Input& in) {
  std::unique_ptr<uint8_t[]> f(new uint8_t[in.n ? in.n : 1]);
  if (in.n) std::memcpy(f.get(), in.p, in.n);
  return f;
}

void rootReply(Input in, bool sign) {
  const int nranks = 1 + in.byte() % 8;
  const boot::RootHello hello =
      boot::makeRootHello(kCommNonce, 0, nranks, 0, loopback(1000), nonceOf(7));
  const auth::Nonce rootNonce = nonceOf(9);
  std::vector<uint8_t> frame;
  if (sign) {  // a root that knows the secret but sends any header and table
    const int32_t status = in.i32() % 8;
    const int32_t claimed = in.byte() % 10;
    const int32_t joined = in.i32();
    std::vector<boot::AddrSlot> table(static_cast<size_t>(claimed));
    for (auto& slot : table) {
      const size_t take = std::min(in.n, sizeof(slot));
      std::memset(&slot, 0, sizeof(slot));
      std::memcpy(&slot, in.p, take);
      in.p += take;
      in.n -= take;
    }
    boot::RootReplyBuilder b(boot::RootStatus(status), claimed, joined,
                             status == boot::kRootOk ? &table : nullptr);
    frame = b.signFor(kSecret, hello, rootNonce);
  } else {
    frame.assign(in.p, in.p + in.n);
  }
  std::unique_ptr<uint8_t[]> f(new uint8_t[frame.size() ? frame.size() : 1]);
  if (!frame.empty()) std::memcpy(f.get(), frame.data(), frame.size());
  boot::RootAnswer answer;
  const boot::ReplyCheck c = boot::parseRootReply(f.get(), frame.size(), kSecret, hello, rootNonce, &answer);
  if (c == boot::ReplyCheck::kOk && !sign) std::abort();  // forged without the secret
  if (c == boot::ReplyCheck::kOk && answer.status == boot::kRootOk) {
    if (answer.addrs.size() != size_t(nranks)) std::abort();
    for (const SocketAddress& a : answer.addrs)
      if (a.family() != AF_INET && a.family() != AF_INET6) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in{data, size};
  const int mode = in.byte() % 14;
  const int self = in.byte() % 8, nranks = 1 + in.byte() % 8;
  std::unique_ptr<uint8_t[]> f = frameOf(in);
  const uint8_t* b = f.get();
  const size_t len = in.n;
  const auth::Nonce theirs = nonceOf(3);
  switch (mode) {
    case 0: {
      boot::RootHello h;
      if (boot::parseRootHello(b, len, kCommNonce, &h) && h.commNonce != kCommNonce) std::abort();
      break;
    }
    case 1: {
      auth::Nonce n;
      (void)boot::parseChallenge(b, len, boot::kRootChallengeMagic, &n);
      (void)boot::parseChallenge(b, len, boot::kPeerChallengeMagic, &n);
      (void)tcp::parseTcpChallenge(b, len, &n);
      break;
    }
    case 2: {
      const boot::RootHello h = boot::makeRootHello(kCommNonce, self, nranks, 0, loopback(1), nonceOf(1));
      if (boot::checkRootProof(b, len, kSecret, h, theirs)) std::abort();  // no MAC by chance
      break;
    }
    case 3: rootReply(in, false); break;
    case 4: rootReply(in, true); break;
    case 5: {
      boot::PeerHello h;
      if (boot::parsePeerHello(b, len, kCommNonce, self, nranks, &h) &&
          (h.to != self || h.from < 0 || h.from >= nranks || h.from == self))
        std::abort();
      break;
    }
    case 6: {
      const boot::PeerHello h = boot::makePeerHello(kCommNonce, 1, 0, nonceOf(1));
      int32_t status;
      if (boot::checkPeerProof(b, len, kSecret, h, theirs)) std::abort();
      if (boot::parsePeerAck(b, len, kSecret, h, theirs, &status)) std::abort();
      break;
    }
    case 7: {  // a signed ack with any status: read back as sent
      const boot::PeerHello h = boot::makePeerHello(kCommNonce, 1, 0, nonceOf(1));
      const int32_t sent = in.i32();
      const boot::PeerAck ack = boot::makePeerAck(kSecret, h, theirs, boot::PeerStatus(sent));
      int32_t status = -1;
      if (!boot::parsePeerAck(reinterpret_cast<const uint8_t*>(&ack), sizeof(ack), kSecret, h, theirs,
                              &status) ||
          status != sent)
        std::abort();
      break;
    }
    case 8: {
      tcp::TcpHello h;
      if (tcp::parseTcpHello(b, len, self, nranks, &h) &&
          (h.to != self || h.from < 0 || h.from >= self || h.index < 0 || h.index >= h.nsocks ||
           h.nsocks > tcp::kMaxSockets))
        std::abort();
      break;
    }
    case 9: {
      const tcp::TcpHello h = tcp::makeTcpHello(0, 1, 0, 2, nonceOf(1));
      int32_t status;
      if (tcp::checkTcpProof(b, len, kSecret, kCommHash, h, theirs)) std::abort();
      if (tcp::parseTcpAck(b, len, kSecret, kCommHash, h, theirs, &status)) std::abort();
      break;
    }
    case 10: {  // a proof for one communicator is not one for another
      const tcp::TcpHello h = tcp::makeTcpHello(0, 1, 0, 2, nonceOf(1));
      const tcp::TcpProof p = tcp::makeTcpProof(kSecret, kCommHash, h, theirs);
      if (!tcp::checkTcpProof(reinterpret_cast<const uint8_t*>(&p), sizeof(p), kSecret, kCommHash, h, theirs))
        std::abort();
      if (tcp::checkTcpProof(reinterpret_cast<const uint8_t*>(&p), sizeof(p), kSecret, kCommHash ^ len, h,
                             theirs) != (len == 0))
        std::abort();
      break;
    }
    default: {
      uint8_t secret[16];
      if (parseSecretHex(reinterpret_cast<const char*>(b), len, secret)) {
        char hex[33];
        for (int i = 0; i < 16; ++i) std::snprintf(hex + 2 * i, 3, "%02x", secret[i]);
        uint8_t again[16];
        if (!parseSecretHex(hex, 32, again) || std::memcmp(again, secret, 16) != 0) std::abort();
      }
      break;
    }
  }
  return 0;
}
