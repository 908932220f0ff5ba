// Builders and parsers of the TCP handshake frames (tcp_handshake.h). Pure
// functions: no sockets, no state, no logging.
#include "transports/tcp/tcp_handshake.h"

#include <cstring>

#include "src/core/socket.h"

namespace attn::tcp {
namespace {

constexpr const char* kDialerLabel = "attncomm tcp v2: dialer proves";
constexpr const char* kAckLabel = "attncomm tcp v2: acceptor ack";

}  // namespace

TcpHello makeTcpHello(int from, int to, int index, int nsocks, const auth::Nonce& nonce) {
  TcpHello h;
  std::memset(&h, 0, sizeof(h));
  h.magic = kHelloMagic;
  h.version = kWireVersion;
  h.from = from;
  h.to = to;
  h.index = index;
  h.nsocks = nsocks;
  std::memcpy(h.nonce, nonce.bytes, sizeof(h.nonce));
  return h;
}

TcpChallenge makeTcpChallenge(const auth::Nonce& nonce) {
  TcpChallenge c;
  std::memset(&c, 0, sizeof(c));
  c.magic = kChallengeMagic;
  std::memcpy(c.nonce, nonce.bytes, sizeof(c.nonce));
  return c;
}

TcpProof makeTcpProof(const uint8_t secret[16], uint64_t commHash, const TcpHello& hello,
                      const auth::Nonce& acceptorNonce) {
  TcpProof p;
  std::memset(&p, 0, sizeof(p));
  p.magic = kProofMagic;
  const auth::Mac m = auth::prove(
      secret, kDialerLabel, {auth::bytesOf(commHash), auth::bytesOf(hello), auth::bytesOf(acceptorNonce)});
  std::memcpy(p.mac, m.bytes, sizeof(p.mac));
  return p;
}

TcpAck makeTcpAck(const uint8_t secret[16], uint64_t commHash, const TcpHello& hello,
                  const auth::Nonce& acceptorNonce, TcpAckStatus status) {
  TcpAck a;
  std::memset(&a, 0, sizeof(a));
  a.magic = kAckMagic;
  a.status = status;
  const int32_t st = status;
  const auth::Mac m = auth::prove(secret, kAckLabel,
                                  {auth::bytesOf(commHash), auth::bytesOf(hello),
                                   auth::bytesOf(acceptorNonce), auth::bytesOf(st)});
  std::memcpy(a.mac, m.bytes, sizeof(a.mac));
  return a;
}

bool parseTcpHello(const uint8_t* bytes, size_t len, int self, int nranks, TcpHello* out) {
  TcpHello h;
  if (!frameAs(bytes, len, &h) || h.magic != kHelloMagic || h.version != kWireVersion ||
      h.to != self || self >= nranks || h.from < 0 || h.from >= self || h.nsocks < 1 ||
      h.nsocks > kMaxSockets || h.index < 0 || h.index >= h.nsocks)
    return false;
  *out = h;
  return true;
}

bool parseTcpChallenge(const uint8_t* bytes, size_t len, auth::Nonce* out) {
  TcpChallenge c;
  if (!frameAs(bytes, len, &c) || c.magic != kChallengeMagic) return false;
  std::memcpy(out->bytes, c.nonce, sizeof(c.nonce));
  return true;
}

bool checkTcpProof(const uint8_t* bytes, size_t len, const uint8_t secret[16], uint64_t commHash,
                   const TcpHello& hello, const auth::Nonce& acceptorNonce) {
  TcpProof p;
  return frameAs(bytes, len, &p) && p.magic == kProofMagic &&
         auth::verify(secret, kDialerLabel,
                      {auth::bytesOf(commHash), auth::bytesOf(hello), auth::bytesOf(acceptorNonce)},
                      p.mac);
}

bool parseTcpAck(const uint8_t* bytes, size_t len, const uint8_t secret[16], uint64_t commHash,
                 const TcpHello& hello, const auth::Nonce& acceptorNonce, int32_t* status) {
  TcpAck a;
  if (!frameAs(bytes, len, &a) || a.magic != kAckMagic) return false;
  const int32_t st = a.status;
  if (!auth::verify(secret, kAckLabel,
                    {auth::bytesOf(commHash), auth::bytesOf(hello), auth::bytesOf(acceptorNonce),
                     auth::bytesOf(st)},
                    a.mac))
    return false;
  *status = st;
  return true;
}

}  // namespace attn::tcp
