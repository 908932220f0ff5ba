// Handles at the C API: a destroyed, never-created (garbage pointer, NULL)
// or wrong-type attnComm_t / attnKvPool_t / attnPlan_t gets
// attnInvalidArgument with a message saying so, never a read of freed
// memory, a double free or a crash; destroying twice is refused; huge
// communicator sizes are refused before anything is sized by them. Each case
// runs in a child process, so a regression that crashes is reported as a
// failure of that case, not of the whole binary.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "attncomm.h"
#include "tests/support/kv_fixtures.h"
#include "tests/support/multirank.h"

namespace attn_test {
namespace {

// Runs `fn` in a forked child under a deadline; its gtest failures (and a
// crash or a hang) fail the calling test.
void InChildProcess(const std::function<void()>& fn, int deadline_ms = 60000) {
  RunOptions opts;
  opts.deadline_ms = deadline_ms;
  opts.env = {{"ATTN_BOOTSTRAP_TIMEOUT_MS", "10000"}};
  ExpectAllPassed(ForkRanks(1, [&](int, const attnUniqueId&) { fn(); }, opts));
}

// The call was refused as a bad handle, with a message.
#define EXPECT_BAD_HANDLE(call)                                                          \
  do {                                                                                   \
    const attnResult_t r_ = (call);                                                      \
    EXPECT_EQ(r_, attnInvalidArgument) << #call << " -> " << ResultName(r_);            \
    EXPECT_STRNE(attnGetLastError(nullptr), "") << #call;                                \
  } while (0)

// Every kind of call on a communicator handle that is not a live one.
void ExpectEveryCommCallRefuses(attnComm_t bad) {
  int i = 0;
  float b[4] = {};
  attnResult_t async = attnSuccess;
  attnComm_t child = nullptr;
  EXPECT_BAD_HANDLE(attnCommCount(bad, &i));
  EXPECT_BAD_HANDLE(attnCommUserRank(bad, &i));
  EXPECT_BAD_HANDLE(attnCommDevice(bad, &i));
  EXPECT_BAD_HANDLE(attnCommGetAsyncError(bad, &async));
  EXPECT_BAD_HANDLE(attnAllReduce(b, b, 4, attnFloat32, attnSum, bad, nullptr));
  EXPECT_BAD_HANDLE(attnAllGather(b, b, 1, attnFloat32, bad, nullptr));
  EXPECT_BAD_HANDLE(attnBroadcast(b, b, 4, attnFloat32, 0, bad, nullptr));
  EXPECT_BAD_HANDLE(attnBarrier(bad, nullptr));
  EXPECT_BAD_HANDLE(attnSend(b, 1, attnFloat32, 0, bad, nullptr));
  EXPECT_BAD_HANDLE(attnRecv(b, 1, attnFloat32, 0, bad, nullptr));
  EXPECT_BAD_HANDLE(attnCommSplit(bad, 0, 0, &child, nullptr));
  EXPECT_EQ(child, nullptr);
  EXPECT_BAD_HANDLE(attnCommTopoRank(bad, &i));
  size_t size = 0;
  EXPECT_BAD_HANDLE(attnCommTopoDump(bad, attnTopoFormatText, nullptr, &size));
  attnCostModel_t model{};
  EXPECT_BAD_HANDLE(attnCommGetCostModel(bad, &model));
  const attnAttnKernel_t kernel = ATTN_ATTN_KERNEL_INITIALIZER;
  EXPECT_BAD_HANDLE(attnCommSetAttnKernelEx(bad, &kernel));
  EXPECT_BAD_HANDLE(attnCommSetAttnKernel(bad, nullptr, nullptr));
  attnKvPool_t pool = nullptr;
  const attnKvPoolConfig_t cfg = PoolCfg(4, 8);
  EXPECT_BAD_HANDLE(attnKvPoolCreate(bad, &cfg, &pool));
  EXPECT_EQ(pool, nullptr);
  // attnGetLastError answers with text, whatever the handle.
  EXPECT_NE(attnGetLastError(bad), nullptr);
  EXPECT_BAD_HANDLE(attnCommDestroy(bad));
  EXPECT_BAD_HANDLE(attnCommAbort(bad));
}

TEST(Handles, CommunicatorUseAfterDestroyIsRefused) {
  InChildProcess([] {
    attnComm_t c[2];
    ATTN_ASSERT_OK(nullptr, attnCommInitAll(c, 2, nullptr));
    EXPECT_EQ(attnCommDestroy(c[0]), attnSuccess);
    EXPECT_EQ(attnCommAbort(c[1]), attnSuccess);
    ExpectEveryCommCallRefuses(c[0]);
    ExpectEveryCommCallRefuses(c[1]);
    EXPECT_NE(std::string(attnGetLastError(nullptr)).find("destroyed"), std::string::npos)
        << attnGetLastError(nullptr);
  });
}

TEST(Handles, CommunicatorDestroyedTwiceIsRefused) {
  InChildProcess([] {
    attnComm_t c[2];
    ATTN_ASSERT_OK(nullptr, attnCommInitAll(c, 2, nullptr));
    for (attnComm_t x : c) EXPECT_EQ(attnCommDestroy(x), attnSuccess);
    for (attnComm_t x : c) EXPECT_BAD_HANDLE(attnCommDestroy(x));
    for (attnComm_t x : c) EXPECT_BAD_HANDLE(attnCommAbort(x));
  });
}

TEST(Handles, GarbageCommunicatorHandlesAreRefused) {
  InChildProcess([] {
    // Readable memory that looks like anything; an unmapped address; a
    // misaligned one.
    std::vector<uint64_t> junk(512, 0x0101010101010101ull);
    ExpectEveryCommCallRefuses(reinterpret_cast<attnComm_t>(junk.data()));
    ExpectEveryCommCallRefuses(reinterpret_cast<attnComm_t>(uintptr_t(0x10)));
    ExpectEveryCommCallRefuses(reinterpret_cast<attnComm_t>(reinterpret_cast<char*>(junk.data()) + 3));
  });
}

TEST(Handles, WrongTypeHandlesAreRefused) {
  InChildProcess([] {
    attnComm_t c[1];
    ATTN_ASSERT_OK(nullptr, attnCommInitAll(c, 1, nullptr));
    const attnKvPoolConfig_t cfg = PoolCfg(4, 8);
    attnKvPool_t pool = nullptr;
    ATTN_ASSERT_OK(c[0], attnKvPoolCreate(c[0], &cfg, &pool));
    const int32_t lens[] = {8};
    const attnBatchSpec_t spec{1, lens, nullptr};
    attnPlan_t plan = nullptr;
    ATTN_ASSERT_OK(nullptr, attnPlanPrefill(&spec, 2, &plan));

    // A pool or a plan where a communicator belongs.
    ExpectEveryCommCallRefuses(reinterpret_cast<attnComm_t>(pool));
    ExpectEveryCommCallRefuses(reinterpret_cast<attnComm_t>(plan));
    EXPECT_NE(std::string(attnGetLastError(nullptr)).find("plan"), std::string::npos) << attnGetLastError(nullptr);
    // A communicator or a plan where a pool belongs.
    attnKvPoolStats_t stats;
    EXPECT_BAD_HANDLE(attnKvPoolGetStats(reinterpret_cast<attnKvPool_t>(c[0]), &stats));
    EXPECT_NE(std::string(attnGetLastError(nullptr)).find("communicator"), std::string::npos)
        << attnGetLastError(nullptr);
    EXPECT_BAD_HANDLE(attnKvPoolGetStats(reinterpret_cast<attnKvPool_t>(plan), &stats));
    EXPECT_BAD_HANDLE(attnKvPoolDestroy(reinterpret_cast<attnKvPool_t>(c[0])));
    // A communicator or a pool where a plan belongs.
    attnShard_t shard;
    EXPECT_BAD_HANDLE(attnPlanGetShard(reinterpret_cast<attnPlan_t>(c[0]), 0, &shard));
    EXPECT_BAD_HANDLE(attnPlanGetShard(reinterpret_cast<attnPlan_t>(pool), 0, &shard));
    EXPECT_BAD_HANDLE(attnPlanDestroy(reinterpret_cast<attnPlan_t>(pool)));

    // All three still work.
    ATTN_EXPECT_OK(c[0], attnKvPoolGetStats(pool, &stats));
    ATTN_EXPECT_OK(nullptr, attnPlanGetShard(plan, 1, &shard));
    ATTN_EXPECT_OK(nullptr, attnPlanDestroy(plan));
    ATTN_EXPECT_OK(c[0], attnKvPoolDestroy(pool));
    ATTN_EXPECT_OK(c[0], attnCommDestroy(c[0]));
  });
}

TEST(Handles, KvPoolUseAfterDestroyAndDestroyTwiceAreRefused) {
  InChildProcess([] {
    attnComm_t c[1];
    ATTN_ASSERT_OK(nullptr, attnCommInitAll(c, 1, nullptr));
    const attnKvPoolConfig_t cfg = PoolCfg(4, 8);
    attnKvPool_t pool = nullptr;
    ATTN_ASSERT_OK(c[0], attnKvPoolCreate(c[0], &cfg, &pool));
    ATTN_ASSERT_OK(c[0], attnKvPoolDestroy(pool));
    attnKvPoolStats_t stats;
    EXPECT_BAD_HANDLE(attnKvPoolGetStats(pool, &stats));
    KvTokens t = RequestTokens(attnFloat32, 0, 1, 4);
    EXPECT_BAD_HANDLE(attnKvAppend(pool, 1, t.k.data(), t.v.data(), t.pos.data(), 4, nullptr));
    EXPECT_BAD_HANDLE(attnKvRelease(pool, 1, nullptr));
    EXPECT_BAD_HANDLE(attnKvGetPlacement(pool, 1, nullptr, nullptr));
    EXPECT_BAD_HANDLE(attnKvMigrate(pool, nullptr, 0, nullptr, nullptr));
    EXPECT_BAD_HANDLE(attnKvPoolDestroy(pool));
    // Garbage where a pool belongs.
    std::vector<uint64_t> junk(64, 0x0101010101010101ull);
    EXPECT_BAD_HANDLE(attnKvPoolGetStats(reinterpret_cast<attnKvPool_t>(junk.data()), &stats));
    EXPECT_BAD_HANDLE(attnKvPoolDestroy(reinterpret_cast<attnKvPool_t>(junk.data())));
    // NULL stays a no-op for destroy, an error elsewhere.
    EXPECT_EQ(attnKvPoolDestroy(nullptr), attnSuccess);
    EXPECT_BAD_HANDLE(attnKvPoolGetStats(nullptr, &stats));
    ATTN_EXPECT_OK(c[0], attnCommDestroy(c[0]));
  });
}

TEST(Handles, PlanUseAfterDestroyAndDestroyTwiceAreRefused) {
  InChildProcess([] {
    const int32_t lens[] = {8, 3};
    const attnBatchSpec_t spec{2, lens, nullptr};
    attnPlan_t plan = nullptr;
    ATTN_ASSERT_OK(nullptr, attnPlanPrefill(&spec, 2, &plan));
    ATTN_ASSERT_OK(nullptr, attnPlanDestroy(plan));
    attnShard_t shard;
    EXPECT_BAD_HANDLE(attnPlanGetShard(plan, 0, &shard));
    EXPECT_BAD_HANDLE(attnPlanDestroy(plan));
    std::vector<uint64_t> junk(64, 0x0101010101010101ull);
    EXPECT_BAD_HANDLE(attnPlanGetShard(reinterpret_cast<attnPlan_t>(junk.data()), 0, &shard));
    EXPECT_EQ(attnPlanDestroy(nullptr), attnSuccess);
  });
}

// A pool whose communicator was destroyed first: its calls are refused
// (the communicator handle is dead), not run on freed memory.
TEST(Handles, PoolCallsAfterItsCommunicatorWasDestroyedAreRefused) {
  InChildProcess([] {
    attnComm_t c[1];
    ATTN_ASSERT_OK(nullptr, attnCommInitAll(c, 1, nullptr));
    const attnKvPoolConfig_t cfg = PoolCfg(4, 8);
    attnKvPool_t pool = nullptr;
    ATTN_ASSERT_OK(c[0], attnKvPoolCreate(c[0], &cfg, &pool));
    ATTN_ASSERT_OK(c[0], attnCommDestroy(c[0]));
    EXPECT_BAD_HANDLE(attnKvMigrate(pool, nullptr, 0, nullptr, nullptr));
    EXPECT_NE(std::string(attnGetLastError(nullptr)).find("communicator"), std::string::npos)
        << attnGetLastError(nullptr);
  });
}

// Communicator sizes past ATTN_MAX_NRANKS are refused at once: nothing is
// sized by them and nothing waits for ranks that cannot exist.
TEST(Handles, HugeCommunicatorSizesAreRefused) {
  InChildProcess([] {
    attnUniqueId id;
    ATTN_ASSERT_OK(nullptr, attnGetUniqueId(&id));
    for (int n : {ATTN_MAX_NRANKS + 1, INT_MAX}) {
      attnComm_t comm = reinterpret_cast<attnComm_t>(0x1);
      EXPECT_BAD_HANDLE(attnCommInitRank(&comm, n, id, 0));
      EXPECT_EQ(comm, nullptr);
      EXPECT_BAD_HANDLE(attnCommInitRank(&comm, n, id, n - 1));
      attnConfig_t cfg = ATTN_CONFIG_INITIALIZER;
      EXPECT_BAD_HANDLE(attnCommInitRankConfig(&comm, n, id, 0, &cfg));
      std::vector<attnComm_t> comms(4);
      EXPECT_BAD_HANDLE(attnCommInitAll(comms.data(), n, nullptr));
      attnPlan_t plan = nullptr;
      const int32_t lens[] = {8};
      const attnBatchSpec_t spec{1, lens, nullptr};
      EXPECT_BAD_HANDLE(attnPlanPrefill(&spec, n, &plan));
      EXPECT_EQ(plan, nullptr);
    }
  }, 30000);
}

// attnCommInitAll when the threads for its ranks cannot all be started:
// an error code, every output NULL, no rank left waiting for the others.
TEST(Handles, InitAllThatCannotStartItsThreadsFailsCleanly) {
  InChildProcess([] {
    // Room for a few 8 MiB thread stacks, not for 64.
    struct rlimit lim;
    ASSERT_EQ(getrlimit(RLIMIT_AS, &lim), 0);
    std::vector<attnComm_t> comms(64, reinterpret_cast<attnComm_t>(0x1));
    FILE* f = std::fopen("/proc/self/statm", "r");
    ASSERT_NE(f, nullptr);
    unsigned long pages = 0;
    ASSERT_EQ(std::fscanf(f, "%lu", &pages), 1);
    std::fclose(f);
    lim.rlim_cur = pages * 4096ul + (96ul << 20);
    ASSERT_EQ(setrlimit(RLIMIT_AS, &lim), 0);
    const attnResult_t r = attnCommInitAll(comms.data(), 64, nullptr);
    EXPECT_NE(r, attnSuccess);
    EXPECT_NE(r, attnInProgress);
    for (attnComm_t c : comms) EXPECT_EQ(c, nullptr);
  }, 60000);
}

// A merge whose rows x heads x head_dim overflows size_t describes no
// buffer: refused, not computed over a wrapped size.
TEST(Handles, MergeWithOverflowingSizesIsRefused) {
  InChildProcess([] {
    float o[16] = {}, l[4] = {};
    const void* outs[] = {o, o};
    const float* lses[] = {l, l};
    EXPECT_BAD_HANDLE(attnMergeAttnStates(2, outs, lses, o, l, int64_t(1) << 62, 1 << 20, 256, attnFloat32, nullptr));
  });
}

}  // namespace
}  // namespace attn_test
