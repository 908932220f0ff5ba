// attnCommShrink: the survivors of a communicator form a new one without the
// excluded ranks, whether those left on purpose, died (threads that abort,
// processes killed by SIGKILL) or hang; argument refusals; survivors that
// disagree on the list.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "attncomm.h"
#include "tests/support/attn_fixtures.h"
#include "tests/support/multirank.h"

using namespace attn_test;

namespace {

// The new communicator has the survivors in their old order and carries
// collectives and ring attention exactly.
void CheckShrunk(attnComm_t parent, int oldRank, const std::vector<int>& excluded, attnComm_t shrunk) {
  ASSERT_NE(shrunk, nullptr);
  int n = 0, rank = -1, oldN = 0;
  ATTN_ASSERT_OK(shrunk, attnCommCount(shrunk, &n));
  ATTN_ASSERT_OK(shrunk, attnCommUserRank(shrunk, &rank));
  ATTN_ASSERT_OK(parent, attnCommCount(parent, &oldN));
  int expectRank = 0;
  for (int r = 0; r < oldRank; ++r)
    if (std::find(excluded.begin(), excluded.end(), r) == excluded.end()) ++expectRank;
  EXPECT_EQ(n, oldN - static_cast<int>(excluded.size()));
  EXPECT_EQ(rank, expectRank) << "old rank " << oldRank;
  CheckAllReduce(shrunk, rank, n, attnFloat32, attnSum, 4099, false);
  CheckBroadcast(shrunk, rank, n, attnInt32, 1000, n - 1, true);
  CheckAllGather(shrunk, rank, n, attnBfloat16, 777, false);
  const attnAttnConfig_t cfg = AttnCfg(4, 2, 16, attnFloat32, true);
  const std::vector<int32_t> T = {6 * n + 5};
  const AttnCase c = MakeCase("after shrink", PrefillSpec(cfg, T, {}), 4242);
  const Placement pl = PlannerPlacement(c, T, {}, n);
  for (attnAttnMode_t m : {attnModePassKV, attnModePassQ})
    ExpectRingAttentionExact(c, pl, rank, shrunk, m, true, std::string("after shrink, ") + ModeName(m));
}

// ---------------------------------------------------------------------------
// Planned removal from a healthy communicator: the excluded ranks do not
// call; the list's order does not matter.

TEST(Shrink, HealthyCommunicatorWithoutTwoRanks) {
  std::atomic<int> survivorsDone{0};
  RunThreads(4, [&](int rank, int n, attnComm_t& comm) {
    CheckAllReduce(comm, rank, n, attnFloat32, attnSum, 1000, false);
    if (rank == 0 || rank == 3) {
      while (survivorsDone.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      return;
    }
    const int excluded[] = {3, 0};
    attnComm_t shrunk = nullptr;
    ATTN_ASSERT_OK(comm, attnCommShrink(comm, excluded, 2, &shrunk, nullptr, ATTN_SHRINK_DEFAULT));
    CheckShrunk(comm, rank, {0, 3}, shrunk);
    EXPECT_EQ(attnCommDestroy(shrunk), attnSuccess);
    // The parent is healthy: its survivors can still use it among themselves.
    int x = rank;
    const int peer = rank == 1 ? 2 : 1;
    ATTN_EXPECT_OK(comm, attnGroupStart());
    ATTN_EXPECT_OK(comm, attnSend(&x, 1, attnInt32, peer, comm, nullptr));
    int got = -1;
    ATTN_EXPECT_OK(comm, attnRecv(&got, 1, attnInt32, peer, comm, nullptr));
    ATTN_EXPECT_OK(comm, attnGroupEnd());
    EXPECT_EQ(got, peer);
    ++survivorsDone;
  });
}

// ---------------------------------------------------------------------------
// A rank that dies: its peers see the failure, shrink it away, go on.

void DeadThreadRank(int victim, int flags) {
  attnConfig_t cfg = ConfigWithTimeout(5000);
  RunOptions opts;
  opts.config = &cfg;
  RunThreads(4, [&](int rank, int n, attnComm_t& comm) {
    CheckAllReduce(comm, rank, n, attnFloat32, attnSum, 1000, false);
    if (rank == victim) {
      EXPECT_EQ(attnCommAbort(comm), attnSuccess);
      comm = nullptr;
      return;
    }
    TypedBuf b(attnFloat32, 4096);
    const attnResult_t r = attnAllReduce(b.data(), b.data(), 4096, attnFloat32, attnSum, comm, nullptr);
    EXPECT_TRUE(IsPeerFailure(r)) << ResultName(r) << ": " << attnGetLastError(comm);
    attnResult_t async = attnSuccess;
    ATTN_EXPECT_OK(comm, attnCommGetAsyncError(comm, &async));
    EXPECT_NE(async, attnSuccess);
    attnComm_t shrunk = nullptr;
    ATTN_ASSERT_OK(comm, attnCommShrink(comm, &victim, 1, &shrunk, nullptr, flags));
    CheckShrunk(comm, rank, {victim}, shrunk);
    EXPECT_EQ(attnCommDestroy(shrunk), attnSuccess);
    EXPECT_EQ(attnCommAbort(comm), attnSuccess);
    comm = nullptr;
  }, opts);
}

TEST(Shrink, AfterAThreadRankAborts) { DeadThreadRank(2, ATTN_SHRINK_DEFAULT); }
TEST(Shrink, AfterTheFirstRankAbortsTheNextLeads) { DeadThreadRank(0, ATTN_SHRINK_ABORT); }

// Processes: the victim is SIGKILLed after a healthy collective. Over shm
// and tcp; rank 0 (the lowest, the shrink's natural leader) and a middle one.
using KillParam = std::tuple<const char*, int>;
class ShrinkKilled : public ::testing::TestWithParam<KillParam> {
 protected:
  // Four processes over the parameter's transport run `survive` after a
  // healthy all-reduce, except the victim, which is SIGKILLed there. Every
  // survivor must pass.
  void RunWithVictim(const std::function<void(int rank, attnComm_t& comm, int victim)>& survive) {
    const int victim = std::get<1>(GetParam());
    const int n = 4;
    attnConfig_t cfg = ConfigWithTimeout(5000);
    RunOptions opts;
    opts.config = &cfg;
    opts.deadline_ms = 120000;
    opts.env = {{"ATTN_TRANSPORT", std::get<0>(GetParam())}};
    auto results = RunProcessesCollect(n, [&](int rank, int n, attnComm_t& comm) {
      CheckAllReduce(comm, rank, n, attnFloat32, attnSum, 1025, false);
      if (rank == victim) raise(SIGKILL);
      survive(rank, comm, victim);
      EXPECT_EQ(attnCommAbort(comm), attnSuccess);
      comm = nullptr;
    }, opts);
    ASSERT_EQ(results.size(), size_t(n));
    EXPECT_TRUE(results[victim].signaled && results[victim].signal == SIGKILL) << results[victim].Describe();
    for (int r = 0; r < n; ++r)
      if (r != victim) EXPECT_TRUE(results[r].passed()) << results[r].Describe();
  }
};

TEST_P(ShrinkKilled, SurvivorsShrinkAndGoOn) {
  RunWithVictim([](int rank, attnComm_t& comm, int victim) {
    TypedBuf b(attnFloat32, 65537);
    attnResult_t r = attnSuccess;
    for (int it = 0; it < 1000 && r == attnSuccess; ++it)
      r = attnAllReduce(b.data(), b.data(), 65537, attnFloat32, attnSum, comm, nullptr);
    EXPECT_TRUE(IsPeerFailure(r)) << ResultName(r) << ": " << attnGetLastError(comm);
    attnComm_t shrunk = nullptr;
    ATTN_ASSERT_OK(comm, attnCommShrink(comm, &victim, 1, &shrunk, nullptr, ATTN_SHRINK_DEFAULT));
    CheckShrunk(comm, rank, {victim}, shrunk);
    EXPECT_EQ(attnCommDestroy(shrunk), attnSuccess);
  });
}

// Rank 3 first also excludes rank 1: every survivor fails with
// attnInvalidUsage, though the failing ranks also try to tell the dead
// victim; then they agree.
TEST_P(ShrinkKilled, SurvivorsThatDisagreeFailThenShrink) {
  RunWithVictim([](int rank, attnComm_t& comm, int victim) {
    const std::vector<int> agreed = {victim}, odd = {std::min(victim, 1), std::max(victim, 1)};
    const std::vector<int>& first = rank == 3 ? odd : agreed;
    attnComm_t shrunk = nullptr;
    attnResult_t r = attnCommShrink(comm, first.data(), static_cast<int>(first.size()), &shrunk, nullptr,
                                    ATTN_SHRINK_ABORT);
    EXPECT_EQ(r, attnInvalidUsage) << ResultName(r) << ": " << attnGetLastError(comm);
    EXPECT_TRUE(Contains(attnGetLastError(comm), "different exclude lists")) << attnGetLastError(comm);
    ATTN_ASSERT_OK(comm, attnCommShrink(comm, agreed.data(), 1, &shrunk, nullptr, ATTN_SHRINK_DEFAULT));
    CheckShrunk(comm, rank, agreed, shrunk);
    EXPECT_EQ(attnCommDestroy(shrunk), attnSuccess);
  });
}

INSTANTIATE_TEST_SUITE_P(Transports, ShrinkKilled,
                         ::testing::Combine(::testing::Values("shm", "tcp"), ::testing::Values(0, 2)),
                         [](const ::testing::TestParamInfo<KillParam>& info) {
                           return std::string(std::get<0>(info.param)) + "_victim" +
                                  std::to_string(std::get<1>(info.param));
                         });

// ---------------------------------------------------------------------------
// A rank that hangs (alive, never joins the collective) and a communicator
// that waits forever: ATTN_SHRINK_ABORT ends the stuck operation.

TEST(Shrink, AbortEndsAnOperationHungOnASilentRank) {
  attnConfig_t cfg = ConfigWithTimeout(0);  // only the abort can end the wait
  RunOptions opts;
  opts.config = &cfg;
  opts.deadline_ms = 60000;
  std::atomic<int> survivorsDone{0};
  RunThreads(3, [&](int rank, int n, attnComm_t& comm) {
    const int silent = 2;
    if (rank == silent) return IdleUntilThenAbort(survivorsDone, 2, comm);
    std::atomic<bool> entered{false};
    attnResult_t hung = attnSuccess;
    std::thread stuck([&, c = comm] {
      TypedBuf b(attnFloat64, 4096);
      entered = true;
      hung = attnAllReduce(b.data(), b.data(), 4096, attnFloat64, attnSum, c, nullptr);
    });
    while (!entered) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    attnComm_t shrunk = nullptr;
    attnConfig_t newCfg = ConfigWithTimeout(20000);
    ATTN_ASSERT_OK(comm, attnCommShrink(comm, &silent, 1, &shrunk, &newCfg, ATTN_SHRINK_ABORT));
    stuck.join();
    EXPECT_EQ(hung, attnRemoteError) << ResultName(hung);
    attnResult_t async = attnSuccess;
    ATTN_EXPECT_OK(comm, attnCommGetAsyncError(comm, &async));
    EXPECT_EQ(async, attnRemoteError);
    TypedBuf b(attnFloat32, 16);
    EXPECT_NE(attnAllReduce(b.data(), b.data(), 16, attnFloat32, attnSum, comm, nullptr), attnSuccess)
        << "the parent must stay broken after ATTN_SHRINK_ABORT";
    CheckShrunk(comm, rank, {silent}, shrunk);
    EXPECT_EQ(attnCommDestroy(shrunk), attnSuccess);
    ++survivorsDone;
  }, opts);
}

// The same on a non-blocking communicator: the hung operation sits on its
// executor, and the shrunk communicator (inheriting non-blocking) finishes
// its init in the background.
TEST(Shrink, AbortOnNonBlockingCommunicator) {
  attnConfig_t cfg = ConfigWithTimeout(0);
  cfg.blocking = 0;
  RunOptions opts;
  opts.config = &cfg;
  opts.deadline_ms = 60000;
  std::atomic<int> survivorsDone{0};
  RunThreads(3, [&](int rank, int n, attnComm_t& comm) {
    const int silent = 0;
    if (rank == silent) return IdleUntilThenAbort(survivorsDone, 2, comm);
    TypedBuf b(attnFloat64, 4096);
    EXPECT_EQ(attnAllReduce(b.data(), b.data(), 4096, attnFloat64, attnSum, comm, nullptr), attnInProgress);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    attnResult_t async = attnSuccess;
    ATTN_EXPECT_OK(comm, attnCommGetAsyncError(comm, &async));
    EXPECT_EQ(async, attnInProgress);
    attnComm_t shrunk = nullptr;
    const attnResult_t r = attnCommShrink(comm, &silent, 1, &shrunk, nullptr, ATTN_SHRINK_ABORT);
    ASSERT_TRUE(r == attnSuccess || r == attnInProgress) << ResultName(r) << ": " << attnGetLastError(comm);
    ASSERT_NE(shrunk, nullptr);
    ATTN_EXPECT_OK(comm, attnCommGetAsyncError(comm, &async));
    EXPECT_EQ(async, attnRemoteError) << "the hung all-reduce must have been ended";
    attnResult_t st = attnInProgress;
    while (st == attnInProgress) {
      ATTN_ASSERT_OK(shrunk, attnCommGetAsyncError(shrunk, &st));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_EQ(st, attnSuccess) << attnGetLastError(shrunk);
    int newN = 0, newRank = -1;
    ATTN_ASSERT_OK(shrunk, attnCommCount(shrunk, &newN));
    ATTN_ASSERT_OK(shrunk, attnCommUserRank(shrunk, &newRank));
    EXPECT_EQ(newN, 2);
    EXPECT_EQ(newRank, rank - 1);
    double x = rank;
    EXPECT_EQ(attnAllReduce(&x, &x, 1, attnFloat64, attnSum, shrunk, nullptr), attnInProgress);
    do {
      ATTN_ASSERT_OK(shrunk, attnCommGetAsyncError(shrunk, &st));
    } while (st == attnInProgress);
    EXPECT_EQ(st, attnSuccess) << attnGetLastError(shrunk);
    EXPECT_EQ(x, 3.0);
    EXPECT_EQ(attnCommDestroy(shrunk), attnSuccess);
    ++survivorsDone;
  }, opts);
}

// ---------------------------------------------------------------------------
// Refusals: each leaves the parent as it was.

TEST(Shrink, BadArgumentsAreRefusedAndHarmless) {
  RunThreads(3, [&](int rank, int n, attnComm_t& comm) {
    const int other = (rank + 1) % n, third = (rank + 2) % n;
    attnComm_t out = reinterpret_cast<attnComm_t>(0x1);
    auto expectRefused = [&](attnResult_t want, const int* list, int count, attnComm_t* newcomm, int flags,
                             const char* what, const char* says) {
      const attnResult_t r = attnCommShrink(comm, list, count, newcomm, nullptr, flags);
      EXPECT_EQ(r, want) << what << ": " << ResultName(r);
      EXPECT_TRUE(Contains(attnGetLastError(comm), says)) << what << ": " << attnGetLastError(comm);
      if (newcomm) EXPECT_EQ(*newcomm, nullptr) << what;
    };
    const int outOfRange[] = {n}, negative[] = {-1}, twice[] = {other, other}, self[] = {rank},
              everyone[] = {other, third, rank}, others[] = {other, third};
    expectRefused(attnInvalidArgument, &other, 1, nullptr, 0, "NULL newcomm", "newcomm");
    expectRefused(attnInvalidArgument, outOfRange, 1, &out, 0, "rank n", "outside");
    expectRefused(attnInvalidArgument, negative, 1, &out, 0, "rank -1", "outside");
    expectRefused(attnInvalidArgument, twice, 2, &out, 0, "listed twice", "twice");
    expectRefused(attnInvalidArgument, self, 1, &out, 0, "own rank", "own exclude list");
    expectRefused(attnInvalidArgument, everyone, 3, &out, 0, "every rank", "leaves no rank");
    expectRefused(attnInvalidArgument, others, -1, &out, 0, "negative count", "negative");
    expectRefused(attnInvalidArgument, nullptr, 1, &out, 0, "NULL list", "NULL");
    expectRefused(attnInvalidArgument, &other, 1, &out, 0x4, "unknown flag", "shrinkFlags");
    ATTN_EXPECT_OK(comm, attnGroupStart());
    expectRefused(attnInvalidUsage, &other, 1, &out, 0, "inside a group", "group");
    ATTN_EXPECT_OK(comm, attnGroupEnd());
    EXPECT_EQ(attnCommShrink(nullptr, &other, 1, &out, nullptr, 0), attnInvalidArgument);
    CheckAllReduce(comm, rank, n, attnInt32, attnMax, 333, true);
  });
}

// Survivors that pass different lists all fail with attnInvalidUsage,
// never by the timeout (20 s here: a rank left waiting would return
// attnTimeout instead), and a second, agreeing call then succeeds. The
// lists pick different leaders, leaders that exclude their followers,
// followers that exclude their leader.
struct DisagreeCase {
  const char* name;
  std::vector<std::vector<int>> lists;  // per rank; {-1}: the rank does not call
  std::vector<int> agreed;              // the second call's list
};

void PrintTo(const DisagreeCase& c, std::ostream* os) { *os << c.name; }

class ShrinkDisagree : public ::testing::TestWithParam<DisagreeCase> {};

TEST_P(ShrinkDisagree, EverySurvivorFailsThenTheyAgree) {
  const DisagreeCase& dc = GetParam();
  const int n = static_cast<int>(dc.lists.size());
  attnConfig_t cfg = ConfigWithTimeout(20000);
  RunOptions opts;
  opts.config = &cfg;
  std::atomic<int> survivorsDone{0};
  const int survivors = n - static_cast<int>(dc.agreed.size());
  RunThreads(n, [&](int rank, int, attnComm_t& comm) {
    const std::vector<int>& mine = dc.lists[rank];
    attnComm_t shrunk = nullptr;
    if (mine != std::vector<int>{-1}) {
      attnResult_t r = attnCommShrink(comm, mine.data(), static_cast<int>(mine.size()), &shrunk, nullptr, 0);
      EXPECT_EQ(r, attnInvalidUsage) << "rank " << rank << ": " << ResultName(r) << ": " << attnGetLastError(comm);
      EXPECT_TRUE(Contains(attnGetLastError(comm), "different exclude lists")) << attnGetLastError(comm);
      EXPECT_EQ(shrunk, nullptr);
    }
    if (std::find(dc.agreed.begin(), dc.agreed.end(), rank) != dc.agreed.end()) {
      while (survivorsDone.load() < survivors) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      return;
    }
    ATTN_ASSERT_OK(comm, attnCommShrink(comm, dc.agreed.data(), static_cast<int>(dc.agreed.size()), &shrunk,
                                        nullptr, 0));
    CheckShrunk(comm, rank, dc.agreed, shrunk);
    EXPECT_EQ(attnCommDestroy(shrunk), attnSuccess);
    ++survivorsDone;
  }, opts);
}

INSTANTIATE_TEST_SUITE_P(
    Lists, ShrinkDisagree,
    ::testing::Values(DisagreeCase{"FollowerExcludesOneMore", {{3}, {3}, {1, 3}, {-1}}, {3}},
                      DisagreeCase{"LeaderExcludesOneMore", {{1, 3}, {3}, {3}, {-1}}, {3}},
                      DisagreeCase{"OneExcludesTheLowest", {{}, {0}, {}, {}}, {}},
                      DisagreeCase{"TwoLeaders", {{3}, {0}, {3}, {0}}, {}},
                      DisagreeCase{"EveryListDiffers", {{1}, {2}, {3}, {0}}, {}},
                      DisagreeCase{"TwoLeadersFiveRanks", {{4}, {0}, {4}, {0}, {0}}, {}},
                      // Found by a model of the protocol: only the leader,
                      // which excludes them, can tell ranks 1 and 3.
                      DisagreeCase{"LeaderExcludesTwoFollowers", {{1, 3}, {3}, {}, {1, 2}}, {}},
                      DisagreeCase{"ChainOfLeaders", {{}, {2, 3}, {0}, {1, 2}}, {}}),
    [](const ::testing::TestParamInfo<DisagreeCase>& i) { return std::string(i.param.name); });

// A rank that the others exclude but that calls anyway is refused by the
// leader it picks, while the others form their communicator. Rank 1 calls
// only after rank 3 has its answer, so the leader is still collecting.
TEST(Shrink, AnExcludedRankThatCallsIsRefused) {
  attnConfig_t cfg = ConfigWithTimeout(20000);
  RunOptions opts;
  opts.config = &cfg;
  std::atomic<bool> refused{false};
  RunThreads(4, [&](int rank, int, attnComm_t& comm) {
    attnComm_t shrunk = nullptr;
    if (rank == 3) {
      attnResult_t r = attnCommShrink(comm, nullptr, 0, &shrunk, nullptr, 0);
      EXPECT_EQ(r, attnInvalidUsage) << ResultName(r) << ": " << attnGetLastError(comm);
      EXPECT_TRUE(Contains(attnGetLastError(comm), "rank 3's differs from rank 0's")) << attnGetLastError(comm);
      EXPECT_EQ(shrunk, nullptr);
      refused = true;
      return;
    }
    if (rank == 1)
      while (!refused.load()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const std::vector<int> excluded = {3};
    ATTN_ASSERT_OK(comm, attnCommShrink(comm, excluded.data(), 1, &shrunk, nullptr, 0));
    CheckShrunk(comm, rank, excluded, shrunk);
    EXPECT_EQ(attnCommDestroy(shrunk), attnSuccess);
  }, opts);
}

// An excluded rank that calls only after the survivors formed their
// communicator finds the leader's notice and fails at once with
// attnInvalidUsage, not by the timeout (20 s: a rank left waiting would
// return attnTimeout). Whether the latecomer would follow rank 0 or, being
// rank 0, lead in its own view.
class ShrinkLateExcluded : public ::testing::TestWithParam<int> {};

TEST_P(ShrinkLateExcluded, IsToldItWasExcluded) {
  const int late = GetParam();
  attnConfig_t cfg = ConfigWithTimeout(20000);
  RunOptions opts;
  opts.config = &cfg;
  std::atomic<int> formed{0};
  std::atomic<bool> told{false};
  RunThreads(4, [&](int rank, int, attnComm_t& comm) {
    attnComm_t shrunk = nullptr;
    if (rank == late) {
      while (formed.load() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      attnResult_t r = attnCommShrink(comm, nullptr, 0, &shrunk, nullptr, 0);
      EXPECT_EQ(r, attnInvalidUsage) << ResultName(r) << ": " << attnGetLastError(comm);
      const std::string expect = "rank " + std::to_string(late) + " is excluded from the communicator";
      EXPECT_TRUE(Contains(attnGetLastError(comm), expect)) << attnGetLastError(comm);
      EXPECT_EQ(shrunk, nullptr);
      told = true;
      return;
    }
    const std::vector<int> excluded = {late};
    ATTN_ASSERT_OK(comm, attnCommShrink(comm, excluded.data(), 1, &shrunk, nullptr, 0));
    ++formed;
    CheckShrunk(comm, rank, excluded, shrunk);
    EXPECT_EQ(attnCommDestroy(shrunk), attnSuccess);
    while (!told.load()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }, opts);
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShrinkLateExcluded, ::testing::Values(0, 2, 3),
                         [](const ::testing::TestParamInfo<int>& i) { return "Rank" + std::to_string(i.param); });

}  // namespace
