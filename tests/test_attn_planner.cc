// The sharding planner (attnPlanPrefill / attnPlanGetShard, CP paper
// §3.5.1) and the decode placement (attnDecodePlacement, §3.6):
//   - every new token on exactly one rank, every key (cached or new) on
//     exactly one rank, with its global position and its row in the batch;
//   - each sequence cut into 2N equal chunks (sizes differ by at most one),
//     rank r holding chunks r and 2N-1-r; per-rank counts balanced;
//   - cached keys where a load-balanced prefill of length P put them, new
//     keys with their queries, cached before new in each sequence;
//   - causal work balanced;
//   - decode KV round robin, shifted by one each step;
//   - bad arguments rejected with a message.
// Plus an end-to-end check: a plan's shards run through attnRingAttention.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "attncomm.h"
#include "tests/support/attn_fixtures.h"
#include "tests/support/multirank.h"

namespace attn_test {
namespace {

struct Batch {
  std::vector<int32_t> T, P;  // P empty: full prefill
  std::string Describe() const {
    std::string s = "T={";
    for (size_t i = 0; i < T.size(); ++i) s += (i ? "," : "") + std::to_string(T[i]);
    s += "} P={";
    for (size_t i = 0; i < P.size(); ++i) s += (i ? "," : "") + std::to_string(P[i]);
    return s + "}";
  }
  int32_t p(size_t i) const { return P.empty() ? 0 : P[i]; }
};

// Owns a plan; shards by rank.
class Plan {
 public:
  Plan(const Batch& b, int n) : n_(n) {
    attnBatchSpec_t spec{static_cast<int>(b.T.size()), b.T.data(), b.P.empty() ? nullptr : b.P.data()};
    rc_ = attnPlanPrefill(&spec, n, &plan_);
  }
  ~Plan() {
    if (plan_) attnPlanDestroy(plan_);
  }
  attnResult_t rc() const { return rc_; }
  attnShard_t shard(int r) const {
    attnShard_t s{};
    EXPECT_EQ(attnPlanGetShard(plan_, r, &s), attnSuccess) << attnGetLastError(nullptr);
    return s;
  }

