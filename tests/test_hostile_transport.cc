// Peers that break the transports' protocols: overlapping, oversized,
// out-of-order, wrapped and truncated frames on TCP (a socketpair far end
// the test writes, and a real connection whose far end the test takes
// over), and bad slot and segment headers, a busy flag held forever and a
// lying tail in real shared-memory segments. Every case: the request fails
// with attnRemoteError naming the peer (attnInvalidUsage for a genuinely
// too-small receive), nothing hangs, and the guard bytes around the posted
// buffers are untouched. Plus the pure header checks themselves, the
// PR_SET_PTRACER decision and ATTN_TIMEOUT_MS out of range.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "src/core/config.h"
#include "src/core/error.h"
#include "src/core/shareable_memory.h"
#include "src/core/transport.h"
#include "tests/support/fake_bootstrap.h"
#include "tests/support/guarded_buffer.h"
#include "tests/support/shm_far_end.h"
#include "tests/support/tcp_far_end.h"
#include "tests/support/transport_harness.h"
#include "transports/shm/shm_header_check.h"
#include "transports/shm/shm_process.h"
#include "transports/shm/shm_transport.h"
#include "transports/tcp/tcp_chunk_check.h"
#include "transports/tcp/tcp_connection.h"
#include "transports/tcp/tcp_transport.h"

