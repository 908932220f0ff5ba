// Builders and parsers of the bootstrap's handshake frames (bootstrap_wire.h).
// Pure functions: no sockets, no state, no logging.
#include "src/core/bootstrap_wire.h"

#include <cstring>

namespace attn::boot {
namespace {

// Role labels: what each proof says about who made it.
constexpr const char* kRankToRootLabel = "attncomm bootstrap v2: rank proves to root";
constexpr const char* kRootReplyLabel = "attncomm bootstrap v2: root reply";
constexpr const char* kPeerDialerLabel = "attncomm bootstrap v2: peer dialer proves";
constexpr const char* kPeerAckLabel = "attncomm bootstrap v2: peer listener ack";
constexpr const char* kEnvNonceLabel = "attncomm bootstrap v2: communicator nonce from secret";

}  // namespace

Challenge makeChallenge(uint32_t magic, const auth::Nonce& nonce) {
  Challenge c;
  std::memset(&c, 0, sizeof(c));
  c.magic = magic;
  std::memcpy(c.nonce, nonce.bytes, sizeof(c.nonce));
  return c;
}

bool parseChallenge(const uint8_t* bytes, size_t len, uint32_t magic, auth::Nonce* out) {
  Challenge c;
  if (!frameAs(bytes, len, &c) || c.magic != magic) return false;
  std::memcpy(out->bytes, c.nonce, sizeof(c.nonce));
  return true;
}

// ---------------------------------------------------------------------------
// Rank <-> root

RootHello makeRootHello(uint64_t commNonce, int rank, int nranks, int timeoutMs,
                        const SocketAddress& listen, const auth::Nonce& nonce) {
  RootHello h;
  std::memset(&h, 0, sizeof(h));
  h.magic = kRootHelloMagic;
  h.version = kWireVersion;
  h.commNonce = commNonce;
  h.rank = rank;
  h.nranks = nranks;
  h.timeoutMs = timeoutMs > 0 ? timeoutMs : 0;
  h.addrLen = serializeAddress(listen, h.addr);
  std::memcpy(h.nonce, nonce.bytes, sizeof(h.nonce));
  return h;
}

bool parseRootHello(const uint8_t* bytes, size_t len, uint64_t commNonce, RootHello* out) {
  RootHello h;
  SocketAddress a;
  if (!frameAs(bytes, len, &h) || h.magic != kRootHelloMagic || h.version != kWireVersion ||
      h.commNonce != commNonce || !deserializeAddress(h.addr, h.addrLen, &a))
    return false;
  *out = h;
  return true;
}

Proof makeRootProof(const uint8_t secret[16], const RootHello& hello, const auth::Nonce& rootNonce) {
  Proof p;
  std::memset(&p, 0, sizeof(p));
  p.magic = kRootProofMagic;
  const auth::Mac m =
      auth::prove(secret, kRankToRootLabel, {auth::bytesOf(hello), auth::bytesOf(rootNonce)});
  std::memcpy(p.mac, m.bytes, sizeof(p.mac));
  return p;
}

bool checkRootProof(const uint8_t* bytes, size_t len, const uint8_t secret[16],
                    const RootHello& hello, const auth::Nonce& rootNonce) {
  Proof p;
  return frameAs(bytes, len, &p) && p.magic == kRootProofMagic &&
         auth::verify(secret, kRankToRootLabel, {auth::bytesOf(hello), auth::bytesOf(rootNonce)},
                      p.mac);
}

size_t rootReplyBound(int nranks) {
  const size_t n = nranks > 0 ? size_t(nranks) : 0;
  return sizeof(RootReply) + n * sizeof(AddrSlot) + auth::kMacBytes;
}

namespace {

auth::Mac replyMac(const uint8_t secret[16], const RootHello& hello, const auth::Nonce& rootNonce,
                   const uint8_t* header, const auth::Digest& tableDigest) {
  return auth::prove(secret, kRootReplyLabel,
                     {auth::bytesOf(hello), auth::bytesOf(rootNonce),
                      auth::Bytes(header, sizeof(RootReply)),
                      auth::Bytes(tableDigest.bytes, sizeof(tableDigest.bytes))});
}

}  // namespace

RootReplyBuilder::RootReplyBuilder(RootStatus status, int32_t nranks, int32_t joined,
                                   const std::vector<AddrSlot>* table) {
  const RootReply r{kRootReplyMagic, status, nranks, joined};
  const size_t tableBytes = table ? table->size() * sizeof(AddrSlot) : 0;
  msg_.resize(sizeof(r) + tableBytes + auth::kMacBytes);
  std::memcpy(msg_.data(), &r, sizeof(r));
  if (tableBytes) std::memcpy(msg_.data() + sizeof(r), table->data(), tableBytes);
  tableDigest_ = auth::sha256(auth::Bytes(msg_.data() + sizeof(r), tableBytes));
}

const std::vector<uint8_t>& RootReplyBuilder::signFor(const uint8_t secret[16],
                                                      const RootHello& hello,
                                                      const auth::Nonce& rootNonce) {
  const auth::Mac m = replyMac(secret, hello, rootNonce, msg_.data(), tableDigest_);
  std::memcpy(msg_.data() + msg_.size() - auth::kMacBytes, m.bytes, auth::kMacBytes);
  return msg_;
}

ReplyCheck parseRootReply(const uint8_t* bytes, size_t len, const uint8_t secret[16],
                          const RootHello& hello, const auth::Nonce& rootNonce, RootAnswer* out) {
  if (bytes == nullptr || len < sizeof(RootReply) + auth::kMacBytes) return ReplyCheck::kMalformed;
  const size_t tableBytes = len - sizeof(RootReply) - auth::kMacBytes;
  const auth::Digest digest = auth::sha256(auth::Bytes(bytes + sizeof(RootReply), tableBytes));
  const auth::Mac want = replyMac(secret, hello, rootNonce, bytes, digest);
  if (!auth::equal(want.bytes, bytes + len - auth::kMacBytes, auth::kMacBytes))
    return ReplyCheck::kForged;
  RootReply r;
  std::memcpy(&r, bytes, sizeof(r));
  if (r.magic != kRootReplyMagic) return ReplyCheck::kMalformed;
  RootAnswer a;
  a.status = r.status;
  a.nranks = r.nranks;
  a.joined = r.joined;
  if (r.status != kRootOk) {
    if (tableBytes != 0) return ReplyCheck::kMalformed;
    *out = std::move(a);
    return ReplyCheck::kOk;
  }
  if (r.nranks != hello.nranks || hello.nranks <= 0 ||
      tableBytes != size_t(hello.nranks) * sizeof(AddrSlot))
    return ReplyCheck::kMalformed;
  a.addrs.resize(size_t(r.nranks));
  for (int i = 0; i < r.nranks; ++i) {
    AddrSlot s;
    std::memcpy(&s, bytes + sizeof(r) + size_t(i) * sizeof(AddrSlot), sizeof(s));
    if (!deserializeAddress(s.addr, s.len, &a.addrs[size_t(i)])) return ReplyCheck::kMalformed;
  }
  *out = std::move(a);
  return ReplyCheck::kOk;
}

// ---------------------------------------------------------------------------
// Rank <-> rank

PeerHello makePeerHello(uint64_t commNonce, int from, int to, const auth::Nonce& nonce) {
  PeerHello h;
  std::memset(&h, 0, sizeof(h));
  h.magic = kPeerHelloMagic;
  h.version = kWireVersion;
  h.commNonce = commNonce;
  h.from = from;
  h.to = to;
  std::memcpy(h.nonce, nonce.bytes, sizeof(h.nonce));
  return h;
}

bool parsePeerHello(const uint8_t* bytes, size_t len, uint64_t commNonce, int self, int nranks,
                    PeerHello* out) {
  PeerHello h;
  if (!frameAs(bytes, len, &h) || h.magic != kPeerHelloMagic || h.version != kWireVersion ||
      h.commNonce != commNonce || h.to != self || h.from < 0 || h.from >= nranks ||
      h.from == self)
    return false;
  *out = h;
  return true;
}

Proof makePeerProof(const uint8_t secret[16], const PeerHello& hello,
                    const auth::Nonce& listenerNonce) {
  Proof p;
  std::memset(&p, 0, sizeof(p));
  p.magic = kPeerProofMagic;
  const auth::Mac m =
      auth::prove(secret, kPeerDialerLabel, {auth::bytesOf(hello), auth::bytesOf(listenerNonce)});
  std::memcpy(p.mac, m.bytes, sizeof(p.mac));
  return p;
}

bool checkPeerProof(const uint8_t* bytes, size_t len, const uint8_t secret[16],
                    const PeerHello& hello, const auth::Nonce& listenerNonce) {
  Proof p;
  return frameAs(bytes, len, &p) && p.magic == kPeerProofMagic &&
         auth::verify(secret, kPeerDialerLabel, {auth::bytesOf(hello), auth::bytesOf(listenerNonce)},
                      p.mac);
}

PeerAck makePeerAck(const uint8_t secret[16], const PeerHello& hello,
                    const auth::Nonce& listenerNonce, PeerStatus status) {
  PeerAck a;
  std::memset(&a, 0, sizeof(a));
  a.magic = kPeerAckMagic;
  a.status = status;
  const int32_t st = status;
  const auth::Mac m = auth::prove(
      secret, kPeerAckLabel, {auth::bytesOf(hello), auth::bytesOf(listenerNonce), auth::bytesOf(st)});
  std::memcpy(a.mac, m.bytes, sizeof(a.mac));
  return a;
}

bool parsePeerAck(const uint8_t* bytes, size_t len, const uint8_t secret[16],
                  const PeerHello& hello, const auth::Nonce& listenerNonce, int32_t* status) {
  PeerAck a;
  if (!frameAs(bytes, len, &a) || a.magic != kPeerAckMagic) return false;
  const int32_t st = a.status;
  if (!auth::verify(secret, kPeerAckLabel,
                    {auth::bytesOf(hello), auth::bytesOf(listenerNonce), auth::bytesOf(st)}, a.mac))
    return false;
  *status = st;
  return true;
}

uint64_t nonceFromSecret(const uint8_t secret[16]) {
  const auth::Mac m = auth::prove(secret, kEnvNonceLabel, {});
  uint64_t n;
  std::memcpy(&n, m.bytes, sizeof(n));
  return n;
}

}  // namespace attn::boot