 private:
  int n_;
  attnPlan_t plan_ = nullptr;
  attnResult_t rc_ = attnSuccess;
};

// Can the new tokens' owners along one sequence be cut into 2N chunks of
// sizes floor(T/2N) or ceil(T/2N), chunk j owned by rank j (j < N) or
// 2N-1-j (j >= N)? owners[t] is the rank of new token t.
bool IsChunkedPattern(const std::vector<int>& owners, int n) {
  const int T = static_cast<int>(owners.size());
  const int lo = T / (2 * n), hi = (T + 2 * n - 1) / (2 * n);
  std::vector<std::vector<char>> reach(2 * n + 1, std::vector<char>(T + 1, 0));
  reach[0][0] = 1;
  for (int j = 0; j < 2 * n; ++j) {
    const int owner = j < n ? j : 2 * n - 1 - j;
    for (int b = 0; b <= T; ++b) {
      if (!reach[j][b]) continue;
      for (int len : {lo, hi}) {
        if (b + len > T) continue;
        bool ok = true;
        for (int t = b; t < b + len && ok; ++t) ok = owners[t] == owner;
        if (ok) reach[j + 1][b + len] = 1;
      }
    }
  }
  return reach[2 * n][T] != 0;
}

// All the structural checks of one plan.
void CheckPlan(const Batch& b, int n) {
  SCOPED_TRACE(b.Describe() + " N=" + std::to_string(n));
  Plan plan(b, n);
  ASSERT_EQ(plan.rc(), attnSuccess) << attnGetLastError(nullptr);
  const int S = static_cast<int>(b.T.size());
  std::vector<int64_t> newBase(S + 1, 0), fullBase(S + 1, 0);
  for (int s = 0; s < S; ++s) {
    newBase[s + 1] = newBase[s] + b.T[s];
    fullBase[s + 1] = fullBase[s] + b.p(s) + b.T[s];
  }
  std::vector<int> qOwner(newBase[S], -1), kvOwner(fullBase[S], -1);
  // Per rank, per sequence: query count.
  std::vector<std::vector<int64_t>> qCount(n, std::vector<int64_t>(S, 0));
  // The cached keys of a plan of a full prefill of length P.
  Batch cachedAsNew;
  for (int s = 0; s < S; ++s) cachedAsNew.T.push_back(b.p(s));
  Plan prior(cachedAsNew, n);
  ASSERT_EQ(prior.rc(), attnSuccess);

  for (int r = 0; r < n; ++r) {
    const attnShard_t sh = plan.shard(r);
    const attnSeqLayout_t& L = sh.layout;
    ASSERT_EQ(L.num_seqs, S);
    ASSERT_EQ(L.q_offsets[0], 0);
    ASSERT_EQ(L.kv_offsets[0], 0);
    ASSERT_EQ(L.q_offsets[S], sh.q_rows);
    ASSERT_EQ(L.kv_offsets[S], sh.kv_rows);
    const attnShard_t pr = prior.shard(r);
    for (int s = 0; s < S; ++s) {
      ASSERT_LE(L.q_offsets[s], L.q_offsets[s + 1]);
      ASSERT_LE(L.kv_offsets[s], L.kv_offsets[s + 1]);
      const int32_t P = b.p(s);
      std::set<int32_t> newPos;
      for (int32_t i = L.q_offsets[s]; i < L.q_offsets[s + 1]; ++i) {
        const int64_t g = sh.q_index[i];
        ASSERT_GE(g, newBase[s]) << "query row of another sequence";
        ASSERT_LT(g, newBase[s + 1]) << "query row of another sequence";
        EXPECT_EQ(L.q_pos[i], P + (g - newBase[s])) << "query position of new token " << g - newBase[s];
        EXPECT_EQ(qOwner[g], -1) << "new token " << g << " on ranks " << qOwner[g] << " and " << r;
        qOwner[g] = r;
        newPos.insert(L.q_pos[i]);
        ++qCount[r][s];
      }
      // Keys: cached ones first (where the prior prefill put them), then the
      // new tokens of this rank.
      std::vector<int32_t> cachedHere, newHere;
      bool seenNew = false;
      for (int32_t i = L.kv_offsets[s]; i < L.kv_offsets[s + 1]; ++i) {
        const int64_t g = sh.kv_index[i];
        ASSERT_GE(g, fullBase[s]) << "key row of another sequence";
        ASSERT_LT(g, fullBase[s + 1]) << "key row of another sequence";
        EXPECT_EQ(L.kv_pos[i], g - fullBase[s]) << "key position";
        EXPECT_EQ(kvOwner[g], -1) << "key " << g << " on ranks " << kvOwner[g] << " and " << r;
        kvOwner[g] = r;
        if (L.kv_pos[i] < P) {
          EXPECT_FALSE(seenNew) << "a cached key after a new one (rank " << r << ", seq " << s << ")";
          cachedHere.push_back(L.kv_pos[i]);
        } else {
          seenNew = true;
          newHere.push_back(L.kv_pos[i]);
        }
      }
      // New keys are exactly this rank's new tokens.
      EXPECT_EQ(std::set<int32_t>(newHere.begin(), newHere.end()), newPos)
          << "rank " << r << " seq " << s << ": the keys of its new tokens are not with its queries";
      // Cached keys sit where a load-balanced prefill of length P put them.
      std::set<int32_t> priorPos(pr.layout.q_pos + pr.layout.q_offsets[s],
                                 pr.layout.q_pos + pr.layout.q_offsets[s + 1]);
      EXPECT_EQ(std::set<int32_t>(cachedHere.begin(), cachedHere.end()), priorPos)
          << "rank " << r << " seq " << s << ": cached keys not where a prefill of " << P << " put them";
    }
  }
  for (size_t g = 0; g < qOwner.size(); ++g) EXPECT_NE(qOwner[g], -1) << "new token " << g << " on no rank";
  for (size_t g = 0; g < kvOwner.size(); ++g) EXPECT_NE(kvOwner[g], -1) << "key " << g << " on no rank";

  for (int s = 0; s < S; ++s) {
    std::vector<int> owners(qOwner.begin() + newBase[s], qOwner.begin() + newBase[s + 1]);
    EXPECT_TRUE(IsChunkedPattern(owners, n))
        << "seq " << s << " (T=" << b.T[s] << "): not 2N equal chunks with rank r on chunks r and 2N-1-r";
    int64_t mx = 0, mn = INT64_MAX;
    for (int r = 0; r < n; ++r) {
      mx = std::max(mx, qCount[r][s]);
      mn = std::min(mn, qCount[r][s]);
    }
    // Two chunks of sizes differing by at most one each.
    EXPECT_LE(mx - mn, 2) << "seq " << s << " T=" << b.T[s];
  }
}

TEST(PlanPrefill, ShardsAreExactAndChunked) {
  std::vector<Batch> batches = {
      {{0}, {}},         {{1}, {}},          {{2}, {}},           {{3}, {}},
      {{7}, {}},         {{16}, {}},         {{17}, {}},          {{100}, {}},
      {{37}, {0}},       {{5}, {13}},        {{0}, {9}},          {{1}, {1}},
      {{9, 0, 4, 1, 23}, {5, 9, 0, 0, 2}},   {{8, 8, 8}, {}},     {{0, 0}, {0, 0}},
      {{}, {}},
  };
  std::mt19937_64 rng(2024);
  for (int i = 0; i < 30; ++i) {
    Batch b;
    const int S = 1 + static_cast<int>(rng() % 5);
    for (int s = 0; s < S; ++s) {
      b.T.push_back(static_cast<int32_t>(rng() % 3 == 0 ? rng() % 4 : rng() % 90));
      b.P.push_back(static_cast<int32_t>(rng() % 2 ? 0 : rng() % 70));
    }
    batches.push_back(b);
  }
  for (int n : {1, 2, 3, 4, 5, 6, 7, 8, 13})
    for (const Batch& b : batches) {
      CheckPlan(b, n);
      if (HasFatalFailure()) return;
    }
}

// The header: "sequences are padded in the plan, never in the data: a rank
// may get one row fewer" -- per sequence, rank counts differ by at most one.
TEST(PlanPrefill, PerSequenceCountsDifferByAtMostOne) {
  int reported = 0;
  for (int n = 1; n <= 8; ++n)
    for (int32_t T = 0; T <= 70; ++T) {
      Batch b{{T}, {}};
      Plan plan(b, n);
      ASSERT_EQ(plan.rc(), attnSuccess);
      int64_t mx = 0, mn = INT64_MAX;
      std::string counts;
      for (int r = 0; r < n; ++r) {
        const int64_t q = plan.shard(r).q_rows;
        mx = std::max(mx, q);
        mn = std::min(mn, q);
        counts += (r ? "," : "") + std::to_string(q);
      }
      if (mx - mn > 1 && reported++ < 5)
        ADD_FAILURE() << "N=" << n << " T=" << T << ": new tokens per rank {" << counts
                      << "} differ by " << mx - mn << " (> 1)";
    }
  if (reported > 5) ADD_FAILURE() << reported << " (N, T) pairs in all";
}

// Over a fused batch the planner's chunking gives each rank a share within
// one token per sequence of the mean.
TEST(PlanPrefill, BatchTotalsBalanced) {
  std::mt19937_64 rng(7);
  for (int n : {2, 3, 4, 8})
    for (int i = 0; i < 20; ++i) {
      Batch b;
      const int S = 1 + static_cast<int>(rng() % 6);
      for (int s = 0; s < S; ++s) b.T.push_back(static_cast<int32_t>(rng() % 200));
      Plan plan(b, n);
      ASSERT_EQ(plan.rc(), attnSuccess);
      int64_t mx = 0, mn = INT64_MAX;
      for (int r = 0; r < n; ++r) {
        mx = std::max(mx, plan.shard(r).q_rows);
        mn = std::min(mn, plan.shard(r).q_rows);
      }
      EXPECT_LE(mx - mn, 2 * S) << b.Describe() << " N=" << n;
    }
}

// Causal work (sum over queries of visible keys) evens out across ranks.
TEST(PlanPrefill, CausalWorkBalanced) {
  for (int n : {2, 3, 4, 8}) {
    for (const Batch& b : {Batch{{4000}, {}}, Batch{{1000, 3001}, {2000, 0}}}) {
      Plan plan(b, n);
      ASSERT_EQ(plan.rc(), attnSuccess);
      std::vector<double> work(n, 0.0);
      for (int r = 0; r < n; ++r) {
        const attnShard_t sh = plan.shard(r);
        for (int64_t i = 0; i < sh.q_rows; ++i) work[r] += sh.layout.q_pos[i] + 1.0;
      }
      const double mx = *std::max_element(work.begin(), work.end());
      const double mn = *std::min_element(work.begin(), work.end());
      EXPECT_LE((mx - mn) / mx, 0.01) << b.Describe() << " N=" << n << ": causal work " << mn << " .. " << mx;
    }
  }
}

TEST(PlanPrefill, BadArguments) {
  std::vector<int32_t> T = {4, 5}, P = {1, -1}, Tneg = {3, -2};
  attnBatchSpec_t b{2, T.data(), nullptr};
  attnPlan_t plan = reinterpret_cast<attnPlan_t>(0x1);
  EXPECT_EQ(attnPlanPrefill(nullptr, 2, &plan), attnInvalidArgument);
  EXPECT_STRNE(attnGetLastError(nullptr), "");
  EXPECT_EQ(attnPlanPrefill(&b, 2, nullptr), attnInvalidArgument);
  EXPECT_EQ(attnPlanPrefill(&b, 0, &plan), attnInvalidArgument);
  EXPECT_EQ(attnPlanPrefill(&b, -3, &plan), attnInvalidArgument);
  attnBatchSpec_t neg{2, Tneg.data(), nullptr};
  EXPECT_EQ(attnPlanPrefill(&neg, 2, &plan), attnInvalidArgument);
  attnBatchSpec_t negP{2, T.data(), P.data()};
  EXPECT_EQ(attnPlanPrefill(&negP, 2, &plan), attnInvalidArgument);
  attnBatchSpec_t noLens{2, nullptr, nullptr};
  EXPECT_EQ(attnPlanPrefill(&noLens, 2, &plan), attnInvalidArgument);
  attnBatchSpec_t negSeqs{-1, T.data(), nullptr};
  EXPECT_EQ(attnPlanPrefill(&negSeqs, 2, &plan), attnInvalidArgument);

  ASSERT_EQ(attnPlanPrefill(&b, 3, &plan), attnSuccess);
  attnShard_t sh;
  EXPECT_EQ(attnPlanGetShard(plan, 3, &sh), attnInvalidArgument);
  EXPECT_EQ(attnPlanGetShard(plan, -1, &sh), attnInvalidArgument);
  EXPECT_EQ(attnPlanGetShard(plan, 0, nullptr), attnInvalidArgument);
  EXPECT_EQ(attnPlanGetShard(nullptr, 0, &sh), attnInvalidArgument);
  EXPECT_EQ(attnPlanDestroy(plan), attnSuccess);
  EXPECT_EQ(attnPlanDestroy(nullptr), attnSuccess);
}

TEST(PlanPrefill, EmptyBatch) {
  attnBatchSpec_t b{0, nullptr, nullptr};
  attnPlan_t plan = nullptr;
  ASSERT_EQ(attnPlanPrefill(&b, 4, &plan), attnSuccess) << attnGetLastError(nullptr);
  for (int r = 0; r < 4; ++r) {
    attnShard_t sh;
    ASSERT_EQ(attnPlanGetShard(plan, r, &sh), attnSuccess);
    EXPECT_EQ(sh.layout.num_seqs, 0);
    EXPECT_EQ(sh.q_rows, 0);
    EXPECT_EQ(sh.kv_rows, 0);
    ASSERT_NE(sh.layout.q_offsets, nullptr);
    EXPECT_EQ(sh.layout.q_offsets[0], 0);
  }
  attnPlanDestroy(plan);
}

// ---------------------------------------------------------------------------
// Decode placement.

TEST(DecodePlacement, RoundRobinShiftedByOneEachStep) {
  for (int n : {1, 2, 3, 4, 5, 8})
    for (int S : {1, 2, 3, 7, 8, 17}) {
      std::vector<int32_t> prev(S), kv(S), q(S);
      std::vector<std::vector<int64_t>> perSeqPerRank(S, std::vector<int64_t>(n, 0));
      const int steps = 3 * n + 1;
      for (int64_t step = 0; step < steps; ++step) {
        ASSERT_EQ(attnDecodePlacement(S, step, n, kv.data(), q.data()), attnSuccess);
        std::vector<int> perRank(n, 0);
        for (int s = 0; s < S; ++s) {
          ASSERT_GE(kv[s], 0);
          ASSERT_LT(kv[s], n);
          EXPECT_EQ(q[s], s % n) << "q_rank of seq " << s;
          EXPECT_EQ(kv[s], (s + step) % n) << "kv_rank of seq " << s << " step " << step;
          if (step > 0) EXPECT_EQ(kv[s], (prev[s] + 1) % n) << "not shifted by one";
          ++perRank[kv[s]];
          ++perSeqPerRank[s][kv[s]];
        }
        // Sequences of one step spread round robin: rank loads differ by <= 1.
        EXPECT_LE(*std::max_element(perRank.begin(), perRank.end()) -
                      *std::min_element(perRank.begin(), perRank.end()),
                  1);
        prev = kv;
      }
      // Each sequence fills the ranks evenly over the steps.
      for (int s = 0; s < S; ++s)
        EXPECT_LE(*std::max_element(perSeqPerRank[s].begin(), perSeqPerRank[s].end()) -
                      *std::min_element(perSeqPerRank[s].begin(), perSeqPerRank[s].end()),
                  1);
    }
}

TEST(DecodePlacement, NullOutputsAndBadArguments) {
  std::vector<int32_t> kv(4, -7), q(4, -7);
  EXPECT_EQ(attnDecodePlacement(4, 2, 3, nullptr, q.data()), attnSuccess);
  EXPECT_EQ(q, (std::vector<int32_t>{0, 1, 2, 0}));
  EXPECT_EQ(attnDecodePlacement(4, 2, 3, kv.data(), nullptr), attnSuccess);
  EXPECT_EQ(kv, (std::vector<int32_t>{2, 0, 1, 2}));
  EXPECT_EQ(attnDecodePlacement(4, 2, 3, nullptr, nullptr), attnSuccess);
  EXPECT_EQ(attnDecodePlacement(0, 5, 3, kv.data(), q.data()), attnSuccess);
  // Large step numbers do not overflow.
  EXPECT_EQ(attnDecodePlacement(4, int64_t(1) << 40, 3, kv.data(), nullptr), attnSuccess);
  for (int s = 0; s < 4; ++s) EXPECT_EQ(kv[s], ((int64_t(1) << 40) + s) % 3);
  EXPECT_EQ(attnDecodePlacement(4, 0, 0, kv.data(), q.data()), attnInvalidArgument);
  EXPECT_STRNE(attnGetLastError(nullptr), "");
  EXPECT_EQ(attnDecodePlacement(-1, 0, 2, kv.data(), q.data()), attnInvalidArgument);
  EXPECT_EQ(attnDecodePlacement(4, -1, 2, kv.data(), q.data()), attnInvalidArgument);
}

// ---------------------------------------------------------------------------
// End to end: the plan's shards (layout straight from attnPlanGetShard)
// through attnRingAttention, then a few decode steps, equal to the reference.

TEST(PlanEndToEnd, PlannedShardsGiveExactAttention) {
  const int n = 4;
  attnAttnConfig_t cfg = ATTN_ATTN_CONFIG_INITIALIZER;
  cfg.num_q_heads = 8;
  cfg.num_kv_heads = 2;
  cfg.head_dim = 16;
  cfg.dtype = attnFloat32;
  cfg.causal = 1;
  std::vector<int32_t> T = {21, 3, 0, 40}, P = {0, 11, 6, 17};
  AttnCase c = MakeCase("planned", PrefillSpec(cfg, T, P), 4242);
  attnBatchSpec_t spec{4, T.data(), P.data()};
  attnPlan_t plan = nullptr;
  ASSERT_EQ(attnPlanPrefill(&spec, n, &plan), attnSuccess);
  RunThreads(n, [&](int rank, int, attnComm_t& comm) {
    attnShard_t sh;
    ASSERT_EQ(attnPlanGetShard(plan, rank, &sh), attnSuccess);
    // Gather by index and use the plan's own layout.
    Placement pl;
    pl.nranks = n;
    pl.q_rows.resize(n);
    pl.kv_rows.resize(n);
    pl.q_rows[rank].assign(sh.q_index, sh.q_index + sh.q_rows);
    pl.kv_rows[rank].assign(sh.kv_index, sh.kv_index + sh.kv_rows);
    RankShard mine = GatherShard(c, pl, rank);
    for (attnAttnMode_t m : kAllModes) {
      std::vector<float> out(sh.q_rows * cfg.num_q_heads * cfg.head_dim, -1.0f);
      std::vector<float> lse(sh.q_rows * cfg.num_q_heads, 0.0f);
      ATTN_ASSERT_OK(comm, attnRingAttention(mine.q.data(), mine.k.data(), mine.v.data(), out.data(),
                                             lse.data(), &sh.layout, &cfg, m, comm, nullptr));
      EXPECT_TRUE(WithinBounds(CompareShard(c, mine, out.data(), lse.data()), cfg.dtype,
                               std::string("planned shards, ") + ModeName(m) + ", rank " +
                                   std::to_string(rank)));
    }
  }, RunOptions{});
  attnPlanDestroy(plan);
}

}  // namespace
}  // namespace attn_test
