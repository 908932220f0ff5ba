// Failure handling: a peer that never arrives (timeout), attnCommAbort from
// another thread, a SIGKILLed peer (before and during a collective, over shm
// and tcp), a rank that never joins init, a cut network link between two
// emulated hosts (network namespaces), and ATTN_CHECK=1 catching mismatched
// collectives. In every case the surviving ranks must get an error code and
// a readable cause, never hang (the harness deadlines enforce that). On the
// emulated hosts, the survivors of a cut link also shrink it away
// (attnCommShrink; its other cases are in test_shrink.cc).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "attncomm.h"
#include "tests/support/multirank.h"

using namespace attn_test;

namespace {

// ---------------------------------------------------------------------------
// A peer that never calls the collective: attnTimeout within the timeout.

TEST(Faults, PeerNeverArrivesTimesOut) {
  attnConfig_t cfg = ConfigWithTimeout(1500);
  RunOptions opts;
  opts.config = &cfg;
  opts.deadline_ms = 60000;
  std::atomic<bool> rank0Done{false};
  RunThreads(2, [&](int rank, int n, attnComm_t& comm) {
    if (rank == 0) {
      TypedBuf b(attnFloat32, 1000);
      const attnResult_t r = attnAllReduce(b.data(), b.data(), 1000, attnFloat32, attnSum, comm, nullptr);
      EXPECT_EQ(r, attnTimeout) << ResultName(r) << ": " << attnGetLastError(comm);
      EXPECT_TRUE(Contains(attnGetLastError(comm), "rank 0")) << attnGetLastError(comm);
      // The communicator reports itself broken; later calls fail fast.
      attnResult_t st = attnSuccess;
      ATTN_EXPECT_OK(comm, attnCommGetAsyncError(comm, &st));
      EXPECT_NE(st, attnSuccess);
      EXPECT_NE(attnBarrier(comm, nullptr), attnSuccess);
      rank0Done = true;
      EXPECT_EQ(attnCommAbort(comm), attnSuccess);
      comm = nullptr;
    } else {
      while (!rank0Done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      EXPECT_EQ(attnCommAbort(comm), attnSuccess);
      comm = nullptr;
    }
  }, opts);
}

// The same for a point-to-point receive whose sender never sends.
TEST(Faults, RecvWithoutSenderTimesOut) {
  attnConfig_t cfg = ConfigWithTimeout(1000);
  RunOptions opts;
  opts.config = &cfg;
  opts.deadline_ms = 60000;
  std::atomic<bool> done{false};
  RunThreads(2, [&](int rank, int n, attnComm_t& comm) {
    if (rank == 1) {
      int x = 0;
      const attnResult_t r = attnRecv(&x, 1, attnInt32, 0, comm, nullptr);
      EXPECT_EQ(r, attnTimeout) << ResultName(r) << ": " << attnGetLastError(comm);
      EXPECT_STRNE(attnGetLastError(comm), "");
      done = true;
    } else {
      while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(attnCommAbort(comm), attnSuccess);
    comm = nullptr;
  }, opts);
}

// ---------------------------------------------------------------------------
// attnCommAbort from another thread unblocks a rank stuck in a collective
// (no timeout configured: only the abort can end the wait).

void AbortUnblocks(bool p2p) {
  attnConfig_t cfg = ConfigWithTimeout(0);  // wait forever
  RunOptions opts;
  opts.config = &cfg;
  opts.deadline_ms = 60000;
  std::atomic<bool> entering{false}, aborted{false};
  RunThreads(2, [&](int rank, int n, attnComm_t& comm) {
    if (rank == 0) {
      std::thread aborter([&, c = comm] {
        while (!entering) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        EXPECT_EQ(attnCommAbort(c), attnSuccess);
        aborted = true;
      });
      TypedBuf b(attnFloat64, 4096);
      entering = true;
      const attnResult_t r =
          p2p ? attnRecv(b.data(), 4096, attnFloat64, 1, comm, nullptr)
              : attnAllReduce(b.data(), b.data(), 4096, attnFloat64, attnSum, comm, nullptr);
      EXPECT_TRUE(r == attnRemoteError || r == attnInvalidUsage)
          << "blocked call returned " << ResultName(r) << " after attnCommAbort";
      aborter.join();
      EXPECT_TRUE(aborted.load());
      comm = nullptr;  // freed by the abort
    } else {
      while (!aborted) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      EXPECT_EQ(attnCommDestroy(comm), attnSuccess);
      comm = nullptr;
    }
  }, opts);
}

TEST(Faults, AbortFromAnotherThreadUnblocksCollective) { AbortUnblocks(false); }
TEST(Faults, AbortFromAnotherThreadUnblocksRecv) { AbortUnblocks(true); }

// Non-blocking communicators: a failure surfaces through
// attnCommGetAsyncError, and abort ends an init that can never finish.

attnResult_t PollAsync(attnComm_t comm, int deadlineMs) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(deadlineMs);
  attnResult_t st = attnInProgress;
  while (std::chrono::steady_clock::now() < end) {
    if (attnCommGetAsyncError(comm, &st) != attnSuccess) return attnInternalError;
    if (st != attnInProgress) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return attnInProgress;
}

TEST(Faults, NonBlockingCollectiveTimeoutIsReportedAsync) {
  attnUniqueId id;
  ASSERT_EQ(attnGetUniqueId(&id), attnSuccess);
  std::atomic<bool> done{false};
  RunThreadsRaw(2, [&](int rank) {
    attnConfig_t cfg = ConfigWithTimeout(1000);
    cfg.blocking = 0;
    attnComm_t comm = nullptr;
    const attnResult_t r = attnCommInitRankConfig(&comm, 2, id, rank, &cfg);
    ASSERT_TRUE(r == attnSuccess || r == attnInProgress) << ResultName(r);
    ASSERT_EQ(PollAsync(comm, 30000), attnSuccess) << attnGetLastError(comm);
    if (rank == 0) {
      TypedBuf b(attnFloat32, 100);
      const attnResult_t a = attnAllReduce(b.data(), b.data(), 100, attnFloat32, attnSum, comm, nullptr);
      EXPECT_TRUE(a == attnInProgress || a == attnTimeout) << ResultName(a);
      const attnResult_t st = PollAsync(comm, 30000);
      EXPECT_EQ(st, attnTimeout) << ResultName(st) << ": " << attnGetLastError(comm);
      EXPECT_STRNE(attnGetLastError(comm), "");
      done = true;
    } else {
      while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(attnCommAbort(comm), attnSuccess);
  }, 60000);
}

TEST(Faults, AbortEndsNonBlockingInitThatCannotFinish) {
  attnUniqueId id;
  ASSERT_EQ(attnGetUniqueId(&id), attnSuccess);
  RunThreadsRaw(1, [&](int) {
    attnConfig_t cfg = ConfigWithTimeout(0);  // no timeout: only abort ends it
    cfg.blocking = 0;
    attnComm_t comm = nullptr;
    const attnResult_t r = attnCommInitRankConfig(&comm, 2, id, 0, &cfg);  // rank 1 never comes
    ASSERT_TRUE(r == attnInProgress || r == attnSuccess) << ResultName(r);
    ASSERT_NE(comm, nullptr);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    attnResult_t st = attnSuccess;
    ATTN_EXPECT_OK(comm, attnCommGetAsyncError(comm, &st));
    EXPECT_EQ(st, attnInProgress);
    EXPECT_EQ(attnCommAbort(comm), attnSuccess);
  }, 30000);
}

// ---------------------------------------------------------------------------
// A SIGKILLed peer: every surviving rank's collective fails with
// attnRemoteError or attnTimeout and names a peer; nobody hangs.

using KillParam = std::tuple<std::string, bool>;  // transport, mid-collective?
class KilledPeer : public ::testing::TestWithParam<KillParam> {};

TEST_P(KilledPeer, SurvivorsGetAnError) {
  const auto [transport, mid] = GetParam();
  const int n = 3, victim = 2;
  attnConfig_t cfg = ConfigWithTimeout(3000);
  RunOptions opts;
  opts.config = &cfg;
  opts.env = {{"ATTN_TRANSPORT", transport}};
  opts.deadline_ms = 60000;
  auto results = RunProcessesCollect(n, [&, mid = mid](int rank, int nr, attnComm_t& comm) {
    CheckAllReduce(comm, rank, nr, attnFloat32, attnSum, 1023, false);  // the link works
    const size_t count = 1 << 18;
    TypedBuf b(attnFloat32, count);
    if (rank == victim) {
      if (!mid) raise(SIGKILL);
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        raise(SIGKILL);
      }).detach();
      for (;;) attnAllReduce(b.data(), b.data(), count, attnFloat32, attnSum, comm, nullptr);
    }
    attnResult_t r = attnSuccess;
    int iterations = 0;
    for (; iterations < 100000 && r == attnSuccess; ++iterations)
      r = attnAllReduce(b.data(), b.data(), count, attnFloat32, attnMax, comm, nullptr);
    EXPECT_TRUE(IsPeerFailure(r)) << "rank " << rank << " got " << ResultName(r) << " after "
                                  << iterations << " all-reduces: " << attnGetLastError(comm);
    const std::string why = attnGetLastError(comm);
    EXPECT_TRUE(Contains(why, "peer")) << "the error should name a peer: " << why;
    EXPECT_TRUE(Contains(why, "rank " + std::to_string(rank))) << why;
    // Broken: the next call fails too (promptly; the deadline enforces it).
    EXPECT_NE(attnAllReduce(b.data(), b.data(), 16, attnFloat32, attnSum, comm, nullptr), attnSuccess);
    ReportFromChild("rank " + std::to_string(rank) + ": " + ResultName(r) + " after " +
                    std::to_string(iterations) + " iterations: " + why);
    if (rank == 0) {
      EXPECT_EQ(attnCommAbort(comm), attnSuccess);
    } else {
      EXPECT_EQ(attnCommDestroy(comm), attnSuccess);
    }
    comm = nullptr;
  }, opts);
  ASSERT_EQ(results.size(), size_t(n));
  EXPECT_TRUE(results[victim].signaled && results[victim].signal == SIGKILL)
      << results[victim].Describe();
  for (int r = 0; r < n; ++r)
    if (r != victim) EXPECT_TRUE(results[r].passed()) << results[r].Describe();
}

INSTANTIATE_TEST_SUITE_P(Transports, KilledPeer,
                         ::testing::Combine(::testing::Values("shm", "tcp"), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<KillParam>& info) {
                           return std::get<0>(info.param) +
                                  (std::get<1>(info.param) ? "_during" : "_before");
                         });

// A peer killed in the middle of a point-to-point exchange.
TEST(Faults, KilledPeerDuringP2p) {
  attnConfig_t cfg = ConfigWithTimeout(3000);
  RunOptions opts;
  opts.config = &cfg;
  opts.deadline_ms = 60000;
  auto results = RunProcessesCollect(2, [&](int rank, int n, attnComm_t& comm) {
    CheckRingExchange(comm, rank, n, attnInt32, 100);
    if (rank == 1) raise(SIGKILL);
    TypedBuf b(attnInt32, 1000);
    const attnResult_t r = attnRecv(b.data(), 1000, attnInt32, 1, comm, nullptr);
    EXPECT_TRUE(IsPeerFailure(r)) << ResultName(r) << ": " << attnGetLastError(comm);
    EXPECT_TRUE(Contains(attnGetLastError(comm), "peer")) << attnGetLastError(comm);
    attnCommAbort(comm);
    comm = nullptr;
  }, opts);
  EXPECT_TRUE(results[1].signaled) << results[1].Describe();
  EXPECT_TRUE(results[0].passed()) << results[0].Describe();
}

// ---------------------------------------------------------------------------
// Init when a rank never shows up (killed before init, or just absent).

TEST(Faults, RankNeverJoinsInitTimesOut) {
  RunOptions opts;
  opts.deadline_ms = 60000;
  auto results = ForkRanks(3, [&](int rank, const attnUniqueId& id) {
    if (rank == 2) raise(SIGKILL);
    attnConfig_t cfg = ConfigWithTimeout(2000);
    attnComm_t comm = reinterpret_cast<attnComm_t>(0x1);
    const attnResult_t r = attnCommInitRankConfig(&comm, 3, id, rank, &cfg);
    EXPECT_TRUE(IsPeerFailure(r)) << ResultName(r) << ": " << attnGetLastError(nullptr);
    EXPECT_EQ(comm, nullptr);
    const std::string why = attnGetLastError(nullptr);
    EXPECT_TRUE(Contains(why, "rank " + std::to_string(rank))) << why;
  }, opts);
  EXPECT_TRUE(results[2].signaled);
  EXPECT_TRUE(results[0].passed()) << results[0].Describe();
  EXPECT_TRUE(results[1].passed()) << results[1].Describe();
}

TEST(Faults, RankNeverJoinsInitTimesOutThreads) {
  attnUniqueId id;
  ASSERT_EQ(attnGetUniqueId(&id), attnSuccess);
  RunThreadsRaw(2, [&](int rank) {
    attnConfig_t cfg = ConfigWithTimeout(1500);
    attnComm_t comm = nullptr;
    const attnResult_t r = attnCommInitRankConfig(&comm, 3, id, rank, &cfg);
    EXPECT_EQ(r, attnTimeout) << ResultName(r) << ": " << attnGetLastError(nullptr);
    EXPECT_EQ(comm, nullptr);
    EXPECT_STRNE(attnGetLastError(nullptr), "");
  }, 60000);
}

// ---------------------------------------------------------------------------
// ATTN_CHECK=1: mismatched collectives fail with attnInvalidUsage on every
// rank, with a message about the mismatch, without hanging and without
// writing outside the buffers.

enum class Mismatch { kCount, kType, kRoot, kOp, kKind, kReduceRoot };

void MismatchBody(int rank, int n, attnComm_t comm, Mismatch m) {
  const int odd = n - 1;  // the rank that disagrees
  TypedBuf send(attnFloat32, 64), recv(attnFloat32, 64 * n);
  send.Fill(1);
  recv.Fill(Sentinel(attnFloat32));
  attnResult_t r = attnSuccess;
  switch (m) {
    case Mismatch::kCount:
      // The odd rank would send more than the others have room for.
      r = attnAllGather(send.data(), recv.data(), rank == odd ? 9 : 8, attnFloat32, comm, nullptr);
      break;
    case Mismatch::kType:
      r = attnAllReduce(send.data(), recv.data(), 16, rank == odd ? attnInt32 : attnFloat32, attnSum,
                        comm, nullptr);
      break;
    case Mismatch::kRoot:
      r = attnBroadcast(send.data(), recv.data(), 32, attnFloat32, rank == odd ? 1 : 0, comm, nullptr);
      break;
    case Mismatch::kOp:
      r = attnAllReduce(send.data(), recv.data(), 16, attnFloat32, rank == odd ? attnMax : attnSum,
                        comm, nullptr);
      break;
    case Mismatch::kReduceRoot:
      r = attnReduce(send.data(), recv.data(), 16, attnFloat32, attnSum, rank == odd ? 1 : 0, comm, nullptr);
      break;
    case Mismatch::kKind:
      r = rank == odd ? attnAllGather(send.data(), recv.data(), 4, attnFloat32, comm, nullptr)
                      : attnAllReduce(send.data(), recv.data(), 4, attnFloat32, attnSum, comm, nullptr);
      break;
  }
  EXPECT_EQ(r, attnInvalidUsage) << "rank " << rank << ": " << ResultName(r) << ": "
                                 << attnGetLastError(comm);
  const std::string why = attnGetLastError(comm);
  EXPECT_TRUE(Contains(why, "mismatch")) << "rank " << rank << ": " << why;
  EXPECT_TRUE(send.GuardsIntact());
  EXPECT_TRUE(recv.GuardsIntact()) << "rank " << rank << ": write outside the receive buffer";
  if (m != Mismatch::kRoot)  // a broadcast root may have copied its own data
    EXPECT_TRUE(BufEquals(recv, 0, 64 * size_t(n), [](size_t) { return Sentinel(attnFloat32); }))
        << "rank " << rank << ": data moved although the collective was refused";
}

class CheckMismatch : public ::testing::TestWithParam<Mismatch> {};

std::string MismatchName(const ::testing::TestParamInfo<Mismatch>& info) {
  static const char* const kNames[] = {"Count", "Type", "Root", "Op", "Kind", "ReduceRoot"};
  return kNames[int(info.param)];
}

TEST_P(CheckMismatch, ThreadsN3) {
  RunOptions opts;
  opts.env = {{"ATTN_CHECK", "1"}};
  opts.deadline_ms = 60000;
  const Mismatch m = GetParam();
  RunThreads(3, [&](int rank, int n, attnComm_t& comm) {
    MismatchBody(rank, n, comm, m);
    attnCommAbort(comm);
    comm = nullptr;
  }, opts);
}

INSTANTIATE_TEST_SUITE_P(Kinds, CheckMismatch,
                         ::testing::Values(Mismatch::kCount, Mismatch::kType, Mismatch::kRoot,
                                           Mismatch::kOp, Mismatch::kKind, Mismatch::kReduceRoot),
                         MismatchName);

TEST(CheckMismatchProcesses, CountN3) {
  attnConfig_t cfg = ConfigWithTimeout(10000);
  RunOptions opts;
  opts.env = {{"ATTN_CHECK", "1"}};
  opts.config = &cfg;
  opts.deadline_ms = 60000;
  RunProcesses(3, [&](int rank, int n, attnComm_t& comm) {
    CheckAllReduce(comm, rank, n, attnFloat32, attnSum, 100, false);  // matching calls pass
    MismatchBody(rank, n, comm, Mismatch::kCount);
    attnCommAbort(comm);
    comm = nullptr;
  }, opts);
}

// Without ATTN_CHECK, ranks that call a collective with different counts
// are a usage error the library need not name in advance, but it must still
// not hang, crash or write outside the buffers: every rank returns within the
// timeout, some rank with an error, and no buffer's guards are touched. One
// case per forced algorithm, the odd rank's count one above and one below,
// on threads and on processes over tcp and shm.
using UncheckedParam = std::tuple<std::string, std::string>;  // env variable, value
class UncheckedCountMismatch : public ::testing::TestWithParam<UncheckedParam> {};

void UncheckedMismatchBody(int rank, int n, attnComm_t& comm, const std::string& var, int delta,
                           std::atomic<int64_t>& failures) {
  const size_t count = rank == n - 1 ? size_t(2048 + delta) : 2048;
  TypedBuf send(attnFloat32, 2049), recv(attnFloat32, 2049);
  send.Fill(1);
  attnResult_t r = attnSuccess;
  if (var == "ATTN_ALLREDUCE_ALGO")
    r = attnAllReduce(send.data(), recv.data(), count, attnFloat32, attnSum, comm, nullptr);
  else if (var == "ATTN_BROADCAST_ALGO")
    r = attnBroadcast(send.data(), recv.data(), count, attnFloat32, 0, comm, nullptr);
  else
    r = attnReduce(send.data(), recv.data(), count, attnFloat32, attnSum, 0, comm, nullptr);
  const std::string what = "delta " + std::to_string(delta) + ", rank " + std::to_string(rank) + ": " +
                           ResultName(r) + ": " + attnGetLastError(comm);
  if (r != attnSuccess) {
    ++failures;
    EXPECT_TRUE(r == attnInvalidUsage || r == attnTimeout || r == attnRemoteError) << what;
    EXPECT_STRNE(attnGetLastError(comm), "") << what;
  }
  EXPECT_TRUE(send.GuardsIntact()) << what;
  EXPECT_TRUE(recv.GuardsIntact()) << what << ": write outside the receive buffer";
  attnCommAbort(comm);
  comm = nullptr;
}

// transport "": ranks as threads; else processes over that transport.
void RunUncheckedMismatch(const UncheckedParam& param, const std::string& transport) {
  const auto& [var, value] = param;
  for (const int delta : {+1, -1}) {
    attnConfig_t cfg = ConfigWithTimeout(2000);
    RunOptions opts;
    opts.env = {{var, value}, {"ATTN_CHUNK_SIZE", "4096"}};
    if (!transport.empty()) opts.env.push_back({"ATTN_TRANSPORT", transport});
    opts.config = &cfg;
    opts.deadline_ms = 60000;
    ScopedEnv env(opts.env);  // the algorithm settings are read at every call
    SharedCounters failures(1);
    auto body = [&, var = var](int rank, int n, attnComm_t& comm) {
      UncheckedMismatchBody(rank, n, comm, var, delta, failures[0]);
    };
    if (transport.empty())
      RunThreads(4, body, opts);
    else
      RunProcesses(4, body, opts);
    EXPECT_GT(failures[0].load(), 0) << var << "=" << value << ", delta " << delta << ": no rank noticed";
  }
}

TEST_P(UncheckedCountMismatch, EveryRankReturnsThreads) { RunUncheckedMismatch(GetParam(), ""); }
TEST_P(UncheckedCountMismatch, EveryRankReturnsProcessesTcp) { RunUncheckedMismatch(GetParam(), "tcp"); }
TEST_P(UncheckedCountMismatch, EveryRankReturnsProcessesShm) { RunUncheckedMismatch(GetParam(), "shm"); }

INSTANTIATE_TEST_SUITE_P(
    Algos, UncheckedCountMismatch,
    ::testing::Values(UncheckedParam{"ATTN_ALLREDUCE_ALGO", "doubling"}, UncheckedParam{"ATTN_ALLREDUCE_ALGO", "scatter"},
                      UncheckedParam{"ATTN_BROADCAST_ALGO", "tree"}, UncheckedParam{"ATTN_BROADCAST_ALGO", "chain"},
                      UncheckedParam{"ATTN_BROADCAST_ALGO", "direct"}, UncheckedParam{"ATTN_REDUCE_ALGO", "tree"},
                      UncheckedParam{"ATTN_REDUCE_ALGO", "chain"}, UncheckedParam{"ATTN_REDUCE_ALGO", "direct"}),
    [](const ::testing::TestParamInfo<UncheckedParam>& info) {
      const std::string& var = std::get<0>(info.param);
      const std::string coll = var == "ATTN_ALLREDUCE_ALGO" ? "AllReduce" : var == "ATTN_BROADCAST_ALGO" ? "Broadcast" : "Reduce";
      std::string algo = std::get<1>(info.param);
      algo[0] = char(std::toupper(algo[0]));
      return coll + algo;
    });

// With checks on, matching collectives still give exact results.
TEST(CheckMismatch, MatchingCallsStillExact) {
  RunOptions opts;
  opts.env = {{"ATTN_CHECK", "1"}};
  RunThreads(4, [&](int rank, int n, attnComm_t& comm) {
    CheckAllReduce(comm, rank, n, attnBfloat16, attnAvg, 1023, false);
    CheckAllGather(comm, rank, n, attnInt8, 7, true);
    for (int root = 0; root < n; ++root) CheckBroadcast(comm, rank, n, attnInt64, 5, root, false);
    CheckReduceScatter(comm, rank, n, attnFloat16, attnMin, 33, false);
    for (int root = 0; root < n; ++root) CheckReduce(comm, rank, n, attnInt32, attnProd, 5, root, root == 1);
    CheckAllToAll(comm, rank, n, attnUint8, 9);
    CheckAllToAllv(comm, rank, n, attnFloat64, 3);
  }, opts);
}

// With checks on, a rank that refuses its arguments still takes part in the
// signature exchange: its peers fail the call at once, naming it (not after
// the timeout, and without taking its next call for this one), and the next
// call works everywhere. One case per collective, each on another rank. (A
// non-blocking communicator's failed call is its sticky async error, so
// there each case gets communicators of its own: `only`.)
void OneRankRefusesCollective(int rank, int n, attnComm_t comm, bool nonBlocking, int only = -1) {
  TypedBuf send(attnFloat32, 64 * n), recv(attnFloat32, 64 * n);
  send.Fill(1);
  std::vector<size_t> counts(n, 8), displs(n);
  for (int p = 0; p < n; ++p) displs[p] = 8 * p;
  std::vector<size_t> badDispls = displs;
  badDispls[0] = badDispls[1];  // two peers' receive blocks overlap
  for (int variant = 0; variant < 8; ++variant) {
    if (only >= 0 && variant != only) continue;
    const int refuser = variant % n;
    const bool refuses = rank == refuser;
    float* s = static_cast<float*>(send.data());
    float* d = static_cast<float*>(recv.data());
    attnResult_t r = attnSuccess;
    switch (variant) {
      case 0: r = attnAllReduce(s, d, 16, attnFloat32, refuses ? attnRedOp_t(42) : attnSum, comm, nullptr); break;
      case 1: r = attnBroadcast(s, d, 16, attnFloat32, refuses ? n : 0, comm, nullptr); break;
      case 2: r = attnAllGather(refuses ? d + 1 : s, d, 8, attnFloat32, comm, nullptr); break;  // misplaced
      case 3: r = attnReduceScatter(s, refuses ? nullptr : d, 8, attnFloat32, attnSum, comm, nullptr); break;
      case 4: r = attnAllToAll(s, refuses ? s : d, 8, attnFloat32, comm, nullptr); break;  // in place
      case 5:
        r = attnAllToAllv(s, counts.data(), displs.data(), d, counts.data(),
                          refuses ? badDispls.data() : displs.data(), attnFloat32, comm, nullptr);
        break;
      case 6: r = attnBarrier(comm, refuses ? reinterpret_cast<attnStream_t>(0x10) : nullptr); break;
      case 7: r = attnReduce(s, d, 16, attnFloat32, attnSum, refuses ? -1 : 0, comm, nullptr); break;
    }
    if (nonBlocking && !refuses) {
      EXPECT_EQ(r, attnInProgress) << "variant " << variant << ", rank " << rank;
      while (r == attnInProgress) ASSERT_EQ(attnCommGetAsyncError(comm, &r), attnSuccess);
    }
    const std::string why = attnGetLastError(comm);
    const std::string what = "variant " + std::to_string(variant) + ", rank " + std::to_string(rank) + ": " + why;
    if (refuses) {
      EXPECT_EQ(r, attnInvalidArgument) << what;
    } else {
      EXPECT_EQ(r, attnRemoteError) << what;
      EXPECT_TRUE(Contains(why, "rank " + std::to_string(refuser) + " could not take part")) << what;
    }
    if (nonBlocking && refuses) {  // its queued refusal went through without an error of its own
      attnResult_t async = attnInProgress;
      while (async == attnInProgress) ASSERT_EQ(attnCommGetAsyncError(comm, &async), attnSuccess);
      EXPECT_EQ(async, attnSuccess) << what;
    }
    if (!nonBlocking) CheckAllReduce(comm, rank, n, attnFloat32, attnSum, 100, false);  // in step
  }
}

// Signature checks on, a 30 s timeout (a regression fails, not hangs).
RunOptions CheckedOptions(attnConfig_t* cfg, bool blocking) {
  *cfg = ConfigWithTimeout(30000);
  cfg->blocking = blocking ? 1 : 0;
  RunOptions opts;
  opts.env = {{"ATTN_CHECK", "1"}};
  opts.deadline_ms = 60000;
  opts.config = cfg;
  return opts;
}

TEST(CheckMismatch, ArgumentsRefusedOnOneRankFailEveryRankInStepThreads) {
  attnConfig_t cfg;
  RunThreads(3, [&](int rank, int n, attnComm_t& comm) { OneRankRefusesCollective(rank, n, comm, false); },
             CheckedOptions(&cfg, true));
}

TEST(CheckMismatch, ArgumentsRefusedOnOneRankFailEveryRankInStepNonBlocking) {
  attnConfig_t cfg;
  const RunOptions opts = CheckedOptions(&cfg, false);
  for (int variant = 0; variant < 8; ++variant)
    RunThreads(2, [&](int rank, int n, attnComm_t& comm) { OneRankRefusesCollective(rank, n, comm, true, variant); },
               opts);
}

TEST(CheckMismatch, ArgumentsRefusedOnOneRankFailEveryRankInStepProcesses) {
  attnConfig_t cfg;
  RunProcesses(3, [&](int rank, int n, attnComm_t& comm) { OneRankRefusesCollective(rank, n, comm, false); },
               CheckedOptions(&cfg, true));
}

// ---------------------------------------------------------------------------
// A cut link between emulated hosts (network namespaces, over tcp). The
// tests run tests/netns/emulate_hosts.sh with this binary as the rank
// program (NetnsHelper.Rank below); the last rank takes its host's link
// down mid-run.

std::string SelfExe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  buf[n] = 0;
  return buf;
}

// Runs emulate_hosts.sh with `hosts` hosts, NetnsHelper.Rank as the rank
// program in `scenario`, and expects every rank's log to carry `marker`
// lines (one per rank that prints it) and the script to succeed.
void RunNetnsScenario(int hosts, const std::string& scenario, const std::string& marker, int markers) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root for network namespaces";
  if (std::system("ip netns list >/dev/null 2>&1") != 0) GTEST_SKIP() << "'ip netns' not available";
  const std::string script = std::string(ATTN_SOURCE_DIR) + "/tests/netns/emulate_hosts.sh";
  if (!std::filesystem::exists(script)) GTEST_SKIP() << script << " not found";
  const std::string logs = "/tmp/attn_netns_" + scenario + "_" + std::to_string(getpid());
  std::filesystem::create_directories(logs);
  const int port = 20000 + getpid() % 20000;
  const std::string cmd = "ATTN_TEST_NETNS_RANK=" + scenario + " ATTN_TRANSPORT=tcp ATTN_TIMEOUT_MS=60000 "
                          "bash " + script + " --hosts " + std::to_string(hosts) +
                          " --timeout 90 --grace 20 --port " + std::to_string(port) + " --log-dir " + logs +
                          " -- " + SelfExe() + " --gtest_filter=NetnsHelper.Rank";
  const int st = std::system(cmd.c_str());
  const int rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::string rankLogs;
  for (int r = 0; r < hosts; ++r) {
    std::ifstream f(logs + "/rank" + std::to_string(r) + ".log");
    rankLogs += "--- rank " + std::to_string(r) + " ---\n" +
                std::string(std::istreambuf_iterator<char>(f), {});
  }
  std::filesystem::remove_all(logs);
  if (rc == 77) GTEST_SKIP() << "emulate_hosts.sh cannot emulate here\n" << rankLogs;
  EXPECT_EQ(rc, 0) << "emulate_hosts.sh exited " << rc << "\n" << rankLogs;
  int found = 0;
  for (size_t at = rankLogs.find(marker); at != std::string::npos; at = rankLogs.find(marker, at + 1)) ++found;
  EXPECT_EQ(found, markers) << rankLogs;
}

