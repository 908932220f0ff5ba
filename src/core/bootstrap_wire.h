// Wire formats of the bootstrap: the unique id, the root's hello/reply and the
// rank-to-rank frames. Every message travels as one length-prefixed frame
// (socket.h); fixed-size structs in host byte order (all ranks share one
// architecture), each starting with a magic so strangers are told apart.
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/core/socket.h"

namespace attn::boot {

constexpr uint32_t kIdMagic = 0x41744944;         // "AtID"
constexpr uint32_t kIdVersion = 1;
constexpr uint32_t kRootHelloMagic = 0x41745248;  // "AtRH"
constexpr uint32_t kRootReplyMagic = 0x41745252;  // "AtRR"
constexpr uint32_t kPeerHelloMagic = 0x41745048;  // "AtPH"
constexpr uint32_t kWireVersion = 1;

// Bound on any frame from a peer that has not proven the secret yet.
constexpr size_t kMaxUnauthFrame = 64 * 1024;
// Bound on a data frame between authenticated ranks.
constexpr size_t kMaxDataFrame = size_t(1) << 30;
// Unauthenticated connections a listener keeps at once; past it the oldest
// is closed to make room.
constexpr size_t kMaxPendingConns = 256;

// A rank's first frame to the root.
struct RootHello {
  uint32_t magic;
  uint32_t version;
  uint8_t secret[16];
  uint64_t nonce;
  int32_t rank;
  int32_t nranks;
  int32_t timeoutMs;  // the rank's own timeout (0: none); bounds the root
  uint32_t addrLen;
  uint8_t addr[kAddressBytes];  // where the rank listens
};

enum RootStatus : int32_t {
  kRootOk = 0,
  kRootDuplicateRank = 1,
  kRootSizeMismatch = 2,
  kRootTimedOut = 3,
};

// The root's answer; with kRootOk it is followed by nranks AddrSlots.
struct RootReply {
  uint32_t magic;
  int32_t status;
  int32_t nranks;
  int32_t joined;  // ranks that had joined (for timeout messages)
};

struct AddrSlot {
  uint32_t len;
  uint8_t addr[kAddressBytes];
};

// First frame on a rank-to-rank connection.
struct PeerHello {
  uint32_t magic;
  uint32_t version;
  uint8_t secret[16];
  uint64_t nonce;
  int32_t from;
  int32_t to;
};

// Header of every later frame on a rank-to-rank connection; the payload
// follows in the same frame.
enum FrameKind : uint32_t { kUserFrame = 0, kInternalFrame = 1 };
struct DataHeader {
  uint32_t kind;
  uint32_t tag;
};

// Nonce of communicators whose id is derived from (address, secret) alone
// (attnCommInitFromEnv): every rank must compute the same value.
uint64_t nonceFromSecret(const uint8_t secret[16]);

}  // namespace attn::boot