namespace attn {
namespace {

using testing::GuardedBuffer;
using testing::TcpFarEnd;

constexpr int kShortMs = 10000;  // bound on a wait that must not hang (not a timing)

bool names(const Request& q, const char* who) {
  return q.message.find(who) != std::string::npos;
}

// A request that the hostile peer must have failed: code, the peer's name.
#define EXPECT_FAILED_BY(q, code, who)                                    \
  do {                                                                    \
    EXPECT_EQ((q).state.load(), Request::kFailed) << (q).message;         \
    EXPECT_EQ((q).error, (code)) << (q).message;                          \
    EXPECT_TRUE(names((q), (who))) << "does not name " << (who) << ": " << (q).message; \
  } while (0)

// ===========================================================================
// The pure checks

TEST(TcpChunkCheck, SocketWindowFollowsTheStripePlacement) {
  // Two sockets: message m's first chunk is on socket m % 2.
  tcp::SocketSeqWindow w0, w1;
  EXPECT_EQ(w0.admit(0, 0, 2), tcp::ChunkVerdict::kOk);
  EXPECT_EQ(w1.admit(0, 1, 2), tcp::ChunkVerdict::kOk);  // stripe 1 of message 0
  EXPECT_EQ(w1.admit(1, 1, 2), tcp::ChunkVerdict::kOk);
  EXPECT_EQ(w0.admit(2, 0, 2), tcp::ChunkVerdict::kOk);  // message 1 had no stripe here
  EXPECT_EQ(w0.admit(2, 0, 2), tcp::ChunkVerdict::kSeqBehind);  // duplicate
  EXPECT_EQ(w0.admit(1, 0, 2), tcp::ChunkVerdict::kSeqBehind);  // reordered
  EXPECT_EQ(w0.admit(5, 0, 2), tcp::ChunkVerdict::kSeqAhead);   // skips message 4, ours
  EXPECT_EQ(w0.admit(4, 0, 2), tcp::ChunkVerdict::kOk);
  tcp::SocketSeqWindow first;
  EXPECT_EQ(first.admit(1, 0, 2), tcp::ChunkVerdict::kSeqAhead);  // message 0 starts here
  tcp::SocketSeqWindow one;
  EXPECT_EQ(one.admit(1, 0, 1), tcp::ChunkVerdict::kSeqAhead);
  EXPECT_EQ(one.admit(UINT64_MAX, 0, 1), tcp::ChunkVerdict::kSeqAhead);
}

tcp::ChunkHeader hdr(uint64_t total, uint64_t offset, uint64_t len) {
  return tcp::ChunkHeader{0, total, offset, len};
}

TEST(TcpChunkCheck, ClaimsAreDisjointAndInsideTheMessage) {
  using V = tcp::ChunkVerdict;
  tcp::MessageClaims c;
  EXPECT_EQ(c.claim(hdr(100, 0, 40), 100, 2), V::kOk);
  EXPECT_EQ(c.claim(hdr(100, 30, 20), 100, 2), V::kOverlap);
  EXPECT_EQ(c.claim(hdr(100, 0, 40), 100, 2), V::kOverlap);  // duplicate
  EXPECT_EQ(c.claim(hdr(90, 40, 50), 100, 2), V::kTotalChanged);
  EXPECT_EQ(c.claim(hdr(100, 40, 61), 100, 2), V::kBadRange);
  EXPECT_EQ(c.claim(hdr(100, UINT64_MAX - 10, 20), 100, 2), V::kBadRange);  // wraps
  EXPECT_EQ(c.claim(hdr(100, 40, 0), 100, 2), V::kBadRange);  // empty, message not
  EXPECT_EQ(c.claim(hdr(100, 40, 60), 100, 2), V::kOk);
  EXPECT_EQ(c.claimed(), 100u);
  EXPECT_EQ(c.claim(hdr(100, 99, 1), 100, 3), V::kOverlap);
  EXPECT_EQ(c.claimed(), 100u);  // a refused chunk claims nothing

  tcp::MessageClaims big;
  EXPECT_EQ(big.claim(hdr(1000, 0, 10), 999, 2), V::kTruncated);
  EXPECT_EQ(big.claim(hdr(UINT64_MAX, 0, 10), SIZE_MAX, 2), V::kBadRange);

  tcp::MessageClaims many;  // more chunks than sockets
  EXPECT_EQ(many.claim(hdr(30, 0, 10), 30, 2), V::kOk);
  EXPECT_EQ(many.claim(hdr(30, 10, 10), 30, 2), V::kOk);
  EXPECT_EQ(many.claim(hdr(30, 20, 10), 30, 2), V::kTooManyChunks);

  tcp::MessageClaims wide;  // beyond the inline ranges
  for (uint64_t i = 0; i < 8; ++i) EXPECT_EQ(wide.claim(hdr(80, i * 10, 10), 80, 8), V::kOk);
  EXPECT_EQ(wide.claim(hdr(80, 75, 1), 80, 9), V::kOverlap);

  tcp::MessageClaims empty;
  EXPECT_EQ(empty.claim(hdr(0, 0, 0), 0, 2), V::kOk);
  EXPECT_EQ(empty.claim(hdr(0, 0, 0), 0, 2), V::kOverlap);
}

shm::SlotView inlineSlot(uint64_t msg, uint64_t bytes, uint64_t offset, uint64_t chunk) {
  shm::SlotView v{};
  v.msgIndex = msg;
  v.msgBytes = bytes;
  v.offset = offset;
  v.chunkBytes = chunk;
  v.kind = shm::kSlotInline;
  return v;
}

TEST(ShmHeaderCheck, SlotsAreCheckedAgainstTheReceive) {
  using V = shm::SlotVerdict;
  const shm::SlotExpect fresh{3, false, 0, 0, 10000, 4096, shm::kDirectNone};
  EXPECT_EQ(shm::checkSlot(inlineSlot(3, 10000, 0, 4096), fresh), V::kOk);
  EXPECT_EQ(shm::checkSlot(inlineSlot(4, 10000, 0, 4096), fresh), V::kOutOfSequence);
  EXPECT_EQ(shm::checkSlot(inlineSlot(3, 10000, 8, 4096), fresh), V::kOutOfSequence);
  EXPECT_EQ(shm::checkSlot(inlineSlot(3, 10001, 0, 4096), fresh), V::kTruncated);
  EXPECT_EQ(shm::checkSlot(inlineSlot(3, 10000, 0, 4097), fresh), V::kBadChunk);  // past the slot
  EXPECT_EQ(shm::checkSlot(inlineSlot(3, 100, 0, 101), fresh), V::kBadChunk);     // past the message
  EXPECT_EQ(shm::checkSlot(inlineSlot(3, 100, 0, 0), fresh), V::kBadChunk);       // moves nothing
  EXPECT_EQ(shm::checkSlot(inlineSlot(3, 0, 0, 0), fresh), V::kOk);

  const shm::SlotExpect middle{3, true, 10000, 4096, 10000, 4096, shm::kDirectCma};
  EXPECT_EQ(shm::checkSlot(inlineSlot(3, 10000, 4096, 4096), middle), V::kOk);
  EXPECT_EQ(shm::checkSlot(inlineSlot(3, 20000, 4096, 4096), middle), V::kSizeChanged);
  EXPECT_EQ(shm::checkSlot(inlineSlot(9, 10000, 4096, 4096), middle), V::kOutOfSequence);
  EXPECT_EQ(shm::checkSlot(inlineSlot(3, 10000, 0, 4096), middle), V::kBadChunk);
  EXPECT_EQ(shm::checkSlot(inlineSlot(3, 10000, UINT64_MAX - 5, 16), middle), V::kBadChunk);
  EXPECT_EQ(shm::checkSlot(inlineSlot(3, 10000, 8192, 4096), middle), V::kBadChunk);  // past the message

  shm::SlotView direct = inlineSlot(3, 10000, 0, 0);
  direct.kind = shm::kSlotDirect;
  EXPECT_EQ(shm::checkSlot(direct, fresh), V::kDirectRefused);
  shm::SlotExpect cma = fresh;
  cma.mode = shm::kDirectCma;
  EXPECT_EQ(shm::checkSlot(direct, cma), V::kOk);
  EXPECT_EQ(shm::checkSlot(direct, middle), V::kBadKind);  // not in the middle of a message
  direct.kind = 7;
  EXPECT_EQ(shm::checkSlot(direct, cma), V::kBadKind);
}

shm::ChannelView goodChannel(uint32_t nslots, uint64_t slotBytes) {
  return shm::ChannelView{shm::kChannelMagic, shm::kLayoutVersion, nslots, 1, slotBytes, 1,
                          shm::ChannelLayout::make(nslots, slotBytes).totalBytes};
}

TEST(ShmHeaderCheck, ChannelHeadersAreCheckedWithoutWrapping) {
  const char* why = "";
  shm::ChannelLayout l;
  shm::ChannelView v = goodChannel(4, 8192);
  EXPECT_TRUE(shm::checkChannelHeader(v, 1, v.totalBytes, &l, &why)) << why;
  EXPECT_FALSE(shm::checkChannelHeader(v, 2, v.totalBytes, &l, &why));      // another sender
  EXPECT_FALSE(shm::checkChannelHeader(v, 1, v.totalBytes + 1, &l, &why));  // another size
  shm::ChannelView wrap = v;  // 4 x (2^62 + 8192) == 4 x 8192 modulo 2^64
  wrap.slotBytes = (uint64_t(1) << 62) + 8192;
  EXPECT_EQ(shm::ChannelLayout::make(4, wrap.slotBytes).totalBytes, v.totalBytes);
  EXPECT_FALSE(shm::checkChannelHeader(wrap, 1, v.totalBytes, &l, &why));
  EXPECT_FALSE(shm::ChannelLayout::fit(4, wrap.slotBytes, &l));
  shm::ChannelView none = v;
  none.nslots = 0;
  EXPECT_FALSE(shm::checkChannelHeader(none, 1, v.totalBytes, &l, &why));
}

// ===========================================================================
// TCP, byte by byte: a socketpair far end (tests/support/tcp_far_end.h)

struct TcpVictim {
  explicit TcpVictim(int nsocks, std::vector<size_t> sizes) : reqs(sizes.size()), far(nsocks) {
    for (size_t n : sizes) bufs.push_back(std::make_unique<GuardedBuffer>(n));
    for (size_t i = 0; i < sizes.size(); ++i)
      EXPECT_EQ(far.conn().postRecv(bufs[i]->data(), sizes[i], &reqs[i]), attnSuccess);
  }
  bool guardsIntact() const {
    for (auto& b : bufs)
      if (!b->guardsIntact()) return false;
    return true;
  }
  // Declared first, destroyed last: the connection fails them as it goes.
  std::vector<Request> reqs;
  std::vector<std::unique_ptr<GuardedBuffer>> bufs;
  TcpFarEnd far;
};

constexpr const char* kFar = "peer 1";

// The use-after-free: two chunks of one message with overlapping
// ranges on two sockets; the first completes the message, the second then
// wrote into a receive that was already gone.
TEST(HostileTcp, OverlappingChunksOnTwoSockets) {
  TcpVictim v(2, {8192, 8192});
  v.far.chunk(0, 0, 8192, 0, 8192, 0x11, 4096);  // header and half its payload
  v.far.chunk(1, 0, 8192, 0, 4096, 0x22, 0);     // overlaps: header only for now
  EXPECT_NE(v.far.drain(), attnSuccess);
  v.far.payload(0, 4096, 0x11);  // the first chunk completes ...
  v.far.drain();
  v.far.payload(1, 4096, 0x22);  // ... and the second one's payload follows
  v.far.drain();
  EXPECT_FAILED_BY(v.reqs[0], attnRemoteError, kFar);
  EXPECT_FAILED_BY(v.reqs[1], attnRemoteError, kFar);
  EXPECT_NE(v.reqs[0].message.find("overlaps"), std::string::npos) << v.reqs[0].message;
  EXPECT_TRUE(v.guardsIntact());
  bool p;
  EXPECT_EQ(v.far.conn().progress(&p), attnRemoteError);  // stays broken
}

// Two halves that cover the same bytes used to add up to a whole message.
TEST(HostileTcp, DuplicateRangeDoesNotCompleteAMessage) {
  TcpVictim v(2, {8192});
  v.far.chunk(0, 0, 8192, 0, 4096, 0x11);
  v.far.chunk(1, 0, 8192, 0, 4096, 0x22);
  EXPECT_NE(v.far.drain(), attnSuccess);
  EXPECT_FAILED_BY(v.reqs[0], attnRemoteError, kFar);
  EXPECT_TRUE(v.guardsIntact());
}

TEST(HostileTcp, ChunkForAFinishedMessage) {
  TcpVictim v(2, {4096, 4096});
  v.far.chunk(0, 0, 4096, 0, 4096, 0x11);
  EXPECT_EQ(v.far.drain(), attnSuccess);
  ASSERT_EQ(v.reqs[0].state.load(), Request::kDone);
  v.far.chunk(1, 0, 4096, 0, 4096, 0x22);  // message 0 again
  EXPECT_NE(v.far.drain(), attnSuccess);
  EXPECT_FAILED_BY(v.reqs[1], attnRemoteError, kFar);
  EXPECT_EQ(v.bufs[0]->data()[0], 0x11);  // the finished receive kept its bytes
  EXPECT_TRUE(v.guardsIntact());
}

TEST(HostileTcp, MessageLargerThanThePostedReceive) {
  TcpVictim v(1, {1000, 1000});
  v.far.chunk(0, 0, 5000, 0, 5000);
  EXPECT_NE(v.far.drain(), attnSuccess);
  EXPECT_FAILED_BY(v.reqs[0], attnInvalidUsage, kFar);
  EXPECT_NE(v.reqs[0].message.find("truncated"), std::string::npos) << v.reqs[0].message;
  EXPECT_FAILED_BY(v.reqs[1], attnRemoteError, kFar);
  EXPECT_TRUE(v.guardsIntact());
}

TEST(HostileTcp, OffsetsAndLengthsThatWrap) {
  const uint64_t cases[][3] = {
      {4096, UINT64_MAX - 100, 200},  // offset + len wraps
      {4096, 4000, 200},              // past the end
      {4096, 0, 8192},                // len > total
      {4096, 0, UINT64_MAX},
  };
  for (auto& c : cases) {
    TcpVictim v(1, {4096});
    v.far.chunk(0, 0, c[0], c[1], c[2], 0x11, 64);
    EXPECT_NE(v.far.drain(), attnSuccess);
    EXPECT_FAILED_BY(v.reqs[0], attnRemoteError, kFar);
    EXPECT_TRUE(v.guardsIntact());
  }
}

TEST(HostileTcp, TruncatedPayloadThenClose) {
  TcpVictim v(2, {8192, 100});
  v.far.chunk(0, 0, 8192, 0, 8192, 0x11, 1000);
  v.far.closeFarEnds();
  EXPECT_NE(v.far.drain(), attnSuccess);
  EXPECT_FAILED_BY(v.reqs[0], attnRemoteError, kFar);
  EXPECT_FAILED_BY(v.reqs[1], attnRemoteError, kFar);
  EXPECT_TRUE(v.guardsIntact());
}

TEST(HostileTcp, TruncatedHeaderThenClose) {
  TcpVictim v(1, {100});
  const tcp::ChunkHeader h{0, 100, 0, 100};
  v.far.write(0, &h, sizeof(h) - 5);
  v.far.closeFarEnds();
  EXPECT_NE(v.far.drain(), attnSuccess);
  EXPECT_FAILED_BY(v.reqs[0], attnRemoteError, kFar);
  EXPECT_TRUE(v.guardsIntact());
}

// A header far beyond anything the socket may carry next used to park the
// socket for good: the receive waited for the communicator's timeout.
TEST(HostileTcp, SequenceBeyondTheWindow) {
  TcpVictim v(2, {4096});
  v.far.chunk(0, 6, 4096, 0, 4096);
  EXPECT_NE(v.far.drain(), attnSuccess);
  EXPECT_FAILED_BY(v.reqs[0], attnRemoteError, kFar);
  EXPECT_TRUE(v.guardsIntact());
}

// Messages out of order on one socket used to land in the wrong receives.
TEST(HostileTcp, SequencesOutOfOrderOnOneSocket) {
  TcpVictim v(1, {100, 100, 100});
  v.far.chunk(0, 0, 100, 0, 100, 0x10);
  v.far.chunk(0, 2, 100, 0, 100, 0x12);
  v.far.chunk(0, 1, 100, 0, 100, 0x11);
  EXPECT_NE(v.far.drain(), attnSuccess);
  EXPECT_EQ(v.reqs[0].state.load(), Request::kDone);
  EXPECT_FAILED_BY(v.reqs[1], attnRemoteError, kFar);
  EXPECT_FAILED_BY(v.reqs[2], attnRemoteError, kFar);
  EXPECT_TRUE(v.guardsIntact());
}

// Whatever bytes arrive, progress ends without blocking and writes nothing
// outside the receives (what a fuzzer of the stream relies on).
TEST(HostileTcp, RandomBytesEndCleanly) {
  for (unsigned seed = 1; seed <= 200; ++seed) {
    std::srand(seed);
    const int nsocks = 1 + seed % 2;
    TcpVictim v(nsocks, {size_t(std::rand() % 4096), size_t(std::rand() % 4096), 17});
    for (int k = 0; k < nsocks; ++k) {
      std::vector<uint8_t> junk(size_t(std::rand() % 3000));
      for (auto& b : junk) b = uint8_t(std::rand());
      // Sometimes a plausible header first, so checks past the first one run.
      if (seed % 3 == 0 && junk.size() >= sizeof(tcp::ChunkHeader)) {
        tcp::ChunkHeader h{uint64_t(k), uint64_t(std::rand() % 5000), uint64_t(std::rand() % 5000),
                           uint64_t(std::rand() % 3000)};
        std::memcpy(junk.data(), &h, sizeof(h));
      }
      v.far.write(k, junk.data(), junk.size());
    }
    if (seed % 2) v.far.closeFarEnds();
    v.far.drain();
    EXPECT_TRUE(v.guardsIntact()) << "seed " << seed;
    for (size_t i = 0; i < v.reqs.size(); ++i)
      if (v.reqs[i].state.load() == Request::kDone) EXPECT_LE(v.reqs[i].bytes, v.bufs[i]->size());
  }
}

// ===========================================================================
// TCP, a real connection: two ranks connect through the transport (the
// real handshake, secret included); then the test writes raw chunks on
// rank 0's sockets, as a peer that holds the secret but not the protocol.

struct RealTcpPair {
  RealTcpPair() : hub(2) {
    setenv("ATTN_TCP_NSOCKS", "2", 1);
    ranks = std::make_unique<testing::TransportRanks>(
        testing::makeTransportRanks(2, &hub, createTcpTransport));
    unsetenv("ATTN_TCP_NSOCKS");
    // Rank 0's sockets, in index order: with a receive posted, every one
    // of them is in its poll set.
    auto* c0 = static_cast<tcp::TcpConnection*>((*ranks)[0]->conns[1].get());
    EXPECT_EQ(c0->postRecv(sink, sizeof(sink), &sinkReq), attnSuccess);
    std::vector<pollfd> fds;
    c0->addPollFds(&fds);
    for (const pollfd& p : fds) sock.push_back(p.fd);
  }
  ~RealTcpPair() { ranks.reset(); }
  void send(int k, const tcp::ChunkHeader& h, uint8_t fill) {
    std::vector<uint8_t> bytes(sizeof(h) + h.len, fill);
    std::memcpy(bytes.data(), &h, sizeof(h));
    ASSERT_EQ(::send(sock[k], bytes.data(), bytes.size(), MSG_NOSIGNAL), ssize_t(bytes.size()));
  }
  testing::TransportRank* victim() { return (*ranks)[1].get(); }

