// Wire formats of the TCP transport.
//
// Connection setup: the lower rank dials the higher one K times; on each
// socket (frames length-prefixed, socket.h) the dialer sends a TcpHello
// (ranks, socket index, its nonce), the acceptor a TcpChallenge (its nonce),
// the dialer a TcpProof and the acceptor a TcpAck: each proves the
// bootstrap secret by an HMAC over its role, the hello, both nonces and the
// communicator's hash (src/core/auth.h; tcp_handshake.h builds and parses
// them). Neither the secret nor the hash travels.
//
// Data: every message is sent as one or more chunks, each a ChunkHeader
// followed by `len` payload bytes. Small messages are one chunk on one
// socket; large ones are split into stripes spread over the K sockets. The
// receiver matches `seq` (per direction, counting from 0) with its posted
// receives in order and writes each stripe at `offset` of the user buffer.
#pragma once

#include <cstddef>
#include <cstdint>

namespace attn::tcp {

constexpr uint32_t kHelloMagic = 0x41745448;      // "AtTH"
constexpr uint32_t kChallengeMagic = 0x41745443;  // "AtTC"
constexpr uint32_t kProofMagic = 0x41745450;      // "AtTP"
constexpr uint32_t kAckMagic = 0x41745441;        // "AtTA"
// 2: challenge-response (version 1 sent the raw secret).
constexpr uint32_t kWireVersion = 2;
constexpr int kMaxSockets = 64;
constexpr size_t kTcpNonceBytes = 32;  // auth::kNonceBytes
constexpr size_t kTcpMacBytes = 32;    // auth::kMacBytes

struct TcpHello {
  uint32_t magic;
  uint32_t version;
  int32_t from;
  int32_t to;
  int32_t index;   // which of the nsocks sockets this is
  int32_t nsocks;  // chosen by the dialling (lower) rank
  uint8_t nonce[kTcpNonceBytes];  // the dialer's
};

struct TcpChallenge {
  uint32_t magic;
  uint8_t nonce[kTcpNonceBytes];  // the acceptor's
};

struct TcpProof {
  uint32_t magic;
  uint8_t mac[kTcpMacBytes];
};

enum TcpAckStatus : int32_t {
  kTcpAccepted = 0,
  kTcpRefused = 1,  // not expected from that rank, a duplicate, or from elsewhere
};

struct TcpAck {
  uint32_t magic;
  int32_t status;  // TcpAckStatus
  uint8_t mac[kTcpMacBytes];  // the acceptor's proof, over the status too
};

// Stripe j of message `seq` travels on socket (seq + j) % K (sockets
// numbered by TcpHello.index), at most one stripe per socket, so every
// message has a chunk on socket seq % K and each socket's chunks come in
// increasing seq order. The receiver enforces this, and that a message's
// chunks are disjoint ranges of it (tcp_chunk_check.h).
struct ChunkHeader {
  uint64_t seq;     // message number in this direction
  uint64_t total;   // message size
  uint64_t offset;  // where this chunk's payload goes in the message
  uint64_t len;     // payload bytes following this header
};

}  // namespace attn::tcp