TEST(NetnsLinkDown, CollectiveFailsWithinTimeout) { RunNetnsScenario(2, "linkdown", "LINKDOWN-RESULT", 2); }

// Three hosts; host 2's link goes down. Hosts 0 and 1 see their collective
// fail, shrink host 2 away over the links they still have, and carry on.
TEST(NetnsLinkDown, SurvivorsShrinkAndCarryOn) { RunNetnsScenario(3, "shrink", "SHRINK-RESULT", 2); }

// Takes the switch side of this host's link down (the namespace names
// carry the script's pid, an ancestor of ours); falls back to our own
// interface.
void CutMyLink(int rank) {
  std::string cut = "ip link set eth0 down";
  for (pid_t p = getppid(); p > 1;) {
    const std::string sw = "attn" + std::to_string(p) + "sw";
    if (std::filesystem::exists("/var/run/netns/" + sw)) {
      cut = "ip -n " + sw + " link set p" + std::to_string(rank) + " down";
      break;
    }
    std::ifstream st("/proc/" + std::to_string(p) + "/stat");
    std::string line;
    std::getline(st, line);
    const size_t close = line.rfind(')');
    if (close == std::string::npos) break;
    std::istringstream is(line.substr(close + 2));
    char state;
    pid_t parent = 0;
    is >> state >> parent;
    p = parent;
  }
  std::printf("rank %d: cutting the link: %s\n", rank, cut.c_str());
  std::fflush(stdout);
  ASSERT_EQ(std::system(cut.c_str()), 0) << cut;
}

