// TCP transport: ranks as threads connect (fake or real bootstrap), move
// messages of awkward sizes with content checks, keep FIFO order under
// backpressure, fail truncated receives, and report a vanished peer as
// attnRemoteError instead of hanging.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "src/core/bootstrap.h"
#include "src/core/error.h"
#include "src/core/socket.h"
#include "src/core/transport.h"
#include "tests/support/fake_bootstrap.h"
#include "tests/support/transport_harness.h"
#include "transports/tcp/tcp_transport.h"
#include "transports/tcp/tcp_wire.h"

namespace attn {
namespace {

using Clock = std::chrono::steady_clock;
using Rank = testing::TransportRank;
using testing::allBut;
using testing::check;
using testing::drive;
using testing::fill;
using testing::runThreads;
constexpr int kTimeoutMs = testing::kTransportTimeoutMs;

void connectRank(Rank* rk, int n, const testing::PeerChoice& wants) {
  testing::connectTransportRank(rk, n, createTcpTransport, wants);
}

// n ranks over the in-process fake bootstrap, fully connected.
testing::TransportRanks makeRanks(int n, testing::FakeBootstrapHub* hub, testing::PeerChoice wants = {}) {
  return testing::makeTransportRanks(n, hub, createTcpTransport, std::move(wants));
}

const size_t kSizes[] = {0, 1, 7, 4096, (size_t(1) << 20) + 3, size_t(32) << 20};

// Every rank sends every size to every peer and receives them all.
void exchangeAllSizes(std::vector<std::unique_ptr<Rank>>& ranks) {
  const int n = int(ranks.size());
  runThreads(n, [&](int r) {
    Rank* rk = ranks[r].get();
    const size_t m = std::size(kSizes);
    std::vector<std::vector<uint8_t>> sendBufs(n * m), recvBufs(n * m);
    std::vector<Request> sreq(n * m), rreq(n * m);
    std::vector<Request*> all;
    for (int p = 0; p < n; ++p) {
      if (!rk->conns[p]) continue;
      for (size_t k = 0; k < m; ++k) {
        size_t idx = p * m + k;
        sendBufs[idx].resize(kSizes[k]);
        fill(&sendBufs[idx], r, p, k);
        recvBufs[idx].assign(kSizes[k] + 16, 0xEE);  // room to spare: exact size reported
        ASSERT_EQ(rk->conns[p]->postRecv(recvBufs[idx].data(), recvBufs[idx].size(), &rreq[idx]),
                  attnSuccess);
        ASSERT_EQ(rk->conns[p]->postSend(sendBufs[idx].data(), kSizes[k], &sreq[idx]),
                  attnSuccess);
        all.push_back(&sreq[idx]);
        all.push_back(&rreq[idx]);
      }
    }
    ASSERT_TRUE(drive(rk, all)) << "rank " << r << " timed out";
    for (int p = 0; p < n; ++p) {
      if (!rk->conns[p]) continue;
      for (size_t k = 0; k < m; ++k) {
        size_t idx = p * m + k;
        ASSERT_EQ(sreq[idx].state.load(), Request::kDone) << sreq[idx].message;
        ASSERT_EQ(rreq[idx].state.load(), Request::kDone) << rreq[idx].message;
        ASSERT_EQ(rreq[idx].bytes, kSizes[k]);
        EXPECT_TRUE(check(recvBufs[idx].data(), kSizes[k], p, r, k));
        EXPECT_EQ(recvBufs[idx][kSizes[k]], 0xEE) << "wrote past the message";
      }
      EXPECT_TRUE(rk->conns[p]->idle());
    }
  });
}

// ---------------------------------------------------------------------------

class TcpRanks : public ::testing::TestWithParam<int> {};

TEST_P(TcpRanks, AllSizesBothDirections) {
  const int n = GetParam();
  testing::FakeBootstrapHub hub(n);
  auto ranks = makeRanks(n, &hub);
  exchangeAllSizes(ranks);
  exchangeAllSizes(ranks);  // the connections stay usable
}

INSTANTIATE_TEST_SUITE_P(N, TcpRanks, ::testing::Values(2, 3, 4));

TEST(Tcp, SocketCountsAndStripeSizes) {
  for (const char* k : {"1", "3", "8"}) {
    setenv("ATTN_TCP_NSOCKS", k, 1);
    setenv("ATTN_TCP_STRIPE_MIN", "4096", 1);
    testing::FakeBootstrapHub hub(2);
    auto ranks = makeRanks(2, &hub);
    exchangeAllSizes(ranks);
  }
  unsetenv("ATTN_TCP_NSOCKS");
  unsetenv("ATTN_TCP_STRIPE_MIN");
}

TEST(Tcp, RealBootstrapAndEmptyPeerList) {
  const int n = 3;
  attnUniqueId id;
  ASSERT_EQ(bootstrapCreateRoot(&id), attnSuccess);
  std::vector<std::unique_ptr<Rank>> ranks(n);
  runThreads(n, [&](int r) {
    ranks[r] = std::make_unique<Rank>();
    ranks[r]->rank = r;
    ASSERT_EQ(Bootstrap::create(id, r, n, kTimeoutMs, nullptr, &ranks[r]->boot), attnSuccess);
    // Rank 2 talks to nobody but still takes part in connect().
    connectRank(ranks[r].get(), n, [](int me) {
      return me == 2 ? std::vector<int>{} : std::vector<int>{1 - me};
    });
  });
  ASSERT_FALSE(ranks[2]->conns[0] || ranks[2]->conns[1]);
  ranks.pop_back();  // a 2-rank exchange between 0 and 1
  exchangeAllSizes(ranks);
}

// Many messages of mixed sizes, receives posted a few at a time: order and
// content hold while the sender is pushed back.
TEST(Tcp, FifoUnderBackpressure) {
  setenv("ATTN_TCP_STRIPE_MIN", "65536", 1);
  testing::FakeBootstrapHub hub(2);
  auto ranks = makeRanks(2, &hub);
  unsetenv("ATTN_TCP_STRIPE_MIN");
  testing::checkFifoUnderBackpressure(ranks, 600);
}

TEST(Tcp, TruncatedReceiveFails) {
  testing::FakeBootstrapHub hub(2);
  auto ranks = makeRanks(2, &hub);
  std::vector<uint8_t> out(1000, 1), in(999);
  Request s, q, later;
  ASSERT_EQ(ranks[0]->conns[1]->postSend(out.data(), out.size(), &s), attnSuccess);
  ASSERT_TRUE(drive(ranks[0].get(), {&s}));
  ASSERT_EQ(ranks[1]->conns[0]->postRecv(in.data(), in.size(), &q), attnSuccess);
  ASSERT_EQ(ranks[1]->conns[0]->postRecv(in.data(), in.size(), &later), attnSuccess);
  ASSERT_TRUE(drive(ranks[1].get(), {&q, &later}));
  EXPECT_EQ(q.state.load(), Request::kFailed);
  EXPECT_EQ(q.error, attnInvalidUsage);
  EXPECT_NE(q.message.find("truncated"), std::string::npos) << q.message;
  EXPECT_NE(q.message.find("peer 0"), std::string::npos) << q.message;
  EXPECT_EQ(later.state.load(), Request::kFailed);
  EXPECT_EQ(later.error, attnRemoteError);
  bool p;
  EXPECT_NE(ranks[1]->conns[0]->progress(&p), attnSuccess);  // stays broken
  Request after;
  EXPECT_EQ(ranks[1]->conns[0]->postRecv(in.data(), in.size(), &after), attnRemoteError);
  EXPECT_EQ(after.state.load(), Request::kFailed);

  // The sender's next message notices the broken link.
  Request s2;
  std::vector<uint8_t> big(8 << 20);
  ASSERT_EQ(ranks[0]->conns[1]->postSend(big.data(), big.size(), &s2), attnSuccess);
  ASSERT_TRUE(drive(ranks[0].get(), {&s2}, 10000));
  EXPECT_EQ(s2.state.load(), Request::kFailed);
  EXPECT_EQ(s2.error, attnRemoteError);
}

TEST(Tcp, PeerCloseFailsPendingReceive) {
  testing::FakeBootstrapHub hub(3);
  auto ranks = makeRanks(3, &hub);
  std::vector<uint8_t> buf(1 << 20);
  Request q;
  ASSERT_EQ(ranks[1]->conns[0]->postRecv(buf.data(), buf.size(), &q), attnSuccess);
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ranks[0]->conns[1]->close();
  });
  auto t0 = Clock::now();
  ASSERT_TRUE(drive(ranks[1].get(), {&q}, 10000)) << "hung on a closed peer";
  closer.join();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(q.state.load(), Request::kFailed);
  EXPECT_EQ(q.error, attnRemoteError);
  EXPECT_NE(q.message.find("peer 0"), std::string::npos) << q.message;
  bool p;
  EXPECT_EQ(ranks[1]->conns[0]->progress(&p), attnRemoteError);
  // The other link of rank 1 is untouched.
  std::vector<uint8_t> a(100, 5), b(100);
  Request s, r2;
  ASSERT_EQ(ranks[1]->conns[2]->postSend(a.data(), a.size(), &s), attnSuccess);
  ASSERT_EQ(ranks[2]->conns[1]->postRecv(b.data(), b.size(), &r2), attnSuccess);
  runThreads(2, [&](int i) { ASSERT_TRUE(drive(ranks[i + 1].get(), {i ? &r2 : &s})); });
  EXPECT_EQ(r2.state.load(), Request::kDone);
  EXPECT_EQ(a, b);
}