  testing::FakeBootstrapHub hub;
  std::unique_ptr<testing::TransportRanks> ranks;
  char sink[16];
  Request sinkReq;
  std::vector<int> sock;
};

TEST(HostileTcpPeer, DuplicateRangesOnTwoSockets) {
  RealTcpPair t;
  ASSERT_EQ(t.sock.size(), 2u);
  GuardedBuffer buf(8192);
  Request q;
  ASSERT_EQ(t.victim()->conns[0]->postRecv(buf.data(), buf.size(), &q), attnSuccess);
  t.send(0, tcp::ChunkHeader{0, 8192, 0, 4096}, 0x11);
  t.send(1, tcp::ChunkHeader{0, 8192, 0, 4096}, 0x22);
  ASSERT_TRUE(testing::drive(t.victim(), {&q}, kShortMs)) << "hung on a hostile peer";
  EXPECT_FAILED_BY(q, attnRemoteError, "peer 0");
  EXPECT_TRUE(buf.guardsIntact());
}

TEST(HostileTcpPeer, SequenceBeyondTheWindow) {
  RealTcpPair t;
  ASSERT_EQ(t.sock.size(), 2u);
  GuardedBuffer buf(4096);
  Request q;
  ASSERT_EQ(t.victim()->conns[0]->postRecv(buf.data(), buf.size(), &q), attnSuccess);
  t.send(0, tcp::ChunkHeader{1000000, 4096, 0, 4096}, 0x11);
  ASSERT_TRUE(testing::drive(t.victim(), {&q}, kShortMs)) << "hung on a hostile peer";
  EXPECT_FAILED_BY(q, attnRemoteError, "peer 0");
  EXPECT_TRUE(buf.guardsIntact());
}

// ===========================================================================
// shm: a peer that writes its side of real segments by hand
// (tests/support/shm_far_end.h)

using testing::ShmFarEnd;

struct ShmVictim {
  ShmVictim(ShmFarEnd::Options o, std::vector<size_t> sizes) : reqs(sizes.size()), far(o) {
    EXPECT_TRUE(far.ok());
    for (size_t n : sizes) bufs.push_back(std::make_unique<GuardedBuffer>(n));
    for (size_t i = 0; i < sizes.size(); ++i)
      EXPECT_EQ(far.conn().postRecv(bufs[i]->data(), sizes[i], &reqs[i]), attnSuccess);
  }
  bool guardsIntact() const {
    for (auto& b : bufs)
      if (!b->guardsIntact()) return false;
    return true;
  }
  // Declared first, destroyed last: the connection fails them as it goes.
  std::vector<Request> reqs;
  std::vector<std::unique_ptr<GuardedBuffer>> bufs;
  ShmFarEnd far;
};

TEST(HostileShm, InlineChunkPastTheSlotOrTheMessage) {
  const uint64_t cases[][3] = {
      // msgBytes, offset, chunkBytes
      {1 << 20, 0, 8192 + 4096},  // past the slot (8192 bytes)
      {100, 0, 200},              // past the message
      {100, UINT64_MAX - 10, 50}, // a wrapped offset
      {100, 0, 0},                // moves nothing, forever
  };
  for (auto& c : cases) {
    ShmVictim v({}, {1 << 20});
    v.far.publishInline(0, 0, c[0], c[1], c[2]);
    EXPECT_NE(v.far.drain(), attnSuccess) << c[0] << " " << c[1] << " " << c[2];
    EXPECT_FAILED_BY(v.reqs[0], attnRemoteError, "peer 1");
    EXPECT_TRUE(v.guardsIntact());
  }
}

TEST(HostileShm, LaterChunkOfAnotherMessageOrSize) {
  for (int variant = 0; variant < 3; ++variant) {
    ShmVictim v({}, {16384});
    v.far.publishInline(0, 0, 16384, 0, 8192);
    EXPECT_EQ(v.far.drain(), attnSuccess);
    if (variant == 0) v.far.publishInline(1, 7, 16384, 8192, 8192);        // another message
    if (variant == 1) v.far.publishInline(1, 0, 1 << 30, 8192, 8192);      // another size
    if (variant == 2) v.far.publishInline(1, 0, 16384, 4096, 8192);        // overlaps
    EXPECT_NE(v.far.drain(), attnSuccess) << "variant " << variant;
    EXPECT_FAILED_BY(v.reqs[0], attnRemoteError, "peer 1");
    EXPECT_TRUE(v.guardsIntact());
  }
}

TEST(HostileShm, MessageLargerThanTheReceive) {
  ShmVictim v({}, {1000});
  v.far.publishInline(0, 0, 5000, 0, 5000);
  EXPECT_NE(v.far.drain(), attnSuccess);
  EXPECT_FAILED_BY(v.reqs[0], attnInvalidUsage, "peer 1");
  EXPECT_TRUE(v.guardsIntact());
}

TEST(HostileShm, DirectOrUnknownSlotToARingOnlyReceiver) {
  for (uint32_t kind : {uint32_t(shm::kSlotDirect), uint32_t(shm::kSlotMapped), 7u}) {
    ShmVictim v({}, {1 << 20});
    shm::SlotHeader& s = v.far.slot(0);
    s.msgIndex = 0;
    s.msgBytes = 1 << 20;
    s.offset = 0;
    s.chunkBytes = 0;
    s.kind = kind;
    s.addr = 0x1000;
    v.far.publish(0);
    EXPECT_NE(v.far.drain(), attnSuccess) << "kind " << kind;
    EXPECT_FAILED_BY(v.reqs[0], attnRemoteError, "peer 1");
    EXPECT_TRUE(v.guardsIntact());
  }
}

// A mapped message's slot rewritten after the receiver began: every piece
// used to look the region up again from the live slot, so a new offset and
// size pointed the copy past the end of the mapping.
TEST(HostileShm, MappedSlotRewrittenMidMessage) {
  const size_t regionBytes = 4 << 20, msgBytes = 3 << 20;
  void* region = nullptr;
  ASSERT_EQ(shareableAlloc(regionBytes, &region), attnSuccess);
  ShareableRegion r;
  ASSERT_TRUE(findShareable(region, regionBytes, &r));
  if (r.fd < 0) {
    shareableFree(region);
    GTEST_SKIP() << "no memfd here: attnMemAlloc memory cannot be mapped";
  }
  for (size_t i = 0; i < regionBytes; ++i) static_cast<uint8_t*>(region)[i] = uint8_t(i * 7 + 1);
  {
    ShmFarEnd::Options o;
    o.inMode = shm::kDirectCma;
    o.sameProcess = false;  // a peer process (that is us: its pid is ours)
    ShmVictim v(o, {msgBytes});
    shm::SlotHeader& s = v.far.slot(0);
    s.msgIndex = 0;
    s.msgBytes = msgBytes;
    s.offset = 0;
    s.chunkBytes = 0;
    s.kind = shm::kSlotMapped;
    s.addr = reinterpret_cast<uintptr_t>(region);
    s.regionFd = r.fd;
    s.regionPid = r.ownerPid;
    s.regionSerial = r.serial;
    s.regionBytes = regionBytes;
    s.regionOffset = 0;
    v.far.publish(0);
    bool p = false;
    ASSERT_EQ(v.far.conn().progress(&p), attnSuccess) << threadLastError();  // the first piece
    ASSERT_EQ(v.reqs[0].state.load(), Request::kPending) << "one piece per pass";
    s.msgBytes = 1;
    s.regionOffset = regionBytes - 1;
    v.far.drain();
    // The message as it was when it started, or a failure; never a read
    // past the region (that crashed).
    if (v.reqs[0].state.load() == Request::kDone) {
      EXPECT_EQ(v.reqs[0].bytes, msgBytes);
      EXPECT_EQ(std::memcmp(v.bufs[0]->data(), region, msgBytes), 0);
    } else {
      EXPECT_FAILED_BY(v.reqs[0], attnRemoteError, "peer 1");
    }
    EXPECT_TRUE(v.guardsIntact());
  }
  shareableFree(region);
}

// A reader that holds its busy flag forever: close() used to spin on it with
// no limit. Now it gives up at the communicator's deadline.
TEST(HostileShm, BusyFlagHeldForever) {
  ShmFarEnd::Options o;
  o.inMode = shm::kDirectMemcpy;
  o.outMode = shm::kDirectMemcpy;  // a thread of ours reads our buffers
  o.directMin = 4096;
  o.timeoutMs = 200;
  ShmFarEnd far(o);
  ASSERT_TRUE(far.ok());
  std::vector<uint8_t> out(64 << 10, 5);
  Request s;
  ASSERT_EQ(far.conn().postSend(out.data(), out.size(), &s), attnSuccess);
  far.drain();  // the address is in the ring
  far.peerIn().hdr->readerBusy.store(1);
  auto closing = std::async(std::launch::async, [&] { far.conn().close(); });
  const bool returned = closing.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  far.peerIn().hdr->readerBusy.store(0);  // let an old close() go, whatever happened
  closing.wait();
  EXPECT_TRUE(returned) << "close() hung on a busy flag the peer never dropped";
  EXPECT_EQ(s.state.load(), Request::kFailed);
}

// A receiver whose tail runs past what was published used to complete our
// direct sends, unread.
TEST(HostileShm, TailBeyondWhatWasPublished) {
  ShmFarEnd::Options o;
  o.inMode = shm::kDirectMemcpy;
  o.outMode = shm::kDirectMemcpy;
  o.directMin = 4096;
  ShmFarEnd far(o);
  ASSERT_TRUE(far.ok());
  std::vector<uint8_t> out(64 << 10, 5);
  Request s;
  ASSERT_EQ(far.conn().postSend(out.data(), out.size(), &s), attnSuccess);
  far.drain();
  ASSERT_EQ(s.state.load(), Request::kPending);
  far.peerIn().hdr->tail.store(5);  // one slot was published
  EXPECT_NE(far.drain(), attnSuccess);
  EXPECT_FAILED_BY(s, attnRemoteError, "peer 1");
}

// A segment header whose sizes wrap to the segment's real size used to be
// accepted, and the ring then addressed memory far outside the mapping.
TEST(HostileShm, SegmentHeaderSizesThatWrap) {
  const std::string name = ShmFarEnd::uniqueName("wrap");
  shm::Channel mine;
  ASSERT_EQ(shm::Channel::create(name, 1, 4, 8192, &mine), attnSuccess);
  mine.hdr->slotBytes = (uint64_t(1) << 62) + 8192;  // 4 x that == 4 x 8192 modulo 2^64
  shm::Channel theirs;
  EXPECT_EQ(shm::Channel::attach(name, 1, &theirs), attnRemoteError);
  EXPECT_NE(threadLastError().find("peer 1"), std::string::npos) << threadLastError();
  EXPECT_EQ(theirs.seg, nullptr);

  mine.hdr->slotBytes = 8192;
  mine.hdr->nslots = 0;
  EXPECT_EQ(shm::Channel::attach(name, 1, &theirs), attnRemoteError);
  mine.hdr->nslots = 4;
  ASSERT_EQ(shm::Channel::attach(name, 1, &theirs), attnSuccess) << threadLastError();
  // What the sender writes later changes nothing here.
  mine.hdr->nslots = 1000;
  EXPECT_EQ(theirs.nslots, 4u);
  EXPECT_EQ(theirs.slotBytes, 8192u);
}

// ===========================================================================
// CMA's door: only when a peer is another process

TEST(ShmPtracer, ThreadsOnlyNeverOpenIt) {
  if (shm::cmaReadersRequested())
    GTEST_SKIP() << "an earlier test in this process already connected a peer process";
  auto connect = [](int64_t otherPid) {
    testing::FakeBootstrapHub hub(2);
    testing::TransportRanks ranks(2);
    testing::runThreads(2, [&](int r) {
      ranks[r] = std::make_unique<testing::TransportRank>();
      ranks[r]->rank = r;
      ranks[r]->boot = std::make_unique<testing::FakeBootstrap>(&hub, r);
      ranks[r]->peers.resize(2);
      for (int i = 0; i < 2; ++i) {
        ranks[r]->peers[i].rank = i;
        ranks[r]->peers[i].pid = i == 1 ? otherPid : getpid();
        ranks[r]->peers[i].commHash = 0x77;
      }
      TransportContext ctx;
      ctx.rank = r;
      ctx.nranks = 2;
      ctx.bootstrap = ranks[r]->boot.get();
      ctx.peers = ranks[r]->peers.data();
      ctx.timeoutMs = 10000;
      ranks[r]->transport = createShmTransport();
      std::vector<std::unique_ptr<Connection>> conns;
      EXPECT_EQ(ranks[r]->transport->connect(ctx, {1 - r}, &conns), attnSuccess) << threadLastError();
      for (auto& c : conns) ranks[r]->conns.push_back(std::move(c));
    });
  };
  setenv("ATTN_SHM_CMA", "1", 1);
  connect(getpid());  // every rank a thread of this process
  EXPECT_FALSE(shm::cmaReadersRequested());
  connect(getpid() + 1);  // rank 1 claims another process
  EXPECT_TRUE(shm::cmaReadersRequested());
  unsetenv("ATTN_SHM_CMA");
}

// ===========================================================================
// The environment is input too

TEST(HostileEnvironment, TimeoutOutOfRangeIsAnError) {
  for (const char* bad : {"4294967296", "2147483648", "-1", "abc", "10s", "99999999999999999999"}) {
    setenv("ATTN_TIMEOUT_MS", bad, 1);
    CommConfig c;
    EXPECT_EQ(resolveConfig(nullptr, nullptr, &c), attnInvalidArgument)
        << bad << " became timeoutMs " << c.timeoutMs;
    EXPECT_NE(threadLastError().find("ATTN_TIMEOUT_MS"), std::string::npos) << threadLastError();
  }
  setenv("ATTN_TIMEOUT_MS", "2147483647", 1);
  CommConfig c;
  EXPECT_EQ(resolveConfig(nullptr, nullptr, &c), attnSuccess);
  EXPECT_EQ(c.timeoutMs, INT_MAX);
  setenv("ATTN_TIMEOUT_MS", "0", 1);
  EXPECT_EQ(resolveConfig(nullptr, nullptr, &c), attnSuccess);
  EXPECT_EQ(c.timeoutMs, 0);
  unsetenv("ATTN_TIMEOUT_MS");
  EXPECT_EQ(resolveConfig(nullptr, nullptr, &c), attnSuccess);
  EXPECT_EQ(c.timeoutMs, 300000);
}

}  // namespace
}  // namespace attn

