// Wire formats of the bootstrap: the unique id, the rank <-> root handshake
// and the rank <-> rank frames. Every message travels as one length-prefixed
// frame (socket.h); fixed-size structs without padding, in host byte order
// (all ranks share one architecture), each starting with a magic so
// strangers are told apart.
//
// Both handshakes follow auth.h's pattern; the secret itself never travels:
//   rank -> root:  RootHello (claims + rank nonce)
//   root -> rank:  Challenge (root nonce)
//   rank -> root:  Proof     (HMAC over role, hello, root nonce)
//   root -> rank:  RootReply [+ AddrSlot x nranks when kRootOk] + HMAC over
//                  (role, hello, root nonce, the header, the table's
//                  SHA-256): a rank trusts the table only once this checks out.
//   rank -> rank:  PeerHello, Challenge, Proof, PeerAck (signed status), then
//                  DataHeader frames.
//
// The parsers below are pure functions over (bytes, length) and the context
// they need, so fuzzers can drive them directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "attncomm.h"
#include "src/core/auth.h"
#include "src/core/socket.h"

namespace attn::boot {

constexpr uint32_t kIdMagic = 0x41744944;             // "AtID"
constexpr uint32_t kIdVersion = 1;
constexpr uint32_t kRootHelloMagic = 0x41745248;      // "AtRH"
constexpr uint32_t kRootChallengeMagic = 0x41745243;  // "AtRC"
constexpr uint32_t kRootProofMagic = 0x41745250;      // "AtRP"
constexpr uint32_t kRootReplyMagic = 0x41745252;      // "AtRR"
constexpr uint32_t kPeerHelloMagic = 0x41745048;      // "AtPH"
constexpr uint32_t kPeerChallengeMagic = 0x41745043;  // "AtPC"
constexpr uint32_t kPeerProofMagic = 0x41745050;      // "AtPP"
constexpr uint32_t kPeerAckMagic = 0x41745041;        // "AtPA"
// 2: challenge-response (version 1 sent the raw secret).
constexpr uint32_t kWireVersion = 2;

// Largest communicator (the library's, attncomm.h); the root sizes its
// tables from the first authenticated hello, so it checks this first.
constexpr int kMaxRanks = ATTN_MAX_NRANKS;
// Bound on any frame from a peer that has not proven the secret yet (the
// handshake frames are under 200 bytes).
constexpr size_t kMaxUnauthFrame = 4096;
// Bound on the payload of a data frame between authenticated ranks. The
// largest message the library sends is one slot of an allGather, and the
// largest slot is a UCX worker address (ucx_address_exchange.cc caps those
// at 1 MiB); everything else is a few hundred bytes.
constexpr size_t kMaxDataFrame = size_t(1) << 20;
// What one peer may have queued, unread, in a rank's mailbox. In a ring
// allGather the previous rank can run up to about two allGathers ahead of a
// slow rank (2 x (nranks - 1) frames, each one slot); setup messages are a
// handful. The frame bound covers that for kMaxRanks; the byte bound covers
// allGathers of up to 128 MiB in all (4 KiB UCX addresses from 32768
// ranks). Past either, the peer's connection is cut and waits for it fail.
constexpr size_t kMaxQueuedFrames = size_t(1) << 18;
constexpr size_t kMaxQueuedBytes = size_t(256) << 20;
// Unauthenticated connections a listener keeps at once; past it the oldest
// is closed to make room.
constexpr size_t kMaxPendingConns = 256;

// The listener's half of the challenge (root, peer).
struct Challenge {
  uint32_t magic;
  uint8_t nonce[auth::kNonceBytes];
};
// The dialer's proof of the secret.
struct Proof {
  uint32_t magic;
  uint8_t mac[auth::kMacBytes];
};

// ---------------------------------------------------------------------------
// Rank <-> root

struct RootHello {
  uint32_t magic;
  uint32_t version;
  uint64_t commNonce;  // the unique id's nonce (which communicator)
  int32_t rank;
  int32_t nranks;
  int32_t timeoutMs;  // the rank's own timeout (0: none); bounds the root
  uint32_t addrLen;
  uint8_t addr[kAddressBytes];      // where the rank listens
  uint8_t nonce[auth::kNonceBytes];  // the rank's
};

enum RootStatus : int32_t {
  kRootOk = 0,
  kRootDuplicateRank = 1,
  kRootSizeMismatch = 2,
  kRootTimedOut = 3,
  kRootBadSize = 4,  // nranks outside [1, kMaxRanks] or rank outside [0, nranks)
  kRootFailed = 5,   // the root could not go on (out of memory, ...)
};

// The root's answer: this header, nranks AddrSlots with kRootOk, then the
// root's HMAC.
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

// What a rank learns from a reply whose signature checked out.
struct RootAnswer {
  int32_t status = kRootFailed;
  int32_t nranks = 0;
  int32_t joined = 0;
  std::vector<SocketAddress> addrs;  // with kRootOk: every rank's listen address
};

enum class ReplyCheck { kOk, kMalformed, kForged };

RootHello makeRootHello(uint64_t commNonce, int rank, int nranks, int timeoutMs,
                        const SocketAddress& listen, const auth::Nonce& nonce);
Challenge makeChallenge(uint32_t magic, const auth::Nonce& nonce);
// The rank's proof, answering the root's challenge.
Proof makeRootProof(const uint8_t secret[16], const RootHello& hello, const auth::Nonce& rootNonce);
// The root's reply, built once and signed for each rank: the signature
// covers (role, that rank's hello, its challenge nonce, the header, the
// table's SHA-256), so the table is hashed once, not once per rank.
class RootReplyBuilder {
 public:
  // `table` (nranks slots) with kRootOk only.
  RootReplyBuilder(RootStatus status, int32_t nranks, int32_t joined,
                   const std::vector<AddrSlot>* table);
  // The whole frame for the rank that sent `hello` and was challenged with
  // `rootNonce` (valid until the next call).
  const std::vector<uint8_t>& signFor(const uint8_t secret[16], const RootHello& hello,
                                      const auth::Nonce& rootNonce);

