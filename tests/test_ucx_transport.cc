// UCX transport (transports/ucx): the Connection contract tested directly
// (sizes 0 B .. 64 MiB, FIFO, truncation, a closing peer, local close), the
// registration cache, and whole communicators over ATTN_TRANSPORT=ucx:
// collectives on 2..4 ranks as threads and as processes, over UCX's TCP and
// shared-memory transports (UCX_TLS), and a SIGKILLed peer.
//
// Built in every configuration; without UCX it only checks that asking for
// it is a clear error.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "attncomm.h"
#include "src/core/comm.h"
#include "src/core/config.h"
#include "src/core/error.h"
#include "src/core/transport.h"
#include "tests/support/fake_bootstrap.h"
#include "tests/support/multirank.h"
#include "tests/support/transport_harness.h"
#if ATTN_HAVE_UCX
#include "transports/ucx/ucx_context.h"
#include "transports/ucx/ucx_memreg.h"
#include "transports/ucx/ucx_transport.h"
#endif

namespace {

using attn_test::RunOptions;
using Clock = std::chrono::steady_clock;

#if !ATTN_HAVE_UCX

TEST(Ucx, NotBuiltIsAClearError) {
  uint32_t mask = 0;
  EXPECT_EQ(attn::parseTransportList("ucx", &mask), attnNotSupported);
  EXPECT_NE(attn::threadLastError().find("no UCX"), std::string::npos) << attn::threadLastError();
}

#else  // ATTN_HAVE_UCX

using attn::Connection;
using attn::Request;
constexpr int kTimeoutMs = attn::testing::kTransportTimeoutMs;

// ---------------------------------------------------------------------------
// Transport level: ranks are threads over the in-process fake bootstrap.

using Rank = attn::testing::TransportRank;
using Ranks = attn::testing::TransportRanks;
using attn::testing::check;
using attn::testing::drive;
using attn::testing::fill;
using attn::testing::runThreads;

Ranks makeRanks(int n, attn::testing::FakeBootstrapHub* hub) {
  return attn::testing::makeTransportRanks(n, hub, attn::createUcxTransport);
}

// Every rank sends each size to every peer and receives them all.
void exchange(Ranks& ranks, const std::vector<size_t>& sizes) {
  const int n = int(ranks.size());
  runThreads(n, [&](int r) {
    Rank* rk = ranks[r].get();
    const size_t m = sizes.size();
    std::vector<std::vector<uint8_t>> out(n * m), in(n * m);
    std::vector<Request> sreq(n * m), rreq(n * m);
    std::vector<Request*> all;
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      for (size_t k = 0; k < m; ++k) {
        size_t i = p * m + k;
        out[i].resize(sizes[k]);
        fill(&out[i], r, p, k);
        in[i].assign(sizes[k] + 16, 0xEE);
        ASSERT_EQ(rk->conns[p]->postRecv(in[i].data(), in[i].size(), &rreq[i]), attnSuccess);
        ASSERT_EQ(rk->conns[p]->postSend(out[i].data(), sizes[k], &sreq[i]), attnSuccess);
        all.push_back(&sreq[i]);
        all.push_back(&rreq[i]);
      }
    }
    ASSERT_TRUE(drive(rk, all)) << "rank " << r << " timed out";
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      for (size_t k = 0; k < m; ++k) {
        size_t i = p * m + k;
        ASSERT_EQ(sreq[i].state.load(), Request::kDone) << sreq[i].message;
        ASSERT_EQ(rreq[i].state.load(), Request::kDone) << rreq[i].message;
        ASSERT_EQ(rreq[i].bytes, sizes[k]);
        EXPECT_TRUE(check(in[i].data(), sizes[k], p, r, k));
        EXPECT_EQ(in[i][sizes[k]], 0xEE) << "wrote past the message";
      }
      EXPECT_TRUE(rk->conns[p]->idle());
    }
  });
}

class UcxRanks : public ::testing::TestWithParam<int> {};

TEST_P(UcxRanks, AllSizesBothDirections) {
  const int n = GetParam();
  attn::testing::FakeBootstrapHub hub(n);
  auto ranks = makeRanks(n, &hub);
  const std::vector<size_t> sizes = {0, 1, 7, 4096, 65536 + 1, (size_t(1) << 20) + 3,
                                     size_t(4) << 20};
  exchange(ranks, sizes);
  exchange(ranks, sizes);  // the connections stay usable (and the cache hits)
}

INSTANTIATE_TEST_SUITE_P(N, UcxRanks, ::testing::Values(2, 3, 4));

TEST(Ucx, SixtyFourMiB) {
  attn::testing::FakeBootstrapHub hub(2);
  auto ranks = makeRanks(2, &hub);
  exchange(ranks, {size_t(64) << 20});
}

