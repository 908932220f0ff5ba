// The communicator API: version and error strings, init / split / destroy /
// abort, non-blocking config, config validation, attnCommInitFromEnv with
// each launcher convention, and argument validation (clear codes and a
// last-error text naming the rank).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "attncomm.h"
#include "tests/support/multirank.h"

using namespace attn_test;

namespace {

// ---------------------------------------------------------------------------
// Library and errors

TEST(Api, Version) {
  int v = 0;
  ASSERT_EQ(attnGetVersion(&v), attnSuccess);
  EXPECT_EQ(v, ATTN_VERSION_CODE);
  EXPECT_EQ(ATTN_VERSION_CODE, ATTN_VERSION(ATTN_MAJOR, ATTN_MINOR, ATTN_PATCH));
  EXPECT_EQ(attnGetVersion(nullptr), attnInvalidArgument);
}

// attnMemAlloc / attnMemFree: zeroed, writable, page-aligned memory; bad
// pointers and sizes are refused with a message, never a crash.
TEST(Api, MemAllocAndFree) {
  void* p = nullptr;
  ASSERT_EQ(attnMemAlloc(&p, 12345), attnSuccess) << attnGetLastError(nullptr);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
  const unsigned char* b = static_cast<const unsigned char*>(p);
  EXPECT_TRUE(std::all_of(b, b + 12345, [](unsigned char c) { return c == 0; }));
  memset(p, 0x5a, 12345);
  void* q = nullptr;
  ASSERT_EQ(attnMemAlloc(&q, 1), attnSuccess);
  EXPECT_NE(p, q);

  // Not the start of an allocation, twice freed, or never allocated.
  EXPECT_EQ(attnMemFree(static_cast<char*>(p) + 8), attnInvalidArgument);
  EXPECT_TRUE(Contains(attnGetLastError(nullptr), "attnMemAlloc")) << attnGetLastError(nullptr);
  int local = 0;
  EXPECT_EQ(attnMemFree(&local), attnInvalidArgument);
  EXPECT_EQ(attnMemFree(p), attnSuccess);
  EXPECT_EQ(attnMemFree(p), attnInvalidArgument);
  EXPECT_EQ(attnMemFree(q), attnSuccess);
  EXPECT_EQ(attnMemFree(nullptr), attnSuccess);

  EXPECT_EQ(attnMemAlloc(nullptr, 64), attnInvalidArgument);
  void* r = &local;
  EXPECT_EQ(attnMemAlloc(&r, 0), attnInvalidArgument);
  EXPECT_EQ(r, nullptr);
  EXPECT_TRUE(Contains(attnGetLastError(nullptr), "size is 0")) << attnGetLastError(nullptr);
  EXPECT_EQ(attnMemAlloc(&r, ~size_t(0)), attnInvalidArgument);
}

TEST(Api, ErrorStringsAreDistinctAndNonEmpty) {
  std::set<std::string> seen;
  for (int r = 0; r < attnNumResults; ++r) {
    const char* s = attnGetErrorString(static_cast<attnResult_t>(r));
    ASSERT_NE(s, nullptr) << r;
    EXPECT_GT(std::strlen(s), 0u) << r;
    EXPECT_TRUE(seen.insert(s).second) << "duplicate text for code " << r << ": " << s;
  }
  for (int r : {-1, int(attnNumResults), 1000}) {
    const char* s = attnGetErrorString(static_cast<attnResult_t>(r));
    ASSERT_NE(s, nullptr) << r;
    EXPECT_GT(std::strlen(s), 0u);
  }
}

TEST(Api, ThreadLastErrorAfterFailedInit) {
  int v;
  EXPECT_EQ(attnGetVersion(&v), attnSuccess);
  attnUniqueId id;
  ASSERT_EQ(attnCommInitRank(nullptr, 2, id, 0), attnInvalidArgument);
  EXPECT_STRNE(attnGetLastError(nullptr), "");
}

// ---------------------------------------------------------------------------
// Init argument checks

TEST(Init, BadArgumentsFailFastWithMessage) {
  attnUniqueId id;
  ASSERT_EQ(attnGetUniqueId(&id), attnSuccess) << attnGetLastError(nullptr);
  attnComm_t comm = reinterpret_cast<attnComm_t>(0x1);
  struct Case {
    int nranks, rank;
    const char* what;
  } cases[] = {{0, 0, "nranks 0"}, {-3, 0, "nranks -3"}, {2, -1, "rank -1"}, {2, 2, "rank == nranks"},
               {2, 7, "rank > nranks"}};
  for (const auto& c : cases) {
    comm = reinterpret_cast<attnComm_t>(0x1);
    const attnResult_t r = attnCommInitRank(&comm, c.nranks, id, c.rank);
    EXPECT_EQ(r, attnInvalidArgument) << c.what << ": " << ResultName(r);
    EXPECT_EQ(comm, nullptr) << c.what << ": *comm must be NULL after a failed init";
    EXPECT_STRNE(attnGetLastError(nullptr), "") << c.what;
  }
  EXPECT_EQ(attnCommInitRank(nullptr, 2, id, 0), attnInvalidArgument);
  EXPECT_EQ(attnGetUniqueId(nullptr), attnInvalidArgument);
  EXPECT_EQ(attnCommInitAll(nullptr, 2, nullptr), attnInvalidArgument);
  attnComm_t comms[2];
  EXPECT_EQ(attnCommInitAll(comms, 0, nullptr), attnInvalidArgument);
  EXPECT_STRNE(attnGetLastError(nullptr), "");
}

TEST(Init, GarbageIdIsRejected) {
  attnUniqueId id;
  std::memset(&id, 0, sizeof(id));
  attnComm_t comm = nullptr;
  EXPECT_EQ(attnCommInitRank(&comm, 2, id, 0), attnInvalidArgument);
  EXPECT_EQ(comm, nullptr);
  EXPECT_STRNE(attnGetLastError(nullptr), "");
  std::memset(&id, 0x5a, sizeof(id));
  EXPECT_EQ(attnCommInitRank(&comm, 2, id, 1), attnInvalidArgument);
}

TEST(Init, CountAndUserRank) {
  for (int n : {1, 2, 5}) {
    std::vector<attnComm_t> comms(n);
    ATTN_ASSERT_OK(nullptr, attnCommInitAll(comms.data(), n, nullptr));
    for (int r = 0; r < n; ++r) {
      int count = -1, rank = -1;
      ATTN_EXPECT_OK(comms[r], attnCommCount(comms[r], &count));
      ATTN_EXPECT_OK(comms[r], attnCommUserRank(comms[r], &rank));
      EXPECT_EQ(count, n);
      EXPECT_EQ(rank, r);
      int device = 7;
      ATTN_EXPECT_OK(comms[r], attnCommDevice(comms[r], &device));
      EXPECT_EQ(device, ATTN_DEVICE_HOST);
      EXPECT_EQ(attnCommCount(comms[r], nullptr), attnInvalidArgument);
      EXPECT_EQ(attnCommUserRank(comms[r], nullptr), attnInvalidArgument);
      EXPECT_EQ(attnCommDevice(comms[r], nullptr), attnInvalidArgument);
    }
    EXPECT_EQ(attnCommCount(nullptr, nullptr), attnInvalidArgument);
    int device = 7;
    EXPECT_EQ(attnCommDevice(nullptr, &device), attnInvalidArgument);
    for (auto c : comms) EXPECT_EQ(attnCommDestroy(c), attnSuccess);
  }
}

TEST(Init, InitRankProcessesAndThreadsWithConfig) {
  attnConfig_t cfg = ATTN_CONFIG_INITIALIZER;
  cfg.timeout_ms = 20000;
  cfg.comm_name = "api-test";
  RunOptions opts;
  opts.config = &cfg;
  RunThreads(3, [&](int rank, int n, attnComm_t& comm) {
    CheckAllReduce(comm, rank, n, attnFloat32, attnSum, 100, false);
  }, opts);
  RunProcesses(3, [&](int rank, int n, attnComm_t& comm) {
    int c = 0, r = -1;
    ATTN_EXPECT_OK(comm, attnCommCount(comm, &c));
    ATTN_EXPECT_OK(comm, attnCommUserRank(comm, &r));
    EXPECT_EQ(c, n);
    EXPECT_EQ(r, rank);
    CheckAllReduce(comm, rank, n, attnInt32, attnMax, 100, false);
  }, opts);
}

// A caller compiled against an older, smaller attnConfig_t (no comm_name).
TEST(Init, OlderSmallerConfigStructIsAccepted) {
  attnConfig_t cfg = ATTN_CONFIG_INITIALIZER;
  cfg.size = offsetof(attnConfig_t, comm_name);
  cfg.comm_name = reinterpret_cast<const char*>(0x1);  // beyond the old size: never read
  cfg.timeout_ms = 20000;
  RunOptions opts;
  opts.config = &cfg;
  RunThreads(2, [&](int rank, int n, attnComm_t& comm) {
    CheckAllGather(comm, rank, n, attnInt64, 33, false);
  }, opts);
}

TEST(Init, ConfigValidation) {
  attnUniqueId id;
  ASSERT_EQ(attnGetUniqueId(&id), attnSuccess);
  struct Case {
    const char* what;
    void (*edit)(attnConfig_t*);
  } cases[] = {
      {"magic 0", [](attnConfig_t* c) { c->magic = 0; }},
      {"blocking 2", [](attnConfig_t* c) { c->blocking = 2; }},
      {"timeout_ms -5", [](attnConfig_t* c) { c->timeout_ms = -5; }},
      {"transports bogus", [](attnConfig_t* c) { c->transports = "shm,carrier-pigeon"; }},
      {"transports empty", [](attnConfig_t* c) { c->transports = ","; }},
      {"size 4", [](attnConfig_t* c) { c->size = 4; }},
      {"device -7", [](attnConfig_t* c) { c->device = -7; }},
  };
  for (const auto& c : cases) {
    attnConfig_t cfg = ATTN_CONFIG_INITIALIZER;
    c.edit(&cfg);
    attnComm_t comm = reinterpret_cast<attnComm_t>(0x1);
    const attnResult_t r = attnCommInitRankConfig(&comm, 2, id, 0, &cfg);
    EXPECT_EQ(r, attnInvalidArgument) << c.what << ": " << ResultName(r);
    EXPECT_EQ(comm, nullptr) << c.what;
    EXPECT_STRNE(attnGetLastError(nullptr), "") << c.what;
  }
}

TEST(Init, BadTransportInEnvironmentIsRejected) {
  attnUniqueId id;
  ASSERT_EQ(attnGetUniqueId(&id), attnSuccess);
  ScopedEnv env(std::vector<std::pair<std::string, std::string>>{{"ATTN_TRANSPORT", "warp-drive"}});
  attnComm_t comm = nullptr;
  EXPECT_EQ(attnCommInitRank(&comm, 2, id, 0), attnInvalidArgument);
  EXPECT_TRUE(Contains(attnGetLastError(nullptr), "warp-drive")) << attnGetLastError(nullptr);
}

// ---------------------------------------------------------------------------
// Destroy / abort

TEST(Lifecycle, AbortIdleCommunicators) {
  std::vector<attnComm_t> comms(3);
  ATTN_ASSERT_OK(nullptr, attnCommInitAll(comms.data(), 3, nullptr));
  for (auto c : comms) EXPECT_EQ(attnCommAbort(c), attnSuccess);
}

TEST(Lifecycle, ManyCreateDestroyCycles) {
  for (int i = 0; i < 10; ++i) {
    std::vector<attnComm_t> comms(2);
    ATTN_ASSERT_OK(nullptr, attnCommInitAll(comms.data(), 2, nullptr));
    RunThreadsRaw(2, [&](int rank) {
      CheckAllReduce(comms[rank], rank, 2, attnInt32, attnSum, 17 + i, false);
      EXPECT_EQ(attnCommDestroy(comms[rank]), attnSuccess);
    });
  }
}

TEST(Lifecycle, AsyncErrorIsSuccessOnHealthyBlockingComm) {
  RunThreads(2, [&](int rank, int n, attnComm_t& comm) {
    attnResult_t st = attnInternalError;
    ATTN_ASSERT_OK(comm, attnCommGetAsyncError(comm, &st));
    EXPECT_EQ(st, attnSuccess);
    EXPECT_EQ(attnCommGetAsyncError(comm, nullptr), attnInvalidArgument);
  });
}

// ---------------------------------------------------------------------------
// Split

// Each rank contributes its parent rank; the gather shows the membership
// and order of the new communicator.
std::vector<int> GatherParentRanks(attnComm_t sub, int parentRank) {
  int n = 0;
  EXPECT_EQ(attnCommCount(sub, &n), attnSuccess);
  std::vector<int32_t> all(n, -1);
  int32_t mine = parentRank;
  int me = -1;
  EXPECT_EQ(attnCommUserRank(sub, &me), attnSuccess);
  const attnResult_t r = attnAllGather(&mine, all.data(), 1, attnInt32, sub, nullptr);
  EXPECT_EQ(r, attnSuccess) << attnGetLastError(sub);
  return std::vector<int>(all.begin(), all.end());
}

void SplitBody(int rank, int n, attnComm_t comm) {
  // Even / odd, key = rank.
  {
    attnComm_t sub = nullptr;
    ATTN_ASSERT_OK(comm, attnCommSplit(comm, rank % 2, rank, &sub, nullptr));
    ASSERT_NE(sub, nullptr);
    std::vector<int> want;
    for (int r = rank % 2; r < n; r += 2) want.push_back(r);
    EXPECT_EQ(GatherParentRanks(sub, rank), want) << "even/odd split on rank " << rank;
    int sr = -1, sn = -1;
    ATTN_EXPECT_OK(sub, attnCommUserRank(sub, &sr));
    ATTN_EXPECT_OK(sub, attnCommCount(sub, &sn));
    EXPECT_EQ(sr, rank / 2);
    CheckAllReduce(sub, sr, sn, attnFloat32, attnSum, 1023, false);
    CheckAllReduce(sub, sr, sn, attnInt8, attnProd, 77, true);
    CheckReduceScatter(sub, sr, sn, attnFloat64, attnAvg, 65, false);
    CheckBroadcast(sub, sr, sn, attnBfloat16, 500, sn - 1, false);
    CheckReduce(sub, sr, sn, attnFloat32, attnMax, 333, sn - 1, false);
    CheckAllToAllv(sub, sr, sn, attnInt32, 17);
    // The parent still works while the child exists.
    CheckAllReduce(comm, rank, n, attnInt64, attnMin, 99, false);
    EXPECT_EQ(attnCommDestroy(sub), attnSuccess);
  }
  // Key reversal: one color, key = n - rank.
  {
    attnComm_t sub = nullptr;
    ATTN_ASSERT_OK(comm, attnCommSplit(comm, 7, n - rank, &sub, nullptr));
    ASSERT_NE(sub, nullptr);
    std::vector<int> want;
    for (int r = n - 1; r >= 0; --r) want.push_back(r);
    EXPECT_EQ(GatherParentRanks(sub, rank), want) << "reversed split on rank " << rank;
    int sr = -1;
    ATTN_EXPECT_OK(sub, attnCommUserRank(sub, &sr));
    EXPECT_EQ(sr, n - 1 - rank);
    CheckAllGather(sub, sr, n, attnFloat16, 31, false);
    EXPECT_EQ(attnCommDestroy(sub), attnSuccess);
  }
  // Equal keys: parent order decides.
  {
    attnComm_t sub = nullptr;
    ATTN_ASSERT_OK(comm, attnCommSplit(comm, 0, 5, &sub, nullptr));
    std::vector<int> want;
    for (int r = 0; r < n; ++r) want.push_back(r);
    EXPECT_EQ(GatherParentRanks(sub, rank), want);
    EXPECT_EQ(attnCommDestroy(sub), attnSuccess);
  }
  // NOCOLOR on rank 0 (and on the last rank): they get NULL.
  {
    attnComm_t sub = reinterpret_cast<attnComm_t>(0x1);
    const bool out = rank == 0 || rank == n - 1;
    ATTN_ASSERT_OK(comm, attnCommSplit(comm, out ? ATTN_SPLIT_NOCOLOR : 3, -rank, &sub, nullptr));
    if (out) {
      EXPECT_EQ(sub, nullptr);
    } else {
      ASSERT_NE(sub, nullptr);
      std::vector<int> want;
      for (int r = n - 2; r >= 1; --r) want.push_back(r);
      EXPECT_EQ(GatherParentRanks(sub, rank), want);
      int sr = -1, sn = -1;
      ATTN_EXPECT_OK(sub, attnCommUserRank(sub, &sr));
      ATTN_EXPECT_OK(sub, attnCommCount(sub, &sn));
      CheckAllReduce(sub, sr, sn, attnUint8, attnMax, 1000, false);
      // Split of a split: each rank alone.
      attnComm_t solo = nullptr;
      ATTN_ASSERT_OK(sub, attnCommSplit(sub, sr, 0, &solo, nullptr));
      ASSERT_NE(solo, nullptr);
      int soloN = 0;
      ATTN_EXPECT_OK(solo, attnCommCount(solo, &soloN));
      EXPECT_EQ(soloN, 1);
      CheckAllReduce(solo, 0, 1, attnFloat32, attnAvg, 10, false);
      EXPECT_EQ(attnCommDestroy(solo), attnSuccess);
      EXPECT_EQ(attnCommDestroy(sub), attnSuccess);
    }
  }
  // With a config: the child's own options.
  {
    attnConfig_t cfg = ATTN_CONFIG_INITIALIZER;
    cfg.timeout_ms = 15000;
    attnComm_t sub = nullptr;
    ATTN_ASSERT_OK(comm, attnCommSplit(comm, rank < n / 2 ? 0 : 1, 0, &sub, &cfg));
    ASSERT_NE(sub, nullptr);
    int sr = -1, sn = -1;
    ATTN_EXPECT_OK(sub, attnCommUserRank(sub, &sr));
    ATTN_EXPECT_OK(sub, attnCommCount(sub, &sn));
    EXPECT_EQ(sn, rank < n / 2 ? n / 2 : n - n / 2);
    CheckAllToAll(sub, sr, sn, attnFloat32, 13);
    EXPECT_EQ(attnCommDestroy(sub), attnSuccess);
  }
  // Bad color.
  attnComm_t sub = nullptr;
  EXPECT_EQ(attnCommSplit(comm, -5, 0, &sub, nullptr), attnInvalidArgument);
  EXPECT_EQ(attnCommSplit(comm, 0, 0, nullptr, nullptr), attnInvalidArgument);
}

TEST(Split, ThreadsN4) {
  RunThreads(4, [&](int rank, int n, attnComm_t& comm) { SplitBody(rank, n, comm); });
}

TEST(Split, ThreadsN5) {
  RunThreads(5, [&](int rank, int n, attnComm_t& comm) { SplitBody(rank, n, comm); });
}

TEST(Split, ProcessesN4) {
  RunProcesses(4, [&](int rank, int n, attnComm_t& comm) { SplitBody(rank, n, comm); });
}

// ---------------------------------------------------------------------------
// Non-blocking communicators

attnResult_t PollUntilDone(attnComm_t comm, int deadlineMs = 30000) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(deadlineMs);
  attnResult_t st = attnInProgress;
  while (std::chrono::steady_clock::now() < end) {
    if (attnCommGetAsyncError(comm, &st) != attnSuccess) return attnInternalError;
    if (st != attnInProgress) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return attnTimeout;
}

// A non-blocking communicator, polled until its initialisation is done.
void InitNonBlocking(int n, const attnUniqueId& id, int rank, attnComm_t* comm) {
  attnConfig_t cfg = ATTN_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  cfg.timeout_ms = 20000;
  const attnResult_t r = attnCommInitRankConfig(comm, n, id, rank, &cfg);
  ASSERT_TRUE(r == attnSuccess || r == attnInProgress) << ResultName(r);
  ASSERT_EQ(PollUntilDone(*comm), attnSuccess) << attnGetLastError(*comm);
}

void NonBlockingBody(int rank, int n, attnComm_t comm) {
  int count = 0;
  ATTN_EXPECT_OK(comm, attnCommCount(comm, &count));
  EXPECT_EQ(count, n);
  // One collective: returns attnInProgress (or attnSuccess) and completes.
  TypedBuf in(attnFloat32, 4099), out(attnFloat32, 4099);
  for (size_t i = 0; i < 4099; ++i) in.Set(i, RedInput(attnSum, attnFloat32, rank, n, i));
  attnResult_t r = attnAllReduce(in.data(), out.data(), 4099, attnFloat32, attnSum, comm, nullptr);
  EXPECT_TRUE(r == attnInProgress || r == attnSuccess) << ResultName(r) << ": " << attnGetLastError(comm);
  ASSERT_EQ(PollUntilDone(comm), attnSuccess) << attnGetLastError(comm);
  EXPECT_TRUE(BufEquals(out, 0, 4099, [&](size_t i) { return RedExpected(attnSum, attnFloat32, n, i); }));
  // Several queued back to back, then one poll.
  TypedBuf g(attnInt32, 7 * n), gs(attnInt32, 7), b(attnUint8, 300);
  for (size_t i = 0; i < 7; ++i) gs.Set(i, Pattern(attnInt32, rank, i));
  if (rank == 0)
    for (size_t i = 0; i < 300; ++i) b.Set(i, Pattern(attnUint8, 9, i));
  r = attnAllGather(gs.data(), g.data(), 7, attnInt32, comm, nullptr);
  EXPECT_TRUE(r == attnInProgress || r == attnSuccess) << ResultName(r);
  r = attnBroadcast(b.data(), b.data(), 300, attnUint8, 0, comm, nullptr);
  EXPECT_TRUE(r == attnInProgress || r == attnSuccess) << ResultName(r);
  r = attnBarrier(comm, nullptr);
  EXPECT_TRUE(r == attnInProgress || r == attnSuccess) << ResultName(r);
  ASSERT_EQ(PollUntilDone(comm), attnSuccess) << attnGetLastError(comm);
  EXPECT_TRUE(BufEquals(g, 0, 7 * n, [&](size_t j) { return Pattern(attnInt32, int64_t(j / 7), j % 7); }));
  EXPECT_TRUE(BufEquals(b, 0, 300, [&](size_t i) { return Pattern(attnUint8, 9, i); }));
  // Point-to-point in a group.
  TypedBuf s(attnFloat64, 1000), rv(attnFloat64, 1000);
  for (size_t i = 0; i < 1000; ++i) s.Set(i, Pattern(attnFloat64, rank, i));
  ATTN_ASSERT_OK(comm, attnGroupStart());
  ATTN_ASSERT_OK(comm, attnSend(s.data(), 1000, attnFloat64, (rank + 1) % n, comm, nullptr));
  ATTN_ASSERT_OK(comm, attnRecv(rv.data(), 1000, attnFloat64, (rank + n - 1) % n, comm, nullptr));
  r = attnGroupEnd();
  EXPECT_TRUE(r == attnInProgress || r == attnSuccess) << ResultName(r);
  ASSERT_EQ(PollUntilDone(comm), attnSuccess) << attnGetLastError(comm);
  EXPECT_TRUE(BufEquals(rv, 0, 1000, [&](size_t i) { return Pattern(attnFloat64, (rank + n - 1) % n, i); }));
}

TEST(NonBlocking, InitPollAndCollectivesThreads) {
  attnUniqueId id;
  ASSERT_EQ(attnGetUniqueId(&id), attnSuccess);
  const int n = 3;
  RunThreadsRaw(n, [&](int rank) {
    attnConfig_t cfg = ATTN_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.timeout_ms = 20000;
    attnComm_t comm = nullptr;
    const attnResult_t r = attnCommInitRankConfig(&comm, n, id, rank, &cfg);
    ASSERT_TRUE(r == attnSuccess || r == attnInProgress) << ResultName(r) << ": " << attnGetLastError(nullptr);
    ASSERT_NE(comm, nullptr) << "the handle must be valid at once";
    ASSERT_EQ(PollUntilDone(comm), attnSuccess) << attnGetLastError(comm);
    NonBlockingBody(rank, n, comm);
    EXPECT_EQ(attnCommDestroy(comm), attnSuccess);
  }, 60000);
}

TEST(NonBlocking, InitPollAndCollectivesProcesses) {
  RunOptions opts;
  opts.deadline_ms = 60000;
  auto results = ForkRanks(2, [&](int rank, const attnUniqueId& id) {
    attnConfig_t cfg = ATTN_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.timeout_ms = 20000;
    attnComm_t comm = nullptr;
    const attnResult_t r = attnCommInitRankConfig(&comm, 2, id, rank, &cfg);
    ASSERT_TRUE(r == attnSuccess || r == attnInProgress) << ResultName(r);
    ASSERT_NE(comm, nullptr);
    ASSERT_EQ(PollUntilDone(comm), attnSuccess) << attnGetLastError(comm);
    NonBlockingBody(rank, 2, comm);
    EXPECT_EQ(attnCommDestroy(comm), attnSuccess);
  }, opts);
  ExpectAllPassed(results);
}

// attnCommDestroy waits for outstanding operations: destroy right after
// queueing a collective on a non-blocking communicator, then check the data.
TEST(NonBlocking, DestroyWaitsForQueuedOperations) {
  attnUniqueId id;
  ASSERT_EQ(attnGetUniqueId(&id), attnSuccess);
  const int n = 3;
  RunThreadsRaw(n, [&](int rank) {
    attnComm_t comm = nullptr;
    InitNonBlocking(n, id, rank, &comm);
    if (::testing::Test::HasFatalFailure()) return;
    TypedBuf in(attnInt64, 100003), out(attnInt64, 100003);
    for (size_t i = 0; i < 100003; ++i) in.Set(i, RedInput(attnProd, attnInt64, rank, n, i));
    const attnResult_t a = attnAllReduce(in.data(), out.data(), 100003, attnInt64, attnProd, comm, nullptr);
    EXPECT_TRUE(a == attnInProgress || a == attnSuccess) << ResultName(a);
    EXPECT_EQ(attnCommDestroy(comm), attnSuccess);
    EXPECT_TRUE(BufEquals(out, 0, 100003, [&](size_t i) { return RedExpected(attnProd, attnInt64, n, i); }))
        << "rank " << rank << ": attnCommDestroy returned before the queued all-reduce finished";
  }, 60000);
}

// Collectives that run on the calling thread (split, KV pool create) go
// after the operations queued before them: here each rank queues a large
// all-reduce (many messages on every link) and splits at once. Were the
// split's messages to interleave with the all-reduce's on a peer's queue,
// one of them would fail or take the other's bytes.
TEST(NonBlocking, SplitAndKvPoolCreateWaitForQueuedOperations) {
  attnUniqueId id;
  ASSERT_EQ(attnGetUniqueId(&id), attnSuccess);
  const int n = 3;
  const size_t count = 1 << 20;
  RunThreadsRaw(n, [&](int rank) {
    attnComm_t comm = nullptr;
    InitNonBlocking(n, id, rank, &comm);
    if (::testing::Test::HasFatalFailure()) return;
    for (int round = 0; round < 3; ++round) {
      TypedBuf in(attnInt64, count), out(attnInt64, count);
      for (size_t i = 0; i < count; ++i) in.Set(i, RedInput(attnSum, attnInt64, rank, n, i));
      attnResult_t a = attnAllReduce(in.data(), out.data(), count, attnInt64, attnSum, comm, nullptr);
      ASSERT_TRUE(a == attnInProgress || a == attnSuccess) << ResultName(a);
      attnComm_t sub = nullptr;
      const attnResult_t sr = attnCommSplit(comm, rank % 2, rank, &sub, nullptr);
      ASSERT_TRUE(sr == attnInProgress || sr == attnSuccess) << ResultName(sr) << ": " << attnGetLastError(comm);
      ASSERT_NE(sub, nullptr);
      ASSERT_EQ(PollUntilDone(sub), attnSuccess) << attnGetLastError(sub);
      int sn = 0;
      ATTN_EXPECT_OK(sub, attnCommCount(sub, &sn));
      EXPECT_EQ(sn, rank % 2 == 0 ? (n + 1) / 2 : n / 2);
      EXPECT_EQ(attnCommDestroy(sub), attnSuccess);
      ASSERT_EQ(PollUntilDone(comm), attnSuccess) << attnGetLastError(comm);
      EXPECT_TRUE(BufEquals(out, 0, count, [&](size_t i) { return RedExpected(attnSum, attnInt64, n, i); }))
          << "rank " << rank << ", round " << round;

      a = attnAllReduce(in.data(), out.data(), count, attnInt64, attnSum, comm, nullptr);
      ASSERT_TRUE(a == attnInProgress || a == attnSuccess) << ResultName(a);
      const attnKvPoolConfig_t pc{16, 2, 64, attnFloat32, 64};
      attnKvPool_t pool = nullptr;
      ATTN_ASSERT_OK(comm, attnKvPoolCreate(comm, &pc, &pool));
      EXPECT_EQ(attnKvPoolDestroy(pool), attnSuccess);
      ASSERT_EQ(PollUntilDone(comm), attnSuccess) << attnGetLastError(comm);
      EXPECT_TRUE(BufEquals(out, 0, count, [&](size_t i) { return RedExpected(attnSum, attnInt64, n, i); }))
          << "rank " << rank << ", round " << round;
    }
    EXPECT_EQ(attnCommDestroy(comm), attnSuccess);
  }, 120000);
}

// A devlist naming only host ranks is the same as NULL.
TEST(Init, InitAllWithHostDevlist) {
  const int n = 3;
  std::vector<attnComm_t> comms(n);
  const int devs[3] = {ATTN_DEVICE_HOST, ATTN_DEVICE_HOST, ATTN_DEVICE_HOST};
  ATTN_ASSERT_OK(nullptr, attnCommInitAll(comms.data(), n, devs));
  RunThreadsRaw(n, [&](int rank) {
    CheckAllGather(comms[rank], rank, n, attnFloat64, 11, true);
    EXPECT_EQ(attnCommDestroy(comms[rank]), attnSuccess);
  });
}

// ---------------------------------------------------------------------------
// attnCommInitFromEnv

const char* const kLaunchVars[] = {"ATTN_RANK", "ATTN_NRANKS", "ATTN_ROOT", "ATTN_SECRET",
                                   "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                   "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                   "TORCHELASTIC_RUN_ID", "OMPI_MCA_orte_ess_jobid",
                                   "PMIX_NAMESPACE", "SLURM_JOB_ID"};

void ClearLaunchEnv() {
  for (const char* v : kLaunchVars) unsetenv(v);
}

// Children set their launcher variables in `setup`, then init from env and
// prove the communicator with collectives.
void FromEnvRun(int n, const std::function<void(int rank)>& setup) {
  RunOptions opts;
  opts.deadline_ms = 60000;
  opts.env = {{"ATTN_TIMEOUT_MS", "20000"}};
  opts.child_setup = [&](int rank) {
    ClearLaunchEnv();
    setup(rank);
  };
  auto results = ForkRanks(n, [&](int rank, const attnUniqueId&) {
    attnComm_t comm = nullptr;
    const attnResult_t r = attnCommInitFromEnv(&comm, nullptr);
    ASSERT_EQ(r, attnSuccess) << ResultName(r) << ": " << attnGetLastError(nullptr);
    int c = 0, me = -1;
    ATTN_EXPECT_OK(comm, attnCommCount(comm, &c));
    ATTN_EXPECT_OK(comm, attnCommUserRank(comm, &me));
    EXPECT_EQ(c, n);
    EXPECT_EQ(me, rank);
    CheckAllReduce(comm, me, c, attnFloat32, attnSum, 1023, false);
    CheckAllGather(comm, me, c, attnInt8, 5, false);
    EXPECT_EQ(attnCommDestroy(comm), attnSuccess);
  }, opts);
  ExpectAllPassed(results);
}

TEST(InitFromEnv, AttnVariables) {
  const int port = FindFreePort();
  ASSERT_GT(port, 0);
  FromEnvRun(3, [&](int rank) {
    setenv("ATTN_RANK", std::to_string(rank).c_str(), 1);
    setenv("ATTN_NRANKS", "3", 1);
    setenv("ATTN_ROOT", ("127.0.0.1:" + std::to_string(port)).c_str(), 1);
    setenv("ATTN_SECRET", "00112233445566778899aabbccddeeff", 1);
  });
}

TEST(InitFromEnv, TorchrunVariables) {
  const int port = FindFreePort();  // attncomm meets at MASTER_PORT + 1
  ASSERT_GT(port, 1);
  FromEnvRun(2, [&](int rank) {
    setenv("RANK", std::to_string(rank).c_str(), 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", std::to_string(port - 1).c_str(), 1);
  });
}

TEST(InitFromEnv, OpenMpiVariables) {
  const int port = FindFreePort();
  ASSERT_GT(port, 0);
  FromEnvRun(3, [&](int rank) {
    setenv("OMPI_COMM_WORLD_RANK", std::to_string(rank).c_str(), 1);
    setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
    setenv("ATTN_ROOT", ("127.0.0.1:" + std::to_string(port)).c_str(), 1);
    setenv("ATTN_SECRET", "ffeeddccbbaa99887766554433221100", 1);
  });
}

// ATTN_* wins over torchrun's variables when both are set.
TEST(InitFromEnv, AttnVariablesTakePrecedence) {
  const int port = FindFreePort();
  ASSERT_GT(port, 0);
  FromEnvRun(2, [&](int rank) {
    setenv("ATTN_RANK", std::to_string(rank).c_str(), 1);
    setenv("ATTN_NRANKS", "2", 1);
    setenv("ATTN_ROOT", ("127.0.0.1:" + std::to_string(port)).c_str(), 1);
    setenv("RANK", std::to_string(1 - rank).c_str(), 1);
    setenv("WORLD_SIZE", "9", 1);
  });
}

TEST(InitFromEnv, MissingOrBadVariablesFailWithMessage) {
  RunOptions opts;
  opts.deadline_ms = 30000;
  auto results = ForkRanks(1, [&](int, const attnUniqueId&) {
    ClearLaunchEnv();
    attnComm_t comm = reinterpret_cast<attnComm_t>(0x1);
    EXPECT_EQ(attnCommInitFromEnv(&comm, nullptr), attnInvalidArgument);
    EXPECT_EQ(comm, nullptr);
    EXPECT_STRNE(attnGetLastError(nullptr), "");
    EXPECT_EQ(attnCommInitFromEnv(nullptr, nullptr), attnInvalidArgument);
    // Rank without a root.
    setenv("ATTN_RANK", "0", 1);
    setenv("ATTN_NRANKS", "2", 1);
    EXPECT_EQ(attnCommInitFromEnv(&comm, nullptr), attnInvalidArgument);
    EXPECT_STRNE(attnGetLastError(nullptr), "");
    // Rank out of range.
    setenv("ATTN_ROOT", "127.0.0.1:1", 1);
    setenv("ATTN_RANK", "2", 1);
    EXPECT_EQ(attnCommInitFromEnv(&comm, nullptr), attnInvalidArgument);
    // Bad secret.
    setenv("ATTN_RANK", "1", 1);
    setenv("ATTN_SECRET", "abc", 1);
    EXPECT_EQ(attnCommInitFromEnv(&comm, nullptr), attnInvalidArgument);
    EXPECT_STRNE(attnGetLastError(nullptr), "");
    setenv("ATTN_SECRET", "zz112233445566778899aabbccddeeff", 1);
    EXPECT_EQ(attnCommInitFromEnv(&comm, nullptr), attnInvalidArgument);
    // torchrun with a bad port.
    ClearLaunchEnv();
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "notaport", 1);
    EXPECT_EQ(attnCommInitFromEnv(&comm, nullptr), attnInvalidArgument);
  }, opts);
  ExpectAllPassed(results);
}

// ---------------------------------------------------------------------------
// Argument validation: a clear code, and a last-error text naming the rank.

// Puts a known marker message on comm (an invalid op), so that the next
// check proves the case under test recorded its own message.
void Mark(attnComm_t comm, int k) {
  int x = 0;
  attnAllReduce(&x, &x, 1, attnInt32, static_cast<attnRedOp_t>(1000 + k), comm, nullptr);
}

struct BadCall {
  const char* what;
  attnResult_t expect;
  std::function<attnResult_t(attnComm_t comm)> call;
};

std::vector<BadCall> BadCalls(int n) {
  static float buf[64];
  static size_t counts[8] = {1, 1, 1, 1, 1, 1, 1, 1}, displs[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  const auto bt = static_cast<attnDataType_t>(99);
  const auto bo = static_cast<attnRedOp_t>(42);
  const auto st = reinterpret_cast<attnStream_t>(0x10);
  return {
      {"AllReduce NULL sendbuff", attnInvalidArgument, [](attnComm_t c) { return attnAllReduce(nullptr, buf, 4, attnFloat32, attnSum, c, nullptr); }},
      {"AllReduce NULL recvbuff", attnInvalidArgument, [](attnComm_t c) { return attnAllReduce(buf, nullptr, 5, attnFloat32, attnSum, c, nullptr); }},
      {"AllReduce bad type", attnInvalidArgument, [bt](attnComm_t c) { return attnAllReduce(buf, buf, 4, bt, attnSum, c, nullptr); }},
      {"AllReduce bad op", attnInvalidArgument, [bo](attnComm_t c) { return attnAllReduce(buf, buf, 4, attnFloat32, bo, c, nullptr); }},
      {"AllReduce stream", attnInvalidArgument, [st](attnComm_t c) { return attnAllReduce(buf, buf, 4, attnFloat32, attnSum, c, st); }},
      {"AllReduce partial overlap", attnInvalidArgument, [](attnComm_t c) { return attnAllReduce(buf, buf + 1, 8, attnFloat32, attnSum, c, nullptr); }},
      {"ReduceScatter NULL recvbuff", attnInvalidArgument, [](attnComm_t c) { return attnReduceScatter(buf, nullptr, 2, attnFloat32, attnSum, c, nullptr); }},
      {"ReduceScatter bad op", attnInvalidArgument, [bo](attnComm_t c) { return attnReduceScatter(buf, buf + 32, 2, attnFloat32, static_cast<attnRedOp_t>(-1), c, nullptr); }},
      {"ReduceScatter bad type", attnInvalidArgument, [bt](attnComm_t c) { return attnReduceScatter(buf, buf + 32, 2, bt, attnSum, c, nullptr); }},
      {"AllGather NULL sendbuff", attnInvalidArgument, [](attnComm_t c) { return attnAllGather(nullptr, buf, 3, attnFloat32, c, nullptr); }},
      {"AllGather NULL recvbuff", attnInvalidArgument, [](attnComm_t c) { return attnAllGather(buf, nullptr, 6, attnFloat32, c, nullptr); }},
      {"AllGather stream", attnInvalidArgument, [st](attnComm_t c) { return attnAllGather(buf, buf + 32, 1, attnFloat32, c, st); }},
      {"Broadcast root -1", attnInvalidArgument, [](attnComm_t c) { return attnBroadcast(buf, buf, 4, attnFloat32, -1, c, nullptr); }},
      {"Broadcast root n", attnInvalidArgument, [n](attnComm_t c) { return attnBroadcast(buf, buf, 4, attnFloat32, n, c, nullptr); }},
      {"Broadcast NULL recvbuff", attnInvalidArgument, [](attnComm_t c) { return attnBroadcast(buf, nullptr, 9, attnFloat32, 0, c, nullptr); }},
      {"Broadcast bad type", attnInvalidArgument, [bt](attnComm_t c) { return attnBroadcast(buf, buf, 4, bt, 0, c, nullptr); }},
      {"Broadcast stream", attnInvalidArgument, [st](attnComm_t c) { return attnBroadcast(buf, buf, 4, attnFloat32, 0, c, st); }},
      // These run on rank 1: root 1 is the calling rank.
      {"Reduce root -1", attnInvalidArgument, [](attnComm_t c) { return attnReduce(buf, buf, 4, attnFloat32, attnSum, -1, c, nullptr); }},
      {"Reduce root n", attnInvalidArgument, [n](attnComm_t c) { return attnReduce(buf, buf, 4, attnFloat32, attnSum, n, c, nullptr); }},
      {"Reduce NULL sendbuff", attnInvalidArgument, [](attnComm_t c) { return attnReduce(nullptr, buf, 4, attnFloat32, attnSum, 0, c, nullptr); }},
      {"Reduce NULL recvbuff on the root", attnInvalidArgument, [](attnComm_t c) { return attnReduce(buf, nullptr, 4, attnFloat32, attnSum, 1, c, nullptr); }},
      {"Reduce bad op", attnInvalidArgument, [bo](attnComm_t c) { return attnReduce(buf, buf, 4, attnFloat32, bo, 0, c, nullptr); }},
      {"Reduce bad type", attnInvalidArgument, [bt](attnComm_t c) { return attnReduce(buf, buf, 4, bt, attnSum, 0, c, nullptr); }},
      {"Reduce stream", attnInvalidArgument, [st](attnComm_t c) { return attnReduce(buf, buf, 4, attnFloat32, attnSum, 0, c, st); }},
      {"Reduce partial overlap on the root", attnInvalidArgument, [](attnComm_t c) { return attnReduce(buf, buf + 2, 8, attnFloat32, attnSum, 1, c, nullptr); }},
      {"AllToAll NULL sendbuff", attnInvalidArgument, [](attnComm_t c) { return attnAllToAll(nullptr, buf, 2, attnFloat32, c, nullptr); }},
      {"AllToAll in place", attnInvalidArgument, [](attnComm_t c) { return attnAllToAll(buf, buf, 2, attnFloat32, c, nullptr); }},
      {"AllToAllv NULL counts", attnInvalidArgument, [](attnComm_t c) { return attnAllToAllv(buf, nullptr, displs, buf + 32, counts, displs, attnFloat32, c, nullptr); }},
      {"AllToAllv NULL sendbuff", attnInvalidArgument, [](attnComm_t c) { return attnAllToAllv(nullptr, counts, displs, buf + 32, counts, displs, attnFloat32, c, nullptr); }},
      {"AllToAllv bad type", attnInvalidArgument, [bt](attnComm_t c) { return attnAllToAllv(buf, counts, displs, buf + 32, counts, displs, bt, c, nullptr); }},
      {"Barrier stream", attnInvalidArgument, [st](attnComm_t c) { return attnBarrier(c, st); }},
      {"Send peer -1", attnInvalidArgument, [](attnComm_t c) { return attnSend(buf, 1, attnFloat32, -1, c, nullptr); }},
      {"Send peer n", attnInvalidArgument, [n](attnComm_t c) { return attnSend(buf, 1, attnFloat32, n, c, nullptr); }},
      {"Send NULL buffer", attnInvalidArgument, [](attnComm_t c) { return attnSend(nullptr, 3, attnFloat32, 0, c, nullptr); }},
      {"Send bad type", attnInvalidArgument, [bt](attnComm_t c) { return attnSend(buf, 1, bt, 0, c, nullptr); }},
      {"Recv peer n+5", attnInvalidArgument, [n](attnComm_t c) { return attnRecv(buf, 1, attnFloat32, n + 5, c, nullptr); }},
      {"Recv NULL buffer", attnInvalidArgument, [](attnComm_t c) { return attnRecv(nullptr, 2, attnFloat32, 0, c, nullptr); }},
      {"Recv stream", attnInvalidArgument, [st](attnComm_t c) { return attnRecv(buf, 1, attnFloat32, 0, c, st); }},
      {"Split bad color", attnInvalidArgument, [](attnComm_t c) { attnComm_t s; return attnCommSplit(c, -9, 0, &s, nullptr); }},
      {"Split NULL newcomm", attnInvalidArgument, [](attnComm_t c) { return attnCommSplit(c, 0, 0, nullptr, nullptr); }},
  };
}

TEST(ArgumentValidation, ClearCodesAndMessagesNamingTheRank) {
  const int n = 2;
  RunThreads(n, [&](int rank, int nr, attnComm_t& comm) {
    if (rank == 1) {
      int k = 0;
      for (const auto& c : BadCalls(nr)) {
        Mark(comm, k);
        const std::string marker = attnGetLastError(comm);
        const attnResult_t r = c.call(comm);
        EXPECT_EQ(r, c.expect) << c.what << ": got " << ResultName(r);
        const std::string text = attnGetLastError(comm);
        EXPECT_FALSE(text.empty()) << c.what << ": attnGetLastError(comm) is empty";
        EXPECT_NE(text, marker) << c.what << ": the failure was not recorded on the communicator "
                                << "(attnGetLastError(comm) still shows the previous error)";
        EXPECT_TRUE(Contains(text, "rank 1")) << c.what << ": message does not name the rank: " << text;
        const std::string mine = attnGetLastError(nullptr);
        EXPECT_TRUE(Contains(mine, "rank 1")) << c.what << ": thread's last error: " << mine;
        ++k;
      }
    }
    // The communicator still works for everyone afterwards.
    CheckAllReduce(comm, rank, nr, attnFloat32, attnSum, 257, false);
    CheckBroadcast(comm, rank, nr, attnInt32, 9, 1, false);
  });
}

TEST(ArgumentValidation, NullCommunicator) {
  float b[4] = {};
  EXPECT_EQ(attnAllReduce(b, b, 4, attnFloat32, attnSum, nullptr, nullptr), attnInvalidArgument);
  EXPECT_STRNE(attnGetLastError(nullptr), "");
  EXPECT_EQ(attnAllGather(b, b, 1, attnFloat32, nullptr, nullptr), attnInvalidArgument);
  EXPECT_EQ(attnBarrier(nullptr, nullptr), attnInvalidArgument);
  EXPECT_EQ(attnSend(b, 1, attnFloat32, 0, nullptr, nullptr), attnInvalidArgument);
  EXPECT_EQ(attnCommGetAsyncError(nullptr, nullptr), attnInvalidArgument);
  attnComm_t s;
  EXPECT_EQ(attnCommSplit(nullptr, 0, 0, &s, nullptr), attnInvalidArgument);
}

// A count whose size in bytes overflows size_t cannot describe a buffer: it
// must be refused with attnInvalidArgument (not wrap to a small size, crash,
// throw through the C API, or hang). Each call runs in its own child process
// so that a crash or hang is contained and reported.
TEST(ArgumentValidation, CountsOverflowingSizeAreRejected) {
  const size_t counts[] = {SIZE_MAX / 2, (SIZE_MAX / 4) + 1};  // x4 bytes: wraps / wraps to 0
  const char* const names[] = {"AllReduce", "AllGather", "ReduceScatter", "Broadcast",
                               "AllToAll", "Send", "Recv", "Reduce"};
  for (size_t count : counts)
    for (int which = 0; which < 8; ++which) {
      SCOPED_TRACE(std::string(names[which]) + " count=" + std::to_string(count));
      RunOptions opts;
      opts.deadline_ms = 20000;
      auto results = ForkRanks(1, [&](int, const attnUniqueId&) {
        attnComm_t c[2];
        ATTN_ASSERT_OK(nullptr, attnCommInitAll(c, 2, nullptr));
        RunThreadsRaw(2, [&](int r) {
          static float b[2][64];
          float* buf = b[r];
          attnResult_t x = attnSuccess;
          switch (which) {
            case 0: x = attnAllReduce(buf, buf, count, attnFloat32, attnSum, c[r], nullptr); break;
            case 1: x = attnAllGather(buf, buf + 32, count, attnFloat32, c[r], nullptr); break;
            case 2: x = attnReduceScatter(buf, buf + 32, count, attnFloat32, attnSum, c[r], nullptr); break;
            case 3: x = attnBroadcast(buf, buf, count, attnFloat32, 0, c[r], nullptr); break;
            case 4: x = attnAllToAll(buf, buf + 32, count, attnFloat32, c[r], nullptr); break;
            case 5: x = attnSend(buf, count, attnFloat32, 1 - r, c[r], nullptr); break;
            case 6: x = attnRecv(buf, count, attnFloat32, 1 - r, c[r], nullptr); break;
            case 7: x = attnReduce(buf, buf + 32, count, attnFloat32, attnSum, 0, c[r], nullptr); break;
          }
          EXPECT_EQ(x, attnInvalidArgument) << "rank " << r << ": " << ResultName(x) << ": "
                                            << attnGetLastError(c[r]);
          attnCommAbort(c[r]);
        }, 8000);
      }, opts);
      ExpectAllPassed(results);
    }
}

// Zero counts with NULL buffers are legal no-ops.
TEST(ArgumentValidation, ZeroCountWithNullBuffersIsFine) {
  RunThreads(3, [&](int rank, int n, attnComm_t& comm) {
    ATTN_EXPECT_OK(comm, attnAllReduce(nullptr, nullptr, 0, attnFloat32, attnSum, comm, nullptr));
    ATTN_EXPECT_OK(comm, attnAllGather(nullptr, nullptr, 0, attnInt8, comm, nullptr));
    ATTN_EXPECT_OK(comm, attnReduceScatter(nullptr, nullptr, 0, attnInt64, attnMax, comm, nullptr));
    ATTN_EXPECT_OK(comm, attnBroadcast(nullptr, nullptr, 0, attnFloat16, 2, comm, nullptr));
    ATTN_EXPECT_OK(comm, attnReduce(nullptr, nullptr, 0, attnInt32, attnProd, 1, comm, nullptr));
    ATTN_EXPECT_OK(comm, attnAllToAll(nullptr, nullptr, 0, attnBfloat16, comm, nullptr));
    CheckAllReduce(comm, rank, n, attnInt8, attnSum, 3, false);
  });
}

}  // namespace