 private:
  std::vector<uint8_t> msg_;
  auth::Digest tableDigest_;
};
// Largest reply frame a rank of `nranks` accepts.
size_t rootReplyBound(int nranks);

// Structure of a hello for communicator `commNonce` (size, magic, version,
// address); rank and nranks are judged by the root after the proof.
bool parseRootHello(const uint8_t* bytes, size_t len, uint64_t commNonce, RootHello* out);
// A challenge with `magic` (kRootChallengeMagic, kPeerChallengeMagic).
bool parseChallenge(const uint8_t* bytes, size_t len, uint32_t magic, auth::Nonce* out);
// True when the frame is the rank's valid proof for (hello, rootNonce).
bool checkRootProof(const uint8_t* bytes, size_t len, const uint8_t secret[16],
                    const RootHello& hello, const auth::Nonce& rootNonce);
// Checks the root's signature first (kForged when it does not match), then
// the header and, with kRootOk, that the table has hello.nranks valid
// addresses.
ReplyCheck parseRootReply(const uint8_t* bytes, size_t len, const uint8_t secret[16],
                          const RootHello& hello, const auth::Nonce& rootNonce, RootAnswer* out);

// ---------------------------------------------------------------------------
// Rank <-> rank

struct PeerHello {
  uint32_t magic;
  uint32_t version;
  uint64_t commNonce;
  int32_t from;
  int32_t to;
  uint8_t nonce[auth::kNonceBytes];  // the dialer's
};

enum PeerStatus : int32_t {
  kPeerOk = 0,
  kPeerBusy = 1,     // a connection from that rank is still open here: retry
  kPeerRefused = 2,  // that rank is bound to another address, or was cut off
};

// The listener's answer, signed over (role, hello, its nonce, status).
struct PeerAck {
  uint32_t magic;
  int32_t status;
  uint8_t mac[auth::kMacBytes];
};

PeerHello makePeerHello(uint64_t commNonce, int from, int to, const auth::Nonce& nonce);
Proof makePeerProof(const uint8_t secret[16], const PeerHello& hello,
                    const auth::Nonce& listenerNonce);
PeerAck makePeerAck(const uint8_t secret[16], const PeerHello& hello,
                    const auth::Nonce& listenerNonce, PeerStatus status);

// A hello to rank `self` of `nranks` for communicator `commNonce`, from
// another rank.
bool parsePeerHello(const uint8_t* bytes, size_t len, uint64_t commNonce, int self, int nranks,
                    PeerHello* out);
bool checkPeerProof(const uint8_t* bytes, size_t len, const uint8_t secret[16],
                    const PeerHello& hello, const auth::Nonce& listenerNonce);
// False when malformed or not signed with the secret; else *status.
bool parsePeerAck(const uint8_t* bytes, size_t len, const uint8_t secret[16],
                  const PeerHello& hello, const auth::Nonce& listenerNonce, int32_t* status);

// Header of every later frame on a rank-to-rank connection; the payload
// follows in the same frame.
enum FrameKind : uint32_t { kUserFrame = 0, kInternalFrame = 1 };
struct DataHeader {
  uint32_t kind;
  uint32_t tag;
};

// Nonce of communicators whose id is derived from (address, secret) alone
// (attnCommInitFromEnv): every rank must compute the same value. A keyed
// hash, so the nonce (which travels in hellos) tells nothing of the secret.
uint64_t nonceFromSecret(const uint8_t secret[16]);

static_assert(sizeof(Challenge) == 4 + auth::kNonceBytes && sizeof(Proof) == 4 + auth::kMacBytes);
static_assert(sizeof(RootHello) == 32 + kAddressBytes + auth::kNonceBytes, "no padding");
static_assert(sizeof(PeerHello) == 24 + auth::kNonceBytes, "no padding");
static_assert(sizeof(PeerAck) == 8 + auth::kMacBytes, "no padding");

}  // namespace attn::boot