// Many messages of mixed sizes (eager and rendezvous), receives posted a few
// at a time after the sender ran ahead: order and content hold.
TEST(Ucx, FifoOrder) {
  attn::testing::FakeBootstrapHub hub(2);
  auto ranks = makeRanks(2, &hub);
  attn::testing::checkFifoUnderBackpressure(ranks, 300);
}

TEST(Ucx, TruncatedReceiveFails) {
  for (size_t size : {size_t(1000), size_t(2) << 20}) {  // eager and rendezvous
    attn::testing::FakeBootstrapHub hub(2);
    auto ranks = makeRanks(2, &hub);
    std::vector<uint8_t> out(size, 1), in(size - 1);
    Request s, q, later;
    ASSERT_EQ(ranks[0]->conns[1]->postSend(out.data(), out.size(), &s), attnSuccess);
    std::thread sender([&] { drive(ranks[0].get(), {&s}, 10000); });
    ASSERT_EQ(ranks[1]->conns[0]->postRecv(in.data(), in.size(), &q), attnSuccess);
    ASSERT_EQ(ranks[1]->conns[0]->postRecv(in.data(), in.size(), &later), attnSuccess);
    ASSERT_TRUE(drive(ranks[1].get(), {&q, &later}));
    sender.join();
    EXPECT_EQ(q.state.load(), Request::kFailed) << size;
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
  }
}

// A peer that closes its side: a receive that can never be matched fails
// promptly, naming the peer; the other links are untouched.
TEST(Ucx, PeerCloseFailsPendingReceive) {
  attn::testing::FakeBootstrapHub hub(3);
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
  std::vector<uint8_t> a(100, 5), b(100);
  Request s, r2;
  ASSERT_EQ(ranks[1]->conns[2]->postSend(a.data(), a.size(), &s), attnSuccess);
  ASSERT_EQ(ranks[2]->conns[1]->postRecv(b.data(), b.size(), &r2), attnSuccess);
  runThreads(2, [&](int i) { ASSERT_TRUE(drive(ranks[i + 1].get(), {i ? &r2 : &s})); });
  EXPECT_EQ(r2.state.load(), Request::kDone);
  EXPECT_EQ(a, b);
}