TEST(Tcp, PeerGoneFailsBlockedSend) {
  testing::FakeBootstrapHub hub(2);
  auto ranks = makeRanks(2, &hub);
  std::vector<uint8_t> big(64 << 20, 3);
  Request s;
  ASSERT_EQ(ranks[0]->conns[1]->postSend(big.data(), big.size(), &s), attnSuccess);
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ranks[1]->conns.clear();  // rank 1 goes away without reading
  });
  ASSERT_TRUE(drive(ranks[0].get(), {&s}, 10000)) << "hung on a vanished peer";
  closer.join();
  EXPECT_EQ(s.state.load(), Request::kFailed);
  EXPECT_EQ(s.error, attnRemoteError);
}

// A message already sent survives the sender closing right after: the
// receiver reads it, and only then sees the end.
TEST(Tcp, DataBeforeCloseIsDelivered) {
  testing::FakeBootstrapHub hub(2);
  auto ranks = makeRanks(2, &hub);
  std::vector<uint8_t> out(3 << 20), in(3 << 20);
  fill(&out, 0, 1, 0);
  Request s, q, q2;
  ASSERT_EQ(ranks[0]->conns[1]->postSend(out.data(), out.size(), &s), attnSuccess);
  std::thread sender([&] {
    ASSERT_TRUE(drive(ranks[0].get(), {&s}));
    ranks[0]->conns.clear();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(ranks[1]->conns[0]->postRecv(in.data(), in.size(), &q), attnSuccess);
  ASSERT_TRUE(drive(ranks[1].get(), {&q}));
  sender.join();
  ASSERT_EQ(q.state.load(), Request::kDone) << q.message;
  EXPECT_TRUE(check(in.data(), in.size(), 0, 1, 0));
  ASSERT_EQ(ranks[1]->conns[0]->postRecv(in.data(), in.size(), &q2), attnSuccess);
  ASSERT_TRUE(drive(ranks[1].get(), {&q2}, 10000));
  EXPECT_EQ(q2.state.load(), Request::kFailed);
}

TEST(Tcp, LocalCloseFailsQueuedRequests) {
  testing::FakeBootstrapHub hub(2);
  auto ranks = makeRanks(2, &hub);
  std::vector<uint8_t> buf(16);
  Request q, s;
  ASSERT_EQ(ranks[0]->conns[1]->postRecv(buf.data(), buf.size(), &q), attnSuccess);
  ranks[0]->conns[1]->close();
  EXPECT_EQ(q.state.load(), Request::kFailed);
  EXPECT_EQ(q.error, attnRemoteError);
  EXPECT_TRUE(ranks[0]->conns[1]->idle());
  EXPECT_EQ(ranks[0]->conns[1]->postSend(buf.data(), buf.size(), &s), attnRemoteError);
}

// A bootstrap that, once the listen addresses are known, sends hostile
// connections to the highest rank's TCP listener before setup goes on.
class HostileBootstrap : public testing::FakeBootstrap {
 public:
  using FakeBootstrap::FakeBootstrap;
  attnResult_t allGather(void* data, size_t bytes) override {
    attnResult_t rc = FakeBootstrap::allGather(data, bytes);
    if (rc != attnSuccess || rank() != 0 || bytes < 4 + kAddressBytes) return rc;
    const uint8_t* slot = static_cast<uint8_t*>(data) + (nranks() - 1) * bytes;
    uint32_t len;
    std::memcpy(&len, slot, 4);
    SocketAddress a;
    if (!deserializeAddress(slot + 4, len, &a)) return rc;
    auto dial = [&] {
      int fd = -1;
      socketConnect(a, Deadline::afterMs(5000), Cancel{}, "hostile", &fd);
      return fd;
    };
    tcp::TcpHello h{};
    h.magic = tcp::kHelloMagic;
    h.version = tcp::kWireVersion;
    h.from = 0;
    h.to = nranks() - 1;
    h.nsocks = 1;  // wrong secret (all zero)
    uint32_t hl = sizeof(h), huge = 1u << 31;
    int c1 = dial(), c2 = dial(), c3 = dial();
    socketSendAll(c1, &hl, 4, Deadline::afterMs(1000), Cancel{}, "hostile");
    socketSendAll(c1, &h, sizeof(h), Deadline::afterMs(1000), Cancel{}, "hostile");
    socketSendAll(c2, &huge, 4, Deadline::afterMs(1000), Cancel{}, "hostile");
    hostile_ = {c1, c2, c3};  // c3 stays silent
    return rc;
  }
  ~HostileBootstrap() override {
    for (int fd : hostile_) ::close(fd);
  }

 private:
  std::vector<int> hostile_;
};

TEST(Tcp, HostileConnectionsDuringSetupAreDropped) {
  const int n = 3;
  testing::FakeBootstrapHub hub(n);
  std::vector<std::unique_ptr<Rank>> ranks(n);
  for (int r = 0; r < n; ++r) {
    ranks[r] = std::make_unique<Rank>();
    ranks[r]->rank = r;
    ranks[r]->boot = std::make_unique<HostileBootstrap>(&hub, r);
  }
  runThreads(n, [&](int r) { connectRank(ranks[r].get(), n, [&](int me) { return allBut(me, n); }); });
  exchangeAllSizes(ranks);
}

TEST(Tcp, SetupTimesOutWhenPeerNeverConnects) {
  // Rank 0 expects rank 1, which does not list rank 0 (asymmetric lists).
  testing::FakeBootstrapHub hub(2);
  std::vector<std::unique_ptr<Rank>> ranks(2);
  for (int r = 0; r < 2; ++r) {
    ranks[r] = std::make_unique<Rank>();
    ranks[r]->rank = r;
    ranks[r]->boot = std::make_unique<testing::FakeBootstrap>(&hub, r);
  }
  runThreads(2, [&](int r) {
    Rank* rk = ranks[r].get();
    rk->peers.resize(2);
    TransportContext ctx;
    ctx.rank = r;
    ctx.nranks = 2;
    ctx.bootstrap = rk->boot.get();
    ctx.peers = rk->peers.data();
    ctx.timeoutMs = 500;
    rk->transport = createTcpTransport();
    std::vector<std::unique_ptr<Connection>> conns;
    std::vector<int> peers = r == 1 ? std::vector<int>{0} : std::vector<int>{};
    auto t0 = Clock::now();
    attnResult_t rc = rk->transport->connect(ctx, peers, &conns);
    if (r == 1) {
      EXPECT_EQ(rc, attnTimeout);
      EXPECT_LT(Clock::now() - t0, std::chrono::seconds(3));
      EXPECT_NE(threadLastError().find("peer(s) 0"), std::string::npos) << threadLastError();
    } else {
      EXPECT_EQ(rc, attnSuccess);
    }
  });
}

}  // namespace
}  // namespace attn