namespace attn {
namespace {

// A peer's attnMemAlloc region is mapped and read in place. Were it a memfd
// its owner could shrink, a hostile owner would turn those reads into
// SIGBUS in this process: only regions sealed against shrinking are mapped
// (the others are read by CMA), and attnMemAlloc seals its own.
TEST(HostileShm, UnsealedRegionIsNotMapped) {
  const uint64_t serial = 1u << 30;  // not one attnMemAlloc hands out here
  const size_t bytes = 1 << 16;
  int fd = memfd_create(shareableName(getpid(), serial).c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, bytes), 0);
  ShareableRegion r{0, bytes, fd, getpid(), serial};
  std::string why;
  int err = 0;
  void* p = mapPeerShareable(getpid(), r, bytes, false, false, &why, &err);
  if (p) {  // the old code mapped it: shrinking it now would make reads fault
    munmap(p, bytes);
    ADD_FAILURE() << "an unsealed region was mapped";
  }
  EXPECT_NE(why.find("not sealed"), std::string::npos) << why;

  ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  p = mapPeerShareable(getpid(), r, bytes, false, false, &why, &err);
  EXPECT_NE(p, nullptr) << why;
  if (p) munmap(p, bytes);
  close(fd);

  void* mine = nullptr;
  ASSERT_EQ(attnMemAlloc(&mine, 4096), attnSuccess);
  ShareableRegion own;
  ASSERT_TRUE(findShareable(mine, 4096, &own));
  ASSERT_GE(own.fd, 0);
  EXPECT_TRUE(fcntl(own.fd, F_GET_SEALS) & F_SEAL_SHRINK);
  EXPECT_EQ(attnMemFree(mine), attnSuccess);
}

}  // namespace
}  // namespace attn
