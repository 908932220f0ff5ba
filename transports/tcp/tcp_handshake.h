// The TCP transport's connection handshake (tcp_wire.h): builders, and
// parsers that are pure functions over (bytes, length) and the context they
// need, so fuzzers can drive them directly.
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/core/auth.h"
#include "transports/tcp/tcp_wire.h"

namespace attn::tcp {

static_assert(kTcpNonceBytes == auth::kNonceBytes && kTcpMacBytes == auth::kMacBytes);
static_assert(sizeof(TcpHello) == 24 + kTcpNonceBytes, "no padding");
static_assert(sizeof(TcpAck) == 8 + kTcpMacBytes, "no padding");

TcpHello makeTcpHello(int from, int to, int index, int nsocks, const auth::Nonce& nonce);
TcpChallenge makeTcpChallenge(const auth::Nonce& nonce);
// The dialer's proof: (role, commHash, hello, acceptor's nonce).
TcpProof makeTcpProof(const uint8_t secret[16], uint64_t commHash, const TcpHello& hello,
                      const auth::Nonce& acceptorNonce);
// The acceptor's signed answer: (role, commHash, hello, its nonce, status).
TcpAck makeTcpAck(const uint8_t secret[16], uint64_t commHash, const TcpHello& hello,
                  const auth::Nonce& acceptorNonce, TcpAckStatus status);

// A hello to rank `self` of `nranks` from a lower rank, with a socket index
// below nsocks <= kMaxSockets.
bool parseTcpHello(const uint8_t* bytes, size_t len, int self, int nranks, TcpHello* out);
bool parseTcpChallenge(const uint8_t* bytes, size_t len, auth::Nonce* out);
// True when the frame is the dialer's valid proof for (hello, acceptorNonce).
bool checkTcpProof(const uint8_t* bytes, size_t len, const uint8_t secret[16], uint64_t commHash,
                   const TcpHello& hello, const auth::Nonce& acceptorNonce);
// False when malformed or not signed with the secret; else *status.
bool parseTcpAck(const uint8_t* bytes, size_t len, const uint8_t secret[16], uint64_t commHash,
                 const TcpHello& hello, const auth::Nonce& acceptorNonce, int32_t* status);

}  // namespace attn::tcp
