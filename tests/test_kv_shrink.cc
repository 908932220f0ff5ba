// attnKvPoolShrink: a distributed KV cache follows its communicator through
// attnCommShrink. Checked here:
//   - after a rank dies (a thread that aborts, a process killed by
//     SIGKILL), the survivors' requests with a block on it are reported
//     lost, blocks held for it are freed, the rest keeps its placement
//     under the new numbering and attention over it is exact; blocks then
//     move on the new communicator and lost requests can be prefilled again;
//   - a release not yet delivered to a holder is settled by the books'
//     comparison (the holder frees the blocks); a holder that lacks a
//     block its owner claims makes the owner drop the request as lost
//     (books tampered with through the internal pool, as a migration cut
//     between send and booking would leave them);
//   - bad input fails on every rank and leaves the pool where it was.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "attncomm.h"
#include "src/attn/kv_migrate.h"
#include "src/attn/kv_pool.h"
#include "src/attn/kv_shrink.h"
#include "tests/support/attn_fixtures.h"
#include "tests/support/kv_fixtures.h"
#include "tests/support/multirank.h"

namespace attn_test {
namespace {

constexpr int kBt = 4;  // tokens per block
constexpr int kVictim = 2;

void Append(attnKvPool_t pool, attnComm_t comm, int owner, const Req& r) {
  const KvTokens x = RequestTokens(attnFloat32, owner, r.id, r.len);
  ATTN_ASSERT_OK(comm, attnKvAppend(pool, r.id, x.k.data(), x.v.data(), x.pos.data(), r.len, nullptr));
}

// attnKvAttention over `reqs` (tokens and queries made for `owner`, the
// rank in the original communicator) against exact attention.
void ExpectAttentionExact(attnKvPool_t pool, attnComm_t comm, int owner, const std::vector<Req>& reqs,
                          const std::string& what) {
  const KvQueries qs = MakeKvQueries(owner, reqs, attnFloat32, true);
  std::vector<uint8_t> out(qs.q.size());
  std::vector<float> lse(size_t(qs.rows) * size_t(qs.cfg.num_q_heads));
  const attnResult_t rc = attnKvAttention(pool, int(qs.ids.size()), qs.ids.data(), qs.offs.data(), qs.q.data(),
                                          qs.qpos.data(), out.data(), lse.data(), &qs.cfg, nullptr);
  ASSERT_EQ(rc, attnSuccess) << what << ": " << attnGetLastError(comm);
  ExpectExact(CompareKvAttention(qs, owner, reqs, attnFloat32, true, out.data(), lse.data()), attnFloat32, what);
}

attnKvPoolStats_t Stats(attnKvPool_t pool) {
  attnKvPoolStats_t st{};
  EXPECT_EQ(attnKvPoolGetStats(pool, &st), attnSuccess);
  return st;
}

Req Long(int rank) { return {100 + rank, 6 * kBt + 1, 1}; }   // 7 blocks
Req Short(int rank) { return {200 + rank, kBt + 3, 3}; }      // 2 blocks

// Four ranks lend blocks in every direction, rank 2 among them, then rank 2
// dies (`die` ends it). The survivors shrink the communicator and the pool.
void SurviveALostRank(int rank, int n, attnComm_t& comm, void (*die)(attnComm_t&, attnKvPool_t)) {
  const attnKvPoolConfig_t cfg = PoolCfg(kBt, 64);
  attnKvPool_t pool = nullptr;
  ATTN_ASSERT_OK(comm, attnKvPoolCreate(comm, &cfg, &pool));
  Append(pool, comm, rank, Long(rank));
  Append(pool, comm, rank, Short(rank));
  // 0 lends request 100 to 1 and 2; 1 lends 101 to 3; 2 lends 102 to 0;
  // 3 lends 203 (its one movable block) to 2.
  std::vector<attnKvMove_t> moves;
  if (rank == 0) moves = {{0, 1, 0, 100, 2}, {0, 2, 0, 100, 1}};
  if (rank == 1) moves = {{1, 3, 1, 101, 2}};
  if (rank == 2) moves = {{2, 0, 2, 102, 2}};
  if (rank == 3) moves = {{3, 2, 3, 203, 1}};
  std::vector<int64_t> granted(moves.size(), -1);
  ATTN_ASSERT_OK(comm, attnKvMigrate(pool, moves.data(), int(moves.size()), granted.data(), nullptr));
  for (size_t i = 0; i < moves.size(); ++i) ASSERT_EQ(granted[i], moves[i].num_blocks);
  ExpectAttentionExact(pool, comm, rank, {Long(rank), Short(rank)}, "before the failure");

  if (rank == kVictim) {
    die(comm, pool);
    return;
  }
  // The next collective on the pool meets the failure.
  const KvQueries qs = MakeKvQueries(rank, {Long(rank)}, attnFloat32, true);
  std::vector<uint8_t> out(qs.q.size());
  const attnResult_t failed = attnKvAttention(pool, 1, qs.ids.data(), qs.offs.data(), qs.q.data(), qs.qpos.data(),
                                              out.data(), nullptr, &qs.cfg, nullptr);
  EXPECT_TRUE(IsPeerFailure(failed)) << ResultName(failed) << ": " << attnGetLastError(comm);

  attnComm_t shrunk = nullptr;
  ATTN_ASSERT_OK(comm, attnCommShrink(comm, &kVictim, 1, &shrunk, nullptr, ATTN_SHRINK_ABORT));
  std::vector<int64_t> lost(4, -1);
  int numLost = -1;
  ATTN_ASSERT_OK(shrunk, attnKvPoolShrink(pool, shrunk, lost.data(), int(lost.size()), &numLost));
  // The old communicator may go now: the pool is on the new one.
  EXPECT_EQ(attnCommAbort(comm), attnSuccess);
  comm = shrunk;
  const int me = rank < kVictim ? rank : rank - 1;
  const std::string tag = "rank " + std::to_string(rank) + " (now " + std::to_string(me) + ")";

  const attnKvPoolStats_t st = Stats(pool);
  std::vector<Req> kept;
  if (rank == 0) {  // 100 had a block on rank 2; rank 2's 102 is freed here
    ASSERT_EQ(numLost, 1) << tag;
    EXPECT_EQ(lost[0], 100);
    EXPECT_EQ(st.lent_in_blocks, 0) << tag;
    EXPECT_EQ(st.used_blocks, 2) << tag;
    kept = {Short(0)};
  } else if (rank == 1) {  // 100's blocks here are unclaimed now: freed
    EXPECT_EQ(numLost, 0) << tag;
    EXPECT_EQ(st.lent_in_blocks, 0) << tag;
    EXPECT_EQ(st.lent_out_blocks, 2) << tag;
    EXPECT_EQ(st.used_blocks, 9 - 2) << tag;
    const std::vector<int64_t> h = [&] {
      std::vector<int64_t> v(3, -1);
      EXPECT_EQ(attnKvGetPlacement(pool, 101, v.data(), nullptr), attnSuccess);
      return v;
    }();
    EXPECT_EQ(h, (std::vector<int64_t>{0, 5, 2})) << "101's blocks on old rank 3 are on new rank 2";
    kept = {Long(1), Short(1)};
  } else {  // rank 3: 203 had a block on rank 2
    ASSERT_EQ(numLost, 1) << tag;
    EXPECT_EQ(lost[0], 203);
    EXPECT_EQ(st.lent_in_blocks, 2) << tag;
    EXPECT_EQ(st.used_blocks, 7 + 2) << tag;
    kept = {Long(3)};
  }
  EXPECT_EQ(st.num_requests, int(kept.size())) << tag;
  ExpectAttentionExact(pool, comm, rank, kept, "after the shrink, " + tag);

  // Blocks move on the new communicator: new rank 2 returns 101's blocks.
  moves.clear();
  if (me == 2) moves = {{2, 1, 1, 101, 2}};
  granted.assign(moves.size(), -1);
  ATTN_ASSERT_OK(comm, attnKvMigrate(pool, moves.data(), int(moves.size()), granted.data(), nullptr));
  for (int64_t g : granted) EXPECT_EQ(g, 2);
  EXPECT_EQ(Stats(pool).lent_in_blocks, 0) << tag;
  // The lost requests are prefilled again.
  const Req again = rank == 0 ? Long(0) : Short(3);
  if (rank == 0 || rank == 3) {
    Append(pool, comm, rank, again);
    kept.push_back(again);
  }
  ExpectAttentionExact(pool, comm, rank, kept, "returned and prefilled again, " + tag);
  ATTN_EXPECT_OK(comm, attnKvPoolDestroy(pool));
}

TEST(KvPoolShrink, AfterAThreadRankAborts) {
  attnConfig_t cfg = ConfigWithTimeout(5000);
  RunOptions opts = AttnRunOptions();
  opts.config = &cfg;
  RunThreads(4, [&](int rank, int n, attnComm_t& comm) {
    SurviveALostRank(rank, n, comm, [](attnComm_t& c, attnKvPool_t p) {
      EXPECT_EQ(attnKvPoolDestroy(p), attnSuccess);
      EXPECT_EQ(attnCommAbort(c), attnSuccess);
      c = nullptr;
    });
  }, opts);
}

TEST(KvPoolShrink, AfterAProcessIsKilled) {
  attnConfig_t cfg = ConfigWithTimeout(5000);
  RunOptions opts = AttnRunOptions();
  opts.config = &cfg;
  auto results = RunProcessesCollect(4, [&](int rank, int n, attnComm_t& comm) {
    SurviveALostRank(rank, n, comm, [](attnComm_t&, attnKvPool_t) { raise(SIGKILL); });
  }, opts);
  ASSERT_EQ(results.size(), size_t(4));
  EXPECT_TRUE(results[kVictim].signaled && results[kVictim].signal == SIGKILL) << results[kVictim].Describe();
  for (int r = 0; r < 4; ++r)
    if (r != kVictim) EXPECT_TRUE(results[r].passed()) << results[r].Describe();
}

// Rank 0 lends two blocks to rank 1 and releases the request: rank 1 frees
// them only in the pool's next collective. A shrink (of no rank) comes
// first; the comparison of books settles it.
TEST(KvPoolShrink, AnUndeliveredReleaseIsSettled) {
  RunThreads(3, [&](int rank, int, attnComm_t& comm) {
    const attnKvPoolConfig_t cfg = PoolCfg(kBt, 32);
    attnKvPool_t pool = nullptr;
    ATTN_ASSERT_OK(comm, attnKvPoolCreate(comm, &cfg, &pool));
    Append(pool, comm, rank, Long(rank));
    std::vector<attnKvMove_t> moves;
    if (rank == 0) moves = {{0, 1, 0, 100, 2}};
    ATTN_ASSERT_OK(comm, attnKvMigrate(pool, moves.data(), int(moves.size()), nullptr, nullptr));
    if (rank == 0) ATTN_ASSERT_OK(comm, attnKvRelease(pool, 100, nullptr));
    EXPECT_EQ(Stats(pool).lent_in_blocks, rank == 1 ? 2 : 0);
    attnComm_t shrunk = nullptr;
    ATTN_ASSERT_OK(comm, attnCommShrink(comm, nullptr, 0, &shrunk, nullptr, ATTN_SHRINK_DEFAULT));
    int numLost = -1;
    ATTN_ASSERT_OK(shrunk, attnKvPoolShrink(pool, shrunk, nullptr, 0, &numLost));
    EXPECT_EQ(numLost, 0);
    const attnKvPoolStats_t st = Stats(pool);
    EXPECT_EQ(st.lent_in_blocks, 0) << "rank " << rank;
    EXPECT_EQ(st.used_blocks, rank == 0 ? 0 : 7) << "rank " << rank;
    ExpectAttentionExact(pool, shrunk, rank, rank == 0 ? std::vector<Req>{} : std::vector<Req>{Long(rank)},
                         "after the shrink");
    ATTN_EXPECT_OK(shrunk, attnKvPoolDestroy(pool));
    EXPECT_EQ(attnCommDestroy(shrunk), attnSuccess);
  }, AttnRunOptions());
}

// The owner lends 3 blocks of request 100 to rank 1, whose books then lose
// one of them (as if the failure had cut the migration between the send
// and its booking). The shrink reports 100 lost at the owner, and rank 1
// frees the other two in the pool's next collective.
TEST(KvPoolShrink, AHolderThatLacksAClaimedBlockLosesTheRequest) {
  RunThreads(3, [&](int rank, int, attnComm_t& comm) {
    auto pool = std::make_unique<attn::KvPool>(comm, PoolCfg(kBt, 32));
    ASSERT_EQ(pool->allocate(), attnSuccess);
    for (const Req& r : {Long(rank), Short(rank)}) {
      const KvTokens x = RequestTokens(attnFloat32, rank, r.id, r.len);
      ASSERT_EQ(pool->append(r.id, x.k.data(), x.v.data(), x.pos.data(), r.len, nullptr), attnSuccess);
    }
    std::vector<attnKvMove_t> moves;
    if (rank == 0) moves = {{0, 1, 0, 100, 3}};
    std::vector<int64_t> granted;
    ASSERT_EQ(attn::kvMigrate(*pool, moves, attnSuccess, &granted), attnSuccess);
    if (rank == 1) {
      std::lock_guard<std::mutex> g(pool->booksMu);
      std::vector<attn::KvLentBlock>& held = pool->lentIn.at({0, 100});
      ASSERT_EQ(held.size(), 3u);
      pool->giveSlot(held.back().slot);
      held.pop_back();
    }
    attnComm_t shrunk = nullptr;
    ATTN_ASSERT_OK(comm, attnCommShrink(comm, nullptr, 0, &shrunk, nullptr, ATTN_SHRINK_DEFAULT));
    std::vector<int64_t> lost;
    ASSERT_EQ(attn::kvPoolShrink(pool.get(), shrunk, attnSuccess, &lost), attnSuccess) << attnGetLastError(shrunk);
    EXPECT_EQ(lost, rank == 0 ? std::vector<int64_t>{100} : std::vector<int64_t>{}) << "rank " << rank;
    EXPECT_EQ(pool->owns(100), false);
    // The release reaches rank 1 with the next collective.
    ASSERT_EQ(attn::kvMigrate(*pool, {}, attnSuccess, &granted), attnSuccess) << attnGetLastError(shrunk);
    EXPECT_TRUE(pool->lentIn.empty()) << "rank " << rank;
    const int64_t own = rank == 0 ? 2 : 7 + 2;  // rank 0 keeps only request 200
    EXPECT_EQ(pool->config().capacity_blocks - pool->freeBlocks(), own) << "rank " << rank;
    pool.reset();
    EXPECT_EQ(attnCommDestroy(shrunk), attnSuccess);
  }, AttnRunOptions());
}

// Bad input: a NULL pool on one rank fails the call everywhere; a
// communicator that was not shrunk from the pool's is refused. The pool
// stays on its communicator, and the right call then works.
TEST(KvPoolShrink, BadInputFailsEverywhereAndMovesNothing) {
  RunThreads(3, [&](int rank, int, attnComm_t& comm) {
    const attnKvPoolConfig_t cfg = PoolCfg(kBt, 32);
    attnKvPool_t pool = nullptr;
    ATTN_ASSERT_OK(comm, attnKvPoolCreate(comm, &cfg, &pool));
    Append(pool, comm, rank, Short(rank));
    attnComm_t shrunk = nullptr;
    ATTN_ASSERT_OK(comm, attnCommShrink(comm, nullptr, 0, &shrunk, nullptr, ATTN_SHRINK_DEFAULT));

    attnResult_t r = attnKvPoolShrink(rank == 1 ? nullptr : pool, shrunk, nullptr, 0, nullptr);
    EXPECT_EQ(r, rank == 1 ? attnInvalidArgument : attnRemoteError) << attnGetLastError(shrunk);
    if (rank != 1) EXPECT_TRUE(Contains(attnGetLastError(shrunk), "rank 1")) << attnGetLastError(shrunk);

    // The pool's own communicator was not shrunk from it; a split one neither.
    EXPECT_EQ(attnKvPoolShrink(pool, comm, nullptr, 0, nullptr), attnInvalidUsage);
    EXPECT_TRUE(Contains(attnGetLastError(comm), "not made by attnCommShrink")) << attnGetLastError(comm);
    int64_t lost = 0;
    EXPECT_EQ(attnKvPoolShrink(pool, shrunk, &lost, -1, nullptr), attnInvalidArgument);
    EXPECT_EQ(attnKvPoolShrink(pool, shrunk, nullptr, 1, nullptr), attnInvalidArgument);

    ExpectAttentionExact(pool, comm, rank, {Short(rank)}, "still on the old communicator");
    int numLost = -1;
    ATTN_ASSERT_OK(shrunk, attnKvPoolShrink(pool, shrunk, &lost, 1, &numLost));
    EXPECT_EQ(numLost, 0);
    ExpectAttentionExact(pool, shrunk, rank, {Short(rank)}, "on the new communicator");
    ATTN_EXPECT_OK(shrunk, attnKvPoolDestroy(pool));
    EXPECT_EQ(attnCommDestroy(shrunk), attnSuccess);
  }, AttnRunOptions());
}

}  // namespace
}  // namespace attn_test