// Messages sent before the close still arrive; only later receives fail.
TEST(Ucx, DataBeforeCloseIsDelivered) {
  attn::testing::FakeBootstrapHub hub(2);
  auto ranks = makeRanks(2, &hub);
  std::vector<uint8_t> small(100), big(3 << 20), in1(100), in2(3 << 20), in3(10);
  fill(&small, 0, 1, 0);
  fill(&big, 0, 1, 1);
  Request s1, s2, q1, q2, q3;
  ASSERT_EQ(ranks[0]->conns[1]->postSend(small.data(), small.size(), &s1), attnSuccess);
  ASSERT_EQ(ranks[0]->conns[1]->postSend(big.data(), big.size(), &s2), attnSuccess);
  std::thread sender([&] {
    EXPECT_TRUE(drive(ranks[0].get(), {&s1, &s2}));
    ranks[0]->conns[1]->close();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(ranks[1]->conns[0]->postRecv(in1.data(), in1.size(), &q1), attnSuccess);
  ASSERT_EQ(ranks[1]->conns[0]->postRecv(in2.data(), in2.size(), &q2), attnSuccess);
  ASSERT_TRUE(drive(ranks[1].get(), {&q1, &q2}));
  sender.join();
  ASSERT_EQ(q1.state.load(), Request::kDone) << q1.message;
  ASSERT_EQ(q2.state.load(), Request::kDone) << q2.message;
  EXPECT_TRUE(check(in1.data(), in1.size(), 0, 1, 0));
  EXPECT_TRUE(check(in2.data(), in2.size(), 0, 1, 1));
  ASSERT_EQ(ranks[1]->conns[0]->postRecv(in3.data(), in3.size(), &q3), attnSuccess);
  ASSERT_TRUE(drive(ranks[1].get(), {&q3}, 10000));
  EXPECT_EQ(q3.state.load(), Request::kFailed);
  EXPECT_EQ(q3.error, attnRemoteError);
}

TEST(Ucx, LocalCloseFailsQueuedRequests) {
  attn::testing::FakeBootstrapHub hub(2);
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

// A receive that UCX has begun to fill (the first fragments of a long eager
// message are in) when the connection closes: UCX cannot cancel it, and
// whatever fragments the sender pushes later would land in a buffer whose
// owner freed it once close() failed the request. Poisoned right after
// close(), the buffer must stay poisoned while the sender goes on and the
// worker is torn down.
TEST(Ucx, CloseMidMessageLeavesTheBufferAlone) {
  // Shared memory: one receive FIFO per worker, so the sender's fragments
  // keep arriving after our endpoint is gone; no rendezvous: UCX writes the
  // message fragment by fragment as they arrive.
  setenv("UCX_TLS", "sm", 1);
  setenv("UCX_RNDV_THRESH", "inf", 1);
  attn::testing::FakeBootstrapHub hub(3);
  auto ranks = makeRanks(3, &hub);
  unsetenv("UCX_TLS");
  unsetenv("UCX_RNDV_THRESH");
  const size_t n = size_t(8) << 20;
  std::vector<uint8_t> out(n, 0x11), in(n, 0);
  Request s, q;
  ASSERT_EQ(ranks[1]->conns[0]->postRecv(in.data(), n, &q), attnSuccess);
  ASSERT_EQ(ranks[0]->conns[1]->postSend(out.data(), n, &s), attnSuccess);
  // Both sides step until the receive has its first bytes, and no further.
  const auto end = Clock::now() + std::chrono::seconds(10);
  while (in[0] != 0x11 && q.pending() && Clock::now() < end) {
    bool p;
    ranks[0]->conns[1]->progress(&p);
    ranks[1]->conns[0]->progress(&p);
  }
  ASSERT_EQ(in[0], 0x11) << "the message never started";
  if (!q.pending()) GTEST_SKIP() << "the whole message arrived at once";

  ranks[1]->conns[0]->close();
  EXPECT_EQ(q.state.load(), Request::kFailed);
  std::fill(in.begin(), in.end(), 0xDD);  // the owner's: freed and reused
  // Rank 1's worker is never progressed again: its other link fails too.
  std::vector<uint8_t> small(16);
  Request other;
  EXPECT_EQ(ranks[1]->conns[2]->postRecv(small.data(), small.size(), &other), attnRemoteError);
  EXPECT_EQ(other.state.load(), Request::kFailed);
  EXPECT_NE(other.message.find("peer 2"), std::string::npos) << other.message;
  drive(ranks[0].get(), {&s}, 5000);      // the sender goes on as far as it can
  ranks[1].reset();                       // rank 1's worker is progressed and destroyed
  size_t written = 0;
  for (uint8_t b : in) written += b != 0xDD;
  EXPECT_EQ(written, 0u) << "UCX wrote into a receive buffer after close() returned";
}

// The registration cache reuses a registration for any range inside it and
// forgets it once the memory is unmapped.
TEST(Ucx, RegistrationCache) {
  std::unique_ptr<attn::ucx::UcxWorker> w;
  ASSERT_EQ(attn::ucx::UcxWorker::create(false, &w), attnSuccess) << attn::threadLastError();
  attn::ucx::UcxRegCache cache(w->context(), 4096, 4);
  if (!cache.enabled()) GTEST_SKIP() << "UCM memory events are off (UCX_MEM_EVENTS=no)";
  const size_t len = size_t(8) << 20;
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  char* c = static_cast<char*>(p);
  EXPECT_EQ(cache.acquire(c, 100), nullptr);  // below the threshold
  auto* e1 = cache.acquire(c, len);
  ASSERT_NE(e1, nullptr);
  auto* e2 = cache.acquire(c + 4096, len / 2);  // inside: reused
  EXPECT_EQ(e1, e2);
  EXPECT_EQ(cache.hits(), 1u);
  cache.release(e1);
  cache.release(e2);
  munmap(p, len);
  void* q = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(q, MAP_FAILED);
  auto* e3 = cache.acquire(q, len);  // maybe the same address: must not be the old entry
  ASSERT_NE(e3, nullptr);
  EXPECT_EQ(cache.hits(), 1u) << "a registration of unmapped memory was reused";
  EXPECT_EQ(cache.size(), 1u);
  cache.release(e3);
  munmap(q, len);
}

// ---------------------------------------------------------------------------
// Communicators over ATTN_TRANSPORT=ucx.

void CollectivesBody(attnComm_t comm, int rank, int n, bool big) {
  for (int p = 0; p < n; ++p)
    if (p != rank) EXPECT_STREQ(comm->engine->transportName(p), "ucx") << "peer " << p;
  for (size_t count : {size_t(1), size_t(7), size_t(65537)}) {
    attn_test::CheckAllGather(comm, rank, n, attnInt32, count, false);
    attn_test::CheckReduceScatter(comm, rank, n, attnFloat32, attnSum, count, count == 7);
    attn_test::CheckAllReduce(comm, rank, n, attnFloat32, attnSum, count, false);
    attn_test::CheckAllToAll(comm, rank, n, attnFloat64, count);
    attn_test::CheckBroadcast(comm, rank, n, attnUint8, count, 1 % n, false);
    attn_test::CheckReduce(comm, rank, n, attnInt32, attnMax, count, n - 1, count == 1);
  }
  attn_test::CheckRingExchange(comm, rank, n, attnFloat16, 10007);
  if (big) attn_test::CheckAllReduce(comm, rank, n, attnFloat32, attnSum, (size_t(4) << 20) / 4 + 3, true);
}

using CollParam = std::tuple<int, bool>;  // ranks, processes?
class UcxCollectives : public ::testing::TestWithParam<CollParam> {};

TEST_P(UcxCollectives, AllKinds) {
  const auto [n, processes] = GetParam();
  RunOptions opts;
  opts.env = {{"ATTN_TRANSPORT", "ucx"}};
  opts.deadline_ms = 120000;
  auto body = [&](int rank, int nr, attnComm_t& comm) { CollectivesBody(comm, rank, nr, n == 3); };
  if (processes) attn_test::RunProcesses(n, body, opts);
  else attn_test::RunThreads(n, body, opts);
}

INSTANTIATE_TEST_SUITE_P(Ranks, UcxCollectives,
                         ::testing::Combine(::testing::Values(2, 3, 4), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<CollParam>& info) {
                           return "N" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_processes" : "_threads");
                         });

// UCX's own transports chosen by UCX_TLS: TCP only, shared memory only.
class UcxWires : public ::testing::TestWithParam<std::string> {};

TEST_P(UcxWires, CollectivesAsProcesses) {
  RunOptions opts;
  opts.env = {{"ATTN_TRANSPORT", "ucx"}, {"UCX_TLS", GetParam()}};
  opts.deadline_ms = 120000;
  attn_test::RunProcesses(3, [&](int rank, int n, attnComm_t& comm) {
    CollectivesBody(comm, rank, n, true);
  }, opts);
}

INSTANTIATE_TEST_SUITE_P(Tls, UcxWires, ::testing::Values("tcp", "sm,self"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "tcp" ? std::string("tcp") : std::string("sm");
                         });

// The same selection through attnConfig_t.transports.
TEST(Ucx, ConfigSelectsUcx) {
  attnConfig_t cfg = ATTN_CONFIG_INITIALIZER;
  cfg.transports = "ucx";
  RunOptions opts;
  opts.config = &cfg;
  attn_test::RunThreads(2, [&](int rank, int n, attnComm_t& comm) {
    EXPECT_STREQ(comm->engine->transportName(1 - rank), "ucx");
    attn_test::CheckAllReduce(comm, rank, n, attnFloat32, attnAvg, 65537, true);
  }, opts);
}

// A SIGKILLed peer: survivors get attnRemoteError or attnTimeout naming a
// peer, never a hang.
class UcxKilledPeer : public ::testing::TestWithParam<std::string> {};

TEST_P(UcxKilledPeer, SurvivorsGetAnError) {
  const int n = 3, victim = 2;
  attnConfig_t cfg = ATTN_CONFIG_INITIALIZER;
  cfg.timeout_ms = 3000;
  RunOptions opts;
  opts.config = &cfg;
  opts.env = {{"ATTN_TRANSPORT", "ucx"}, {"UCX_TLS", GetParam()}};
  opts.deadline_ms = 60000;
  auto results = attn_test::RunProcessesCollect(n, [&](int rank, int nr, attnComm_t& comm) {
    attn_test::CheckAllReduce(comm, rank, nr, attnFloat32, attnSum, 1023, false);
    const size_t count = 1 << 18;
    attn_test::TypedBuf b(attnFloat32, count);
    if (rank == victim) {
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        raise(SIGKILL);
      }).detach();
      for (;;) attnAllReduce(b.data(), b.data(), count, attnFloat32, attnSum, comm, nullptr);
    }
    attnResult_t r = attnSuccess;
    int it = 0;
    for (; it < 100000 && r == attnSuccess; ++it)
      r = attnAllReduce(b.data(), b.data(), count, attnFloat32, attnMax, comm, nullptr);
    EXPECT_TRUE(r == attnRemoteError || r == attnTimeout)
        << "rank " << rank << " got " << attn_test::ResultName(r) << ": " << attnGetLastError(comm);
    const std::string why = attnGetLastError(comm);
    EXPECT_NE(why.find("peer"), std::string::npos) << why;
    attn_test::ReportFromChild("rank " + std::to_string(rank) + ": " +
                               attn_test::ResultName(r) + " after " + std::to_string(it) +
                               " all-reduces: " + why);
    EXPECT_EQ(attnCommAbort(comm), attnSuccess);
    comm = nullptr;
  }, opts);
  ASSERT_EQ(results.size(), size_t(n));
  EXPECT_TRUE(results[victim].signaled) << results[victim].Describe();
  for (int r = 0; r < n; ++r)
    if (r != victim) EXPECT_TRUE(results[r].passed()) << results[r].Describe();
}

INSTANTIATE_TEST_SUITE_P(Tls, UcxKilledPeer, ::testing::Values("tcp", "sm,self"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "tcp" ? std::string("tcp") : std::string("sm");
                         });

#endif  // ATTN_HAVE_UCX

}  // namespace