// Runs only under emulate_hosts.sh (ATTN_TEST_NETNS_RANK names the scenario).
TEST(NetnsHelper, Rank) {
  const char* scenario = std::getenv("ATTN_TEST_NETNS_RANK");
  if (!scenario) GTEST_SKIP() << "helper for NetnsLinkDown; runs only under emulate_hosts.sh";
  const bool shrink = std::string(scenario) == "shrink";
  // The healthy phase runs under a generous timeout: a rank that starts
  // late on a loaded machine must not look like a cut link. Only the
  // communicator split off for the cut carries the short timeout.
  attnConfig_t cfg = ConfigWithTimeout(60000);
  attnComm_t world = nullptr;
  attnResult_t r = attnCommInitFromEnv(&world, &cfg);
  ASSERT_EQ(r, attnSuccess) << attnGetLastError(nullptr);
  int rank = -1, n = 0;
  ATTN_ASSERT_OK(world, attnCommUserRank(world, &rank));
  ATTN_ASSERT_OK(world, attnCommCount(world, &n));
  for (int i = 0; i < 3; ++i) CheckAllReduce(world, rank, n, attnFloat32, attnSum, 65537, false);
  ASSERT_FALSE(HasFailure());
  attnConfig_t shortCfg = ConfigWithTimeout(3000);
  attnComm_t comm = nullptr;
  ATTN_ASSERT_OK(world, attnCommSplit(world, 0, rank, &comm, &shortCfg));
  ASSERT_NE(comm, nullptr);
  CheckAllReduce(comm, rank, n, attnFloat32, attnSum, 65537, false);  // connects before the cut
  ASSERT_FALSE(HasFailure());
  const int victim = n - 1;
  if (rank == victim) CutMyLink(rank);
  TypedBuf b(attnFloat32, 65537);
  r = attnSuccess;
  int it = 0;
  for (; it < 1000 && r == attnSuccess; ++it)
    r = attnAllReduce(b.data(), b.data(), 65537, attnFloat32, attnSum, comm, nullptr);
  EXPECT_TRUE(IsPeerFailure(r)) << ResultName(r) << " after " << it << ": " << attnGetLastError(comm);
  EXPECT_STRNE(attnGetLastError(comm), "");
  if (!shrink) {
    std::printf("LINKDOWN-RESULT rank %d: %s after %d: %s\n", rank, ResultName(r), it,
                attnGetLastError(comm));
  } else if (rank != victim) {
    attnComm_t smaller = nullptr;
    ATTN_ASSERT_OK(comm, attnCommShrink(comm, &victim, 1, &smaller, nullptr, ATTN_SHRINK_ABORT));
    int sn = 0, sr = -1;
    ATTN_ASSERT_OK(smaller, attnCommCount(smaller, &sn));
    ATTN_ASSERT_OK(smaller, attnCommUserRank(smaller, &sr));
    EXPECT_EQ(sn, n - 1);
    EXPECT_EQ(sr, rank);
    for (int i = 0; i < 3; ++i) CheckAllReduce(smaller, sr, sn, attnFloat32, attnSum, 65537, false);
    CheckBroadcast(smaller, sr, sn, attnBfloat16, 10000, sn - 1, false);
    if (!HasFailure())
      std::printf("SHRINK-RESULT rank %d: %s after %d, then rank %d of %d on the shrunk communicator\n",
                  rank, ResultName(r), it, sr, sn);
    EXPECT_EQ(attnCommDestroy(smaller), attnSuccess);
  }
  std::fflush(stdout);
  attnCommAbort(comm);
  attnCommAbort(world);
}

}  // namespace
