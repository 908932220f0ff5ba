// The distributed KV cache (Infinite-LLM DistAttention): a pool of blocks
// per rank, moves between pools with a reservation handshake, attention
// that ships queries to the blocks' holders, and the rebalancer that plans
// moves from every rank's heartbeat. Checked here:
//   - append / release / placement bookkeeping on one rank;
//   - attention over a request's blocks wherever they are equals exact
//     attention over all its tokens (double-precision reference), before and
//     after blocks are lent out and returned, fp32 / fp16 / bf16, causal,
//     ranks as threads and as processes;
//   - a destination grants whole moves while its free blocks last (first
//     come, first served) and refuses the rest; nothing moves twice;
//   - a released request's blocks are freed on its holders;
//   - the rebalancer moves what attnKvPlan plans;
//   - bad input fails the call on every rank, naming the rank, and the
//     communicator stays usable.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "attncomm.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/reference_attention.h"
#include "src/attn/kv_attention.h"
#include "tests/support/attn_fixtures.h"
#include "tests/support/kv_fixtures.h"
#include "tests/support/multirank.h"

namespace attn_test {
namespace {

constexpr int kHkv = kKvHeads, kD = kKvDim;
using Tokens = KvTokens;

std::vector<uint8_t> Values(attnDataType_t t, size_t count, uint64_t seed) { return KvValues(t, count, seed); }
size_t ElemSize(attnDataType_t t) { return KvElemSize(t); }

// Runs attnKvAttention for this rank's requests and compares each with the
// exact reference over all of its tokens.
AttnCheck CheckAttention(attnKvPool_t pool, attnComm_t comm, int rank, const std::vector<Req>& reqs,
                         attnDataType_t t, bool causal, int hq = 4) {
  const KvQueries qs = MakeKvQueries(rank, reqs, t, causal, hq);
  std::vector<uint8_t> out(qs.q.size());
  std::vector<float> lse(size_t(qs.rows) * hq);
  AttnCheck c;
  c.rc = attnKvAttention(pool, int(qs.ids.size()), qs.ids.data(), qs.offs.data(), qs.q.data(), qs.qpos.data(),
                         out.data(), lse.data(), &qs.cfg, nullptr);
  if (c.rc != attnSuccess) {
    c.error = attnGetLastError(comm);
    return c;
  }
  return CompareKvAttention(qs, rank, reqs, t, causal, out.data(), lse.data());
}

void AppendRequest(attnKvPool_t pool, attnComm_t comm, attnDataType_t t, int rank, const Req& r) {
  Tokens x = RequestTokens(t, rank, r.id, r.len);
  // In two pieces, so the second fills the first's last block.
  const int first = r.len / 3;
  const size_t row = size_t(kHkv) * kD * ElemSize(t);
  ATTN_ASSERT_OK(comm, attnKvAppend(pool, r.id, x.k.data(), x.v.data(), x.pos.data(), first, nullptr));
  ATTN_ASSERT_OK(comm, attnKvAppend(pool, r.id, x.k.data() + first * row, x.v.data() + first * row,
                                    x.pos.data() + first, r.len - first, nullptr));
}

std::vector<int64_t> Holders(attnKvPool_t pool, int n, int64_t req) {
  std::vector<int64_t> h(static_cast<size_t>(n), int64_t(-1));
  EXPECT_EQ(attnKvGetPlacement(pool, req, h.data(), nullptr), attnSuccess) << attnGetLastError(nullptr);
  return h;
}

// ---------------------------------------------------------------------------
// One rank: bookkeeping.

TEST(KvPool, AppendFillsBlocksAndRefusesWhatDoesNotFit) {
  RunThreads(1, [&](int, int, attnComm_t& comm) {
    const attnKvPoolConfig_t cfg = PoolCfg(4, 4);
    attnKvPool_t pool = nullptr;
    ATTN_ASSERT_OK(comm, attnKvPoolCreate(comm, &cfg, &pool));
    Tokens x = RequestTokens(attnFloat32, 0, 7, 17);
    const size_t row = size_t(kHkv) * kD * 4;
    ATTN_ASSERT_OK(comm, attnKvAppend(pool, 7, x.k.data(), x.v.data(), x.pos.data(), 10, nullptr));
    int64_t holder = 0, tokens = 0;
    ATTN_ASSERT_OK(comm, attnKvGetPlacement(pool, 7, &holder, &tokens));
    EXPECT_EQ(holder, 3);  // 10 tokens in blocks of 4
    EXPECT_EQ(tokens, 10);
    // 7 more need 2 new blocks (2 fit in the last one); only 1 is free.
    EXPECT_EQ(attnKvAppend(pool, 7, x.k.data() + 10 * row, x.v.data() + 10 * row, x.pos.data() + 10, 7, nullptr),
              attnInvalidUsage);
    EXPECT_NE(std::string(attnGetLastError(nullptr)).find("free"), std::string::npos)
        << attnGetLastError(nullptr);
    ATTN_ASSERT_OK(comm, attnKvGetPlacement(pool, 7, &holder, &tokens));
    EXPECT_EQ(tokens, 10) << "a refused append must append nothing";
    // Positions must go on increasing.
    EXPECT_EQ(attnKvAppend(pool, 7, x.k.data(), x.v.data(), x.pos.data() + 9, 1, nullptr), attnInvalidArgument);
    ATTN_ASSERT_OK(comm, attnKvAppend(pool, 7, x.k.data() + 10 * row, x.v.data() + 10 * row,
                                      x.pos.data() + 10, 6, nullptr));
    attnKvPoolStats_t st{};
    ATTN_ASSERT_OK(comm, attnKvPoolGetStats(pool, &st));
    EXPECT_EQ(st.used_blocks, 4);
    EXPECT_EQ(st.num_requests, 1);
    ExpectExact(CheckAttention(pool, comm, 0, {{7, 16, 3}}, attnFloat32, true), attnFloat32, "one rank");
    ATTN_ASSERT_OK(comm, attnKvRelease(pool, 7, nullptr));
    ATTN_ASSERT_OK(comm, attnKvPoolGetStats(pool, &st));
    EXPECT_EQ(st.used_blocks, 0);
    EXPECT_EQ(st.num_requests, 0);
    EXPECT_EQ(attnKvRelease(pool, 7, nullptr), attnInvalidArgument);
    EXPECT_EQ(attnKvGetPlacement(pool, 7, nullptr, nullptr), attnInvalidArgument);
    ATTN_ASSERT_OK(comm, attnKvPoolDestroy(pool));
  }, AttnRunOptions());
}

TEST(KvPool, BadConfigsAreRefusedOnEveryRank) {
  RunThreads(3, [&](int rank, int, attnComm_t& comm) {
    attnKvPool_t pool = nullptr;
    // Rank 1's config is invalid: every rank fails, rank 1 with the reason.
    attnKvPoolConfig_t cfg = PoolCfg(rank == 1 ? 0 : 4, 8);
    attnResult_t r = attnKvPoolCreate(comm, &cfg, &pool);
    EXPECT_NE(r, attnSuccess);
    EXPECT_EQ(pool, nullptr);
    const std::string err = attnGetLastError(comm);
    if (rank == 1) EXPECT_NE(err.find("block_tokens"), std::string::npos) << err;
    else EXPECT_NE(err.find("rank 1"), std::string::npos) << err;
    // Layouts that disagree: every rank fails, naming the other.
    cfg = PoolCfg(rank == 2 ? 8 : 4, 8);
    EXPECT_EQ(attnKvPoolCreate(comm, &cfg, &pool), attnInvalidUsage);
    EXPECT_NE(std::string(attnGetLastError(comm)).find("must agree"), std::string::npos);
    // The communicator is still good: capacities may differ.
    cfg = PoolCfg(4, 8 + rank);
    ATTN_ASSERT_OK(comm, attnKvPoolCreate(comm, &cfg, &pool));
    ATTN_ASSERT_OK(comm, attnKvPoolDestroy(pool));
  }, AttnRunOptions(60000));
}

// ---------------------------------------------------------------------------
// Migration and attention across ranks.

struct Scenario {
  attnDataType_t dtype;
  bool causal;
  int blockTokens;
};

// Every rank owns two requests; rank 0 lends blocks of its long request to
// ranks 1 and 2, then rank 2 returns them. Attention is exact throughout.
void LendAndReturn(const Scenario& s, int rank, int n, attnComm_t& comm) {
  const attnKvPoolConfig_t cfg = PoolCfg(s.blockTokens, 64, s.dtype);
  attnKvPool_t pool = nullptr;
  ATTN_ASSERT_OK(comm, attnKvPoolCreate(comm, &cfg, &pool));
  const std::vector<Req> reqs = {{100 + rank, 3 * s.blockTokens * n + 5, 1},
                                 {200 + rank, s.blockTokens + 3, 4}};
  for (const Req& r : reqs) AppendRequest(pool, comm, s.dtype, rank, r);
  const std::string tag = std::string(s.dtype == attnFloat32 ? "fp32" : s.dtype == attnFloat16 ? "fp16" : "bf16") +
                          (s.causal ? ", causal" : "") + ", rank " + std::to_string(rank);
  ExpectExact(CheckAttention(pool, comm, rank, reqs, s.dtype, s.causal), s.dtype, "all at home, " + tag);

  // Rank 0 lends 3 blocks to rank 1 and 2 to rank 2; the others lend none.
  std::vector<attnKvMove_t> moves;
  if (rank == 0) moves = {{0, 1, 0, 100, 3}, {0, 2, 0, 100, 2}};
  std::vector<int64_t> granted(moves.size(), -1);
  ATTN_ASSERT_OK(comm, attnKvMigrate(pool, moves.data(), int(moves.size()), granted.data(), nullptr));
  if (rank == 0) {
    EXPECT_EQ(granted, (std::vector<int64_t>{3, 2}));
    std::vector<int64_t> h = Holders(pool, n, 100);
    EXPECT_EQ(h[1], 3);
    EXPECT_EQ(h[2], 2);
  }
  attnKvPoolStats_t st{};
  ATTN_ASSERT_OK(comm, attnKvPoolGetStats(pool, &st));
  EXPECT_EQ(st.lent_in_blocks, rank == 1 ? 3 : rank == 2 ? 2 : 0) << tag;
  EXPECT_EQ(st.lent_out_blocks, rank == 0 ? 5 : 0) << tag;
  ExpectExact(CheckAttention(pool, comm, rank, reqs, s.dtype, s.causal), s.dtype, "after lending, " + tag);

  // Appends go on at home while blocks are away.
  // Rank 2 returns its two blocks; rank 1 returns one.
  moves.clear();
  if (rank == 2) moves = {{2, 0, 0, 100, 2}};
  if (rank == 1) moves = {{1, 0, 0, 100, 1}};
  granted.assign(moves.size(), -1);
  ATTN_ASSERT_OK(comm, attnKvMigrate(pool, moves.data(), int(moves.size()), granted.data(), nullptr));
  for (int64_t g : granted) EXPECT_EQ(g, rank == 2 ? 2 : 1);
  if (rank == 0) {
    std::vector<int64_t> h = Holders(pool, n, 100);
    EXPECT_EQ(h[1], 2);
    EXPECT_EQ(h[2], 0);
  }
  ExpectExact(CheckAttention(pool, comm, rank, reqs, s.dtype, s.causal), s.dtype, "after returning, " + tag);
  ATTN_ASSERT_OK(comm, attnKvPoolDestroy(pool));
}

// Under a sliding window a request's queries go only to the holders of
// blocks they may see (kvBlockSeen, from the positions booked at append),
// and the result stays exact: rank 0 lends the oldest blocks of its long
// request, which a window of 2 blocks hides from its last queries.
TEST(KvAttention, WindowedQueriesAskOnlyHoldersOfVisibleBlocks) {
  attnAttnConfig_t w = ATTN_ATTN_CONFIG_INITIALIZER;
  w.window_left = 8;
  attn::KvBlockLoc b;
  b.firstPos = 0;
  b.lastPos = 7;
  EXPECT_FALSE(attn::kvBlockSeen(b, w, 16, 20)) << "keys 0..7, queries 16..20 see 8..20";
  EXPECT_TRUE(attn::kvBlockSeen(b, w, 15, 20)) << "query 15 sees key 7";
  attnAttnConfig_t none = ATTN_ATTN_CONFIG_INITIALIZER;
  EXPECT_TRUE(attn::kvBlockSeen(b, none, 1000, 1001)) << "no window: every block";
  attn::KvBlockLoc unknown;
  EXPECT_TRUE(attn::kvBlockSeen(unknown, w, 1000, 1001)) << "positions not booked: asked";
  w.window_left = -1;
  w.window_right = 2;
  w.causal = 0;
  EXPECT_FALSE(attn::kvBlockSeen(b, w, -10, -3)) << "keys 0..7 are past queries -10..-3's right bound";
  EXPECT_TRUE(attn::kvBlockSeen(b, w, -10, -2));

  const int bt = 4;
  RunThreads(3, [&](int rank, int n, attnComm_t& comm) {
    const attnKvPoolConfig_t cfg = PoolCfg(bt, 64);
    attnKvPool_t pool = nullptr;
    ATTN_ASSERT_OK(comm, attnKvPoolCreate(comm, &cfg, &pool));
    const std::vector<Req> reqs = {{100 + rank, 3 * bt * n + 3, 2}};
    for (const Req& r : reqs) AppendRequest(pool, comm, attnFloat32, rank, r);
    std::vector<attnKvMove_t> moves;
    if (rank == 0) moves = {{0, 1, 0, 100, 3}, {0, 2, 0, 100, 2}};  // the 5 oldest blocks away
    std::vector<int64_t> granted(moves.size(), -1);
    ATTN_ASSERT_OK(comm, attnKvMigrate(pool, moves.data(), int(moves.size()), granted.data(), nullptr));
    // 26: the last query (position 37) just sees rank 1's newest lent key (11).
    for (int window : {-1, 2 * bt, 26, 0}) {
      KvQueries qs = MakeKvQueries(rank, reqs, attnFloat32, true);
      qs.cfg.window_left = window;
      std::vector<uint8_t> out(qs.q.size());
      std::vector<float> lse(size_t(qs.rows) * 4);
      AttnCheck c;
      c.rc = attnKvAttention(pool, int(qs.ids.size()), qs.ids.data(), qs.offs.data(), qs.q.data(), qs.qpos.data(),
                             out.data(), lse.data(), &qs.cfg, nullptr);
      if (c.rc == attnSuccess) c = CompareKvAttention(qs, rank, reqs, attnFloat32, true, out.data(), lse.data());
      else c.error = attnGetLastError(comm);
      ExpectExact(c, attnFloat32, "window " + std::to_string(window) + ", rank " + std::to_string(rank));
    }
    ATTN_ASSERT_OK(comm, attnKvPoolDestroy(pool));
  }, AttnRunOptions());
}

TEST(KvMigrate, LendAndReturnKeepAttentionExactThreads) {
  for (Scenario s : {Scenario{attnFloat32, true, 4}, Scenario{attnFloat32, false, 16},
                     Scenario{attnFloat16, true, 8}, Scenario{attnBfloat16, true, 5}})
    RunThreads(3, [&](int rank, int n, attnComm_t& comm) { LendAndReturn(s, rank, n, comm); },
               AttnRunOptions());
}

TEST(KvMigrate, LendAndReturnKeepAttentionExactProcesses) {
  RunProcesses(3, [&](int rank, int n, attnComm_t& comm) {
    LendAndReturn(Scenario{attnFloat32, true, 4}, rank, n, comm);
  }, AttnRunOptions());
}

// Several moves in one call between the same ranks and in both directions:
// per peer, each move's header and blocks go as separate messages, so their
// order on the wire must line up on both sides. Blocks lent in are sent on
// (returned) in the same call as the holder's own blocks are lent.
void CrossingMoves(const Scenario& s, int rank, int n, attnComm_t& comm) {
  const attnKvPoolConfig_t cfg = PoolCfg(s.blockTokens, 64, s.dtype);
  attnKvPool_t pool = nullptr;
  ATTN_ASSERT_OK(comm, attnKvPoolCreate(comm, &cfg, &pool));
  const std::vector<Req> reqs = {{100 + rank, 6 * s.blockTokens + 5, 1},
                                 {200 + rank, 2 * s.blockTokens + 3, 4}};
  for (const Req& r : reqs) AppendRequest(pool, comm, s.dtype, rank, r);
  const std::string tag = "rank " + std::to_string(rank);

  // Rank 0 sends two moves to rank 1, rank 1 sends to rank 0 at the same
  // time, and rank 2 sends to rank 1 too.
  std::vector<attnKvMove_t> moves;
  if (rank == 0) moves = {{0, 1, 0, 100, 2}, {0, 1, 0, 200, 1}};
  if (rank == 1) moves = {{1, 0, 1, 101, 3}};
  if (rank == 2) moves = {{2, 1, 2, 102, 2}};
  std::vector<int64_t> granted(moves.size(), -1);
  ATTN_ASSERT_OK(comm, attnKvMigrate(pool, moves.data(), int(moves.size()), granted.data(), nullptr));
  for (size_t i = 0; i < moves.size(); ++i) EXPECT_EQ(granted[i], moves[i].num_blocks) << tag;
  attnKvPoolStats_t st{};
  ATTN_ASSERT_OK(comm, attnKvPoolGetStats(pool, &st));
  EXPECT_EQ(st.lent_in_blocks, rank == 0 ? 3 : rank == 1 ? 5 : 0) << tag;
  EXPECT_EQ(st.lent_out_blocks, rank == 0 ? 3 : rank == 1 ? 3 : 2) << tag;
  ExpectExact(CheckAttention(pool, comm, rank, reqs, s.dtype, s.causal), s.dtype, "crossed, " + tag);

  // Rank 0 returns two of rank 1's blocks and lends one more of its own to
  // rank 1 in the same call; rank 1 returns one of rank 0's blocks.
  moves.clear();
  if (rank == 0) moves = {{0, 1, 1, 101, 2}, {0, 1, 0, 100, 1}};
  if (rank == 1) moves = {{1, 0, 0, 100, 1}};
  granted.assign(moves.size(), -1);
  ATTN_ASSERT_OK(comm, attnKvMigrate(pool, moves.data(), int(moves.size()), granted.data(), nullptr));
  for (size_t i = 0; i < moves.size(); ++i) EXPECT_EQ(granted[i], moves[i].num_blocks) << tag;
  ATTN_ASSERT_OK(comm, attnKvPoolGetStats(pool, &st));
  EXPECT_EQ(st.lent_in_blocks, rank == 0 ? 1 : rank == 1 ? 5 : 0) << tag;
  EXPECT_EQ(st.lent_out_blocks, rank == 0 ? 3 : rank == 1 ? 1 : 2) << tag;
  if (rank == 0) {
    const std::vector<int64_t> h = Holders(pool, n, 100);
    EXPECT_EQ(h[1], 2);
  }
  ExpectExact(CheckAttention(pool, comm, rank, reqs, s.dtype, s.causal), s.dtype, "back and forth, " + tag);
  ATTN_ASSERT_OK(comm, attnKvPoolDestroy(pool));
}

TEST(KvMigrate, CrossingAndRepeatedMovesInOneCallThreads) {
  for (Scenario s : {Scenario{attnFloat32, true, 4}, Scenario{attnBfloat16, false, 16}})
    RunThreads(3, [&](int rank, int n, attnComm_t& comm) { CrossingMoves(s, rank, n, comm); },
               AttnRunOptions());
}

TEST(KvMigrate, CrossingAndRepeatedMovesInOneCallProcesses) {
  RunProcesses(3, [&](int rank, int n, attnComm_t& comm) {
    CrossingMoves(Scenario{attnFloat16, true, 8}, rank, n, comm);
  }, AttnRunOptions());
}

// Ranks 0 and 1 both ask rank 2, which has room for one of them: exactly one
// move is granted whole, the other refused, and attention stays exact.
TEST(KvMigrate, DestinationGrantsFirstComeFirstServedWhileSpaceLasts) {
  std::atomic<int64_t> grantedTotal{0}, grantedMoves{0};
  RunThreads(3, [&](int rank, int n, attnComm_t& comm) {
    const attnKvPoolConfig_t cfg = PoolCfg(4, rank == 2 ? 4 : 32);
    attnKvPool_t pool = nullptr;
    ATTN_ASSERT_OK(comm, attnKvPoolCreate(comm, &cfg, &pool));
    std::vector<Req> reqs;
    if (rank < 2) {
      reqs = {{5, 30, 2}};
      AppendRequest(pool, comm, attnFloat32, rank, reqs[0]);
    }
    std::vector<attnKvMove_t> moves;
    if (rank < 2) moves = {{rank, 2, rank, 5, 3}};
    std::vector<int64_t> granted(moves.size(), -1);
    ATTN_ASSERT_OK(comm, attnKvMigrate(pool, moves.data(), int(moves.size()), granted.data(), nullptr));
    for (int64_t g : granted) {
      EXPECT_TRUE(g == 0 || g == 3) << "a move is granted whole or not at all, got " << g;
      grantedTotal += g;
      grantedMoves += g > 0;
    }
    attnKvPoolStats_t st{};
    ATTN_ASSERT_OK(comm, attnKvPoolGetStats(pool, &st));
    if (rank == 2) {
      EXPECT_EQ(st.lent_in_blocks, 3);
      EXPECT_EQ(st.used_blocks, 3);
    }
    if (rank < 2) {
      std::vector<int64_t> h = Holders(pool, n, 5);
      EXPECT_EQ(h[2], granted[0]);
      EXPECT_EQ(h[size_t(rank)] + h[2], 8);  // 30 tokens in blocks of 4
    }
    ExpectExact(CheckAttention(pool, comm, rank, reqs, attnFloat32, true), attnFloat32,
                "after the race, rank " + std::to_string(rank));
    ATTN_ASSERT_OK(comm, attnKvPoolDestroy(pool));
  }, AttnRunOptions());
  EXPECT_EQ(grantedMoves.load(), 1);
  EXPECT_EQ(grantedTotal.load(), 3);
}

// Releasing a request frees its blocks at home at once and on its holders
// at the next collective call that goes through (a failed one keeps it owed).
TEST(KvRelease, HoldersFreeTheBlocksAtTheNextCall) {
  RunThreads(2, [&](int rank, int n, attnComm_t& comm) {
    const attnKvPoolConfig_t cfg = PoolCfg(4, 16);
    attnKvPool_t pool = nullptr;
    ATTN_ASSERT_OK(comm, attnKvPoolCreate(comm, &cfg, &pool));
    if (rank == 0) AppendRequest(pool, comm, attnFloat32, 0, {9, 21, 1});
    std::vector<attnKvMove_t> moves;
    if (rank == 0) moves = {{0, 1, 0, 9, 4}};
    ATTN_ASSERT_OK(comm, attnKvMigrate(pool, moves.data(), int(moves.size()), nullptr, nullptr));
    attnKvPoolStats_t st{};
    ATTN_ASSERT_OK(comm, attnKvPoolGetStats(pool, &st));
    EXPECT_EQ(st.used_blocks, rank == 0 ? 2 : 4);
    if (rank == 0) {
      ATTN_ASSERT_OK(comm, attnKvRelease(pool, 9, nullptr));
      ATTN_ASSERT_OK(comm, attnKvPoolGetStats(pool, &st));
      EXPECT_EQ(st.used_blocks, 0);
    }
    // A call that fails (rank 1's move is bad) must not lose the release...
    attnKvMove_t bad = {rank, rank, rank, 9, 1};
    EXPECT_NE(attnKvMigrate(pool, rank == 1 ? &bad : nullptr, rank == 1 ? 1 : 0, nullptr, nullptr), attnSuccess);
    // ...and the next collective call on the pool delivers it.
    ExpectExact(CheckAttention(pool, comm, rank, {}, attnFloat32, true), attnFloat32, "no queries");
    ATTN_ASSERT_OK(comm, attnKvPoolGetStats(pool, &st));
    EXPECT_EQ(st.used_blocks, 0) << "rank " << rank;
    EXPECT_EQ(st.lent_in_blocks, 0) << "rank " << rank;
    (void)n;
    ATTN_ASSERT_OK(comm, attnKvPoolDestroy(pool));
  }, AttnRunOptions());
}

// A bad move on one rank fails the call on every rank (the others name it)
// and nothing moves; the next call works.
TEST(KvMigrate, BadMoveFailsEveryRankAndMovesNothing) {
  RunThreads(3, [&](int rank, int n, attnComm_t& comm) {
    const attnKvPoolConfig_t cfg = PoolCfg(4, 16);
    attnKvPool_t pool = nullptr;
    ATTN_ASSERT_OK(comm, attnKvPoolCreate(comm, &cfg, &pool));
    AppendRequest(pool, comm, attnFloat32, rank, {1, 13, 1});  // 4 blocks, 3 movable
    std::vector<attnKvMove_t> moves = {{rank, (rank + 1) % n, rank, 1, rank == 1 ? 4 : 1}};
    attnResult_t r = attnKvMigrate(pool, moves.data(), 1, nullptr, nullptr);
    EXPECT_NE(r, attnSuccess);
    const std::string err = attnGetLastError(comm);
    if (rank == 1) {
      EXPECT_EQ(r, attnInvalidArgument);
      EXPECT_NE(err.find("last block stays"), std::string::npos) << err;
    } else {
      EXPECT_NE(err.find("rank 1"), std::string::npos) << err;
    }
    std::vector<int64_t> h = Holders(pool, n, 1);
    EXPECT_EQ(h[size_t(rank)], 4) << "nothing may move when a rank's moves are bad";
    // Other shapes of bad input.
    attnKvMove_t other = {rank, rank, rank, 1, 1};  // to itself
    EXPECT_NE(attnKvMigrate(pool, rank == 0 ? &other : nullptr, rank == 0 ? 1 : 0, nullptr, nullptr), attnSuccess);
    attnKvMove_t third = {rank, (rank + 1) % n, (rank + 2) % n, 1, 1};  // owner neither end
    EXPECT_NE(attnKvMigrate(pool, rank == 2 ? &third : nullptr, rank == 2 ? 1 : 0, nullptr, nullptr), attnSuccess);
    // Good moves now.
    moves[0].num_blocks = 1;
    int64_t g = -1;
    ATTN_ASSERT_OK(comm, attnKvMigrate(pool, moves.data(), 1, &g, nullptr));
    EXPECT_EQ(g, 1);
    ExpectExact(CheckAttention(pool, comm, rank, {{1, 13, 1}}, attnFloat32, true), attnFloat32, "after");
    ATTN_ASSERT_OK(comm, attnKvPoolDestroy(pool));
  }, AttnRunOptions());
}

TEST(KvAttention, BadQueriesFailEveryRank) {
  RunThreads(2, [&](int rank, int, attnComm_t& comm) {
    const attnKvPoolConfig_t cfg = PoolCfg(4, 16);
    attnKvPool_t pool = nullptr;
    ATTN_ASSERT_OK(comm, attnKvPoolCreate(comm, &cfg, &pool));
    AppendRequest(pool, comm, attnFloat32, rank, {3, 9, 1});
    attnAttnConfig_t acfg = AttnCfg(4, kHkv, kD, attnFloat32, true);
    std::vector<float> q(4 * kD), out(4 * kD), lse(4);
    int32_t offs[2] = {0, 1}, qpos[1] = {8};
    int64_t id = rank == 1 ? 4 : 3;  // rank 1 names a request it does not have
    attnResult_t r = attnKvAttention(pool, 1, &id, offs, q.data(), qpos, out.data(), lse.data(), &acfg, nullptr);
    EXPECT_NE(r, attnSuccess);
    const std::string err = attnGetLastError(comm);
    EXPECT_NE(err.find(rank == 1 ? "not a request of this rank" : "rank 1"), std::string::npos) << err;
    id = 3;
    acfg.head_dim = rank == 0 ? 8 : kD;  // not the pool's
    EXPECT_NE(attnKvAttention(pool, 1, &id, offs, q.data(), qpos, out.data(), lse.data(), &acfg, nullptr), attnSuccess);
    acfg.head_dim = kD;
    EXPECT_NE(attnKvAttention(pool, 1, &id, offs, q.data(), rank == 0 ? nullptr : qpos, out.data(), lse.data(),
                              &acfg, nullptr), attnSuccess);
    ExpectExact(CheckAttention(pool, comm, rank, {{3, 9, 1}}, attnFloat32, true), attnFloat32, "after");
    ATTN_ASSERT_OK(comm, attnKvPoolDestroy(pool));
  }, AttnRunOptions());
}

// A request may come with no query rows (equal adjacent q_offsets) while
// peers hold blocks of it. They must not answer it: the owner expects no
// reply, and an empty one left unmatched was taken by its next receive
// from them, which broke the calls that followed (found by a fuzzer).
TEST(KvAttention, RequestsWithoutQueryRowsLeaveTheCommunicatorInStep) {
  RunThreads(3, [&](int rank, int n, attnComm_t& comm) {
    const attnKvPoolConfig_t cfg = PoolCfg(4, 32);
    attnKvPool_t pool = nullptr;
    ATTN_ASSERT_OK(comm, attnKvPoolCreate(comm, &cfg, &pool));
    const std::vector<Req> asked = {{100 + rank, 21, 2}, {200 + rank, 13, 3}};
    for (const Req& r : asked) AppendRequest(pool, comm, attnFloat32, rank, r);
    // Every rank lends a block of its first request to the next rank and
    // one of its second to the one after: the next rank holds blocks of
    // the first request only.
    const std::vector<attnKvMove_t> moves = {{rank, (rank + 1) % n, rank, 100 + rank, 1},
                                             {rank, (rank + 2) % n, rank, 200 + rank, 1}};
    std::vector<int64_t> granted(moves.size(), -1);
    ATTN_ASSERT_OK(comm, attnKvMigrate(pool, moves.data(), int(moves.size()), granted.data(), nullptr));
    for (int64_t g : granted) EXPECT_EQ(g, 1);
    for (int round = 0; round < 3; ++round) {
      // Rank `round % n` asks nothing of its first request, the others ask.
      std::vector<Req> reqs = asked;
      if (rank == round % n) reqs[0].qRows = 0;
      ExpectExact(CheckAttention(pool, comm, rank, reqs, attnFloat32, true), attnFloat32,
                  "round " + std::to_string(round) + ", rank " + std::to_string(rank));
      ATTN_ASSERT_OK(comm, attnBarrier(comm, nullptr));
    }
    ATTN_ASSERT_OK(comm, attnKvPoolDestroy(pool));
  }, AttnRunOptions());
}

// ---------------------------------------------------------------------------
// The rebalancer: heartbeat, plan, moves.

attnKvModel_t AttentionBoundModel() {
  attnKvModel_t m{};
  m.nonattn_us_base = 200;
  m.nonattn_us_per_req = 20;
  m.attn_us_per_block = 10;
  m.num_layers = 32;
  m.debtor_max_batch = 1;
  m.creditor_max_util = 0.5;
  return m;
}

TEST(KvRebalance, MovesWhatThePlanSaysAndStaysExact) {
  RunThreads(3, [&](int rank, int n, attnComm_t& comm) {
    const attnKvPoolConfig_t cfg = PoolCfg(4, 64);
    attnKvPool_t pool = nullptr;
    ATTN_ASSERT_OK(comm, attnKvPoolCreate(comm, &cfg, &pool));
    // Rank 0: one long request (a debtor: batch 1, requests waiting); ranks
    // 1 and 2: two short requests each in roomy pools (creditors).
    std::vector<Req> reqs = {{10 + rank, rank == 0 ? 200 : 9, 1}};
    if (rank == 1) reqs.push_back({41, 9, 1});
    if (rank == 2) reqs.push_back({40, 17, 2});
    for (const Req& r : reqs) AppendRequest(pool, comm, attnFloat32, rank, r);
    const attnKvModel_t model = AttentionBoundModel();
    const int pending = rank == 0 ? 4 : 0;
    const int64_t pendingBlocks = 8;

    // What the plan will be, from the same heartbeats.
    std::vector<attnKvInstance_t> inst(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      attnKvInstance_t& in = inst[size_t(r)];
      // Blocks of 4: 200 tokens are 50 blocks (49 movable), 9 are 3 (2
      // movable), 17 are 5 (4 movable); ties of length go to the lower id.
      in.batch_size = r == 0 ? 1 : 2;
      in.pending_requests = r == 0 ? 4 : 0;
      in.pending_blocks = pendingBlocks;
      in.capacity_blocks = 64;
      in.used_blocks = r == 0 ? 50 : r == 1 ? 3 + 3 : 3 + 5;
      in.longest_req = r == 2 ? 40 : 10 + r;
      in.longest_req_blocks = r == 0 ? 49 : r == 1 ? 2 : 4;
    }
    std::vector<attnKvMove_t> plan(16);
    int count = 16;
    ASSERT_EQ(attnKvPlan(inst.data(), n, &model, plan.data(), &count), attnSuccess) << attnGetLastError(nullptr);
    plan.resize(size_t(count));
    int64_t expected = 0;
    for (const attnKvMove_t& m : plan) {
      EXPECT_EQ(m.src, 0) << "only rank 0 is a debtor here";
      if (m.src == rank) expected += m.num_blocks;
    }
    if (rank == 0) EXPECT_GT(expected, 0) << "the model should make rank 0 lend";

    int64_t moved = -1;
    ATTN_ASSERT_OK(comm, attnKvRebalance(pool, &model, pending, pendingBlocks, &moved, nullptr));
    EXPECT_EQ(moved, expected) << "rank " << rank;
    attnKvPoolStats_t st{};
    ATTN_ASSERT_OK(comm, attnKvPoolGetStats(pool, &st));
    if (rank == 0) EXPECT_EQ(st.lent_out_blocks, expected);
    ExpectExact(CheckAttention(pool, comm, rank, reqs, attnFloat32, true), attnFloat32,
                "after rebalancing, rank " + std::to_string(rank));

    // Models that disagree fail on every rank.
    attnKvModel_t other = model;
    if (rank == 1) other.attn_us_per_block = 11;
    EXPECT_EQ(attnKvRebalance(pool, &other, 0, 8, nullptr, nullptr), attnInvalidUsage);
    EXPECT_NE(std::string(attnGetLastError(comm)).find("different models"), std::string::npos);
    ATTN_ASSERT_OK(comm, attnKvPoolDestroy(pool));
  }, AttnRunOptions());
}

TEST(KvPool, HostCommunicatorRefusesAStream) {
  RunThreads(2, [&](int rank, int, attnComm_t& comm) {
    const attnKvPoolConfig_t pc = PoolCfg(4, 4);
    attnKvPool_t pool = nullptr;
    ATTN_ASSERT_OK(comm, attnKvPoolCreate(comm, &pc, &pool));
    const KvTokens x = RequestTokens(attnFloat32, rank, 1, 4);
    attnStream_t bogus = reinterpret_cast<attnStream_t>(uintptr_t(0x10));
    EXPECT_EQ(attnKvAppend(pool, 1, x.k.data(), x.v.data(), x.pos.data(), 4, bogus), attnInvalidArgument);
    EXPECT_NE(std::string(attnGetLastError(nullptr)).find("NULL stream"), std::string::npos);
    ATTN_ASSERT_OK(comm, attnKvAppend(pool, 1, x.k.data(), x.v.data(), x.pos.data(), 4, nullptr));
    EXPECT_EQ(attnKvRelease(pool, 1, bogus), attnInvalidArgument);
    int64_t tokens = 0;
    ATTN_ASSERT_OK(comm, attnKvGetPlacement(pool, 1, nullptr, &tokens));
    EXPECT_EQ(tokens, 4);
    ATTN_ASSERT_OK(comm, attnKvPoolDestroy(pool));
  }, AttnRunOptions());
}

}  // namespace
}  // namespace attn_test
