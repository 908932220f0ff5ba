// Mode selection (CP paper Alg. 1, App. C): attnEstimateModes on the paper's
// Table 4 setting, attnSelectMode as a collective (the same answer on every
// rank, the mode attnModeAuto then runs), the cost model's get/set, and bad
// arguments.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "attncomm.h"
#include "src/attn/attn_state.h"
#include "src/core/comm.h"
#include "tests/support/attn_fixtures.h"
#include "tests/support/multirank.h"

namespace attn_test {
namespace {

attnAttnConfig_t Llama405B() {
  // Per CP rank: 128 query heads, 8 KV heads, head_dim 128, bf16, causal.
  attnAttnConfig_t c = ATTN_ATTN_CONFIG_INITIALIZER;
  c.num_q_heads = 128;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.dtype = attnBfloat16;
  c.causal = 1;
  return c;
}

attnCostModel_t H100Model() {
  attnCostModel_t m{};
  m.link_bandwidth_GBps = 50.0;  // 400 Gb/s
  m.link_latency_us = 10.0;
  m.attn_tflops = 989.0;  // H100 bf16 dense peak
  return m;
}

// ---------------------------------------------------------------------------
// The CP paper's Table 4: Llama3-405B, CP4, T+P = 128000, varying miss rate.

struct Table4Row {
  double miss;
  attnAttnMode_t expect;  // attnModeAuto: not asserted (the crossover)
};

TEST(EstimateModes, CpPaperTable4) {
  const attnAttnConfig_t cfg = Llama405B();
  const attnCostModel_t model = H100Model();
  const int n = 4;
  const int64_t total = 128000;
  const Table4Row rows[] = {{0.01, attnModePassQ},   {0.025, attnModePassQ}, {0.05, attnModeAuto},
                            {0.10, attnModePassKV},  {0.125, attnModePassKV}, {0.25, attnModePassKV},
                            {0.50, attnModePassKV},  {1.00, attnModePassKV}};
  for (const Table4Row& row : rows) {
    const int64_t T = static_cast<int64_t>(std::llround(total * row.miss));
    const int64_t P = total - T;
    attnModeEstimate_t est;
    std::memset(&est, 0xAB, sizeof(est));
    ASSERT_EQ(attnEstimateModes(&model, &cfg, n, T, P, &est), attnSuccess) << attnGetLastError(nullptr);
    std::printf("[ table4 ] miss %5.1f%% T=%6lld: pass-KV %9.1f us, pass-Q %9.1f us, ship-Q %9.1f us,"
                " heads %9.1f us, all-gather KV %9.1f us -> %s (Alg.1: %s, threshold %.0f tokens)\n",
                100 * row.miss, (long long)T, est.pass_kv_us, est.pass_q_us, est.ship_q_us, est.head_parallel_us,
                est.all_gather_kv_us, ModeName(est.chosen), ModeName(est.alg1_choice), est.alg1_threshold_tokens);
    EXPECT_TRUE(std::isfinite(est.pass_kv_us) && est.pass_kv_us > 0);
    EXPECT_TRUE(std::isfinite(est.pass_q_us) && est.pass_q_us > 0);
    EXPECT_TRUE(std::isfinite(est.ship_q_us) && est.ship_q_us > 0);
    // Prefill (T >> num_seqs * N): ship-Q is no candidate.
    EXPECT_NE(est.chosen, attnModeShipQ) << "miss " << row.miss;
    EXPECT_NE(est.chosen, attnModeAuto) << "chosen must be a concrete mode";
    EXPECT_TRUE(std::isfinite(est.head_parallel_us) && est.head_parallel_us > 0);
    // The choice is the cheapest prediction.
    EXPECT_TRUE(std::isfinite(est.all_gather_kv_us) && est.all_gather_kv_us > 0);
    const double best = std::min({est.pass_kv_us, est.pass_q_us, est.head_parallel_us, est.all_gather_kv_us});
    if (est.chosen == attnModePassKV) EXPECT_EQ(est.pass_kv_us, best);
    if (est.chosen == attnModePassQ) EXPECT_EQ(est.pass_q_us, best);
    if (est.chosen == attnModeHeadParallel) EXPECT_EQ(est.head_parallel_us, best);
    if (est.chosen == attnModeAllGatherKV) EXPECT_EQ(est.all_gather_kv_us, best);
    if (row.expect != attnModeAuto) {
      // The paper measured the two rings; of those, the model must prefer
      // the one it measured faster (head-parallel may beat both: the paper
      // did not run it; all-gather KV is pass-KV's bytes in one hop).
      const attnAttnMode_t ring = est.pass_kv_us <= est.pass_q_us ? attnModePassKV : attnModePassQ;
      EXPECT_EQ(ring, row.expect)
          << "miss rate " << row.miss << ": the paper measured " << ModeName(row.expect) << " faster";
      if (est.chosen == attnModeAllGatherKV) EXPECT_EQ(row.expect, attnModePassKV);
      else if (est.chosen != attnModeHeadParallel) EXPECT_EQ(est.chosen, row.expect);
      EXPECT_EQ(est.alg1_choice, row.expect) << "Alg. 1 at miss rate " << row.miss;
    }
    // Eq. 2's threshold: N * C * Hkv * e / (2 * Hq * BW).
    const double expectThreshold = n * model.attn_tflops * 1e12 * cfg.num_kv_heads * 2.0 /
                                   (2.0 * cfg.num_q_heads * model.link_bandwidth_GBps * 1e9);
    EXPECT_NEAR(est.alg1_threshold_tokens, expectThreshold, 1e-6 * expectThreshold);
  }
}

// Predicted times move the right way with the rates.
TEST(EstimateModes, MonotoneInRates) {
  const attnAttnConfig_t cfg = Llama405B();
  attnCostModel_t m = H100Model();
  attnModeEstimate_t a, b;
  ASSERT_EQ(attnEstimateModes(&m, &cfg, 4, 12800, 115200, &a), attnSuccess);
  m.link_bandwidth_GBps *= 4;
  ASSERT_EQ(attnEstimateModes(&m, &cfg, 4, 12800, 115200, &b), attnSuccess);
  EXPECT_LE(b.pass_kv_us, a.pass_kv_us);
  EXPECT_LE(b.pass_q_us, a.pass_q_us);
  m = H100Model();
  m.attn_tflops /= 4;
  ASSERT_EQ(attnEstimateModes(&m, &cfg, 4, 12800, 115200, &b), attnSuccess);
  EXPECT_GE(b.pass_kv_us, a.pass_kv_us);
  EXPECT_GE(b.pass_q_us, a.pass_q_us);
  // One rank: nothing moves, every mode costs the same.
  ASSERT_EQ(attnEstimateModes(&m, &cfg, 1, 1000, 5000, &b), attnSuccess);
  EXPECT_DOUBLE_EQ(b.pass_kv_us, b.pass_q_us);
}

// comm_interference: when a transfer takes the kernel's cores, overlap hides
// nothing and the mode that moves fewer bytes wins, even where the paper's
// max() model calls the two a tie (both compute-bound).
TEST(EstimateModes, InterferenceChargesTheBytesThatMove) {
  const attnAttnConfig_t cfg = ATTN_ATTN_CONFIG(8, 2, 64, attnFloat32, 0.0f, 1);  // GQA 8/2, causal
  // Host copies between threads and the CPU kernel; no interference yet.
  attnCostModel_t m{1.5, 5.0, 0.04, 0.0};
  const int n = 4;
  const int64_t total = 4096;
  // 32 new tokens: both modes are compute-bound under max().
  attnModeEstimate_t overlap, shared;
  ASSERT_EQ(attnEstimateModes(&m, &cfg, n, 32, total - 32, &overlap), attnSuccess);
  m.comm_interference = 1.0;
  ASSERT_EQ(attnEstimateModes(&m, &cfg, n, 32, total - 32, &shared), attnSuccess);
  EXPECT_GT(shared.pass_kv_us, overlap.pass_kv_us);
  EXPECT_GT(shared.pass_q_us, overlap.pass_q_us);
  // Q moves (8 query rows against 1024 KV rows per step), in one hop: the
  // queries and partials of 32 rows are small enough to hold at once.
  EXPECT_EQ(shared.chosen, attnModeShipQ) << "ship-Q moves 8 query rows, pass-KV 1024 KV rows per step";
  EXPECT_LT(shared.pass_q_us, shared.pass_kv_us);
  // Full prefill: a KV block (2 heads) is smaller than a query block plus
  // its partial (8 heads): KV moves, in one hop (all-gather KV) as the
  // ring's per-step latency is charged in full here.
  ASSERT_EQ(attnEstimateModes(&m, &cfg, n, total, 0, &shared), attnSuccess);
  EXPECT_EQ(shared.chosen, attnModeAllGatherKV);
  EXPECT_LT(shared.pass_kv_us, shared.pass_q_us);
  // Alg. 1 / Alg. 5 stay the paper's, whatever beta.
  attnModeEstimate_t a, b;
  m.comm_interference = 0;
  ASSERT_EQ(attnEstimateModes(&m, &cfg, n, 512, total - 512, &a), attnSuccess);
  m.comm_interference = 1;
  ASSERT_EQ(attnEstimateModes(&m, &cfg, n, 512, total - 512, &b), attnSuccess);
  EXPECT_EQ(a.alg1_choice, b.alg1_choice);
  EXPECT_DOUBLE_EQ(a.alg1_threshold_tokens, b.alg1_threshold_tokens);
}

// All-gather KV moves what pass-KV moves, in one hop: the same prediction
// on two ranks (where it is the same exchange, and pass-KV keeps the tie),
// one latency per ring step less on more. Where Q is what should move
// (decode, low miss rates) it is never the choice.
TEST(EstimateModes, AllGatherKvSavesTheRingsLatencies) {
  const attnAttnConfig_t cfg = ATTN_ATTN_CONFIG(8, 2, 64, attnFloat32, 0.0f, 1);
  for (const double beta : {0.0, 1.0}) {
    SCOPED_TRACE(beta);
    const attnCostModel_t m{1.5, 5.0, 0.04, beta};
    attnModeEstimate_t e;
    ASSERT_EQ(attnEstimateModes(&m, &cfg, 1, 4096, 0, &e), attnSuccess);
    EXPECT_EQ(e.all_gather_kv_us, e.pass_kv_us);
    EXPECT_NE(e.chosen, attnModeAllGatherKV);
    ASSERT_EQ(attnEstimateModes(&m, &cfg, 2, 4096, 0, &e), attnSuccess);
    EXPECT_EQ(e.all_gather_kv_us, e.pass_kv_us);
    EXPECT_NE(e.chosen, attnModeAllGatherKV) << "a tie at N = 2 stays pass-KV";
    for (int n : {3, 4, 8}) {
      ASSERT_EQ(attnEstimateModes(&m, &cfg, n, 4096, 0, &e), attnSuccess);
      EXPECT_LE(e.all_gather_kv_us, e.pass_kv_us) << n;
      EXPECT_GE(e.pass_kv_us - e.all_gather_kv_us, beta * (n - 2) * m.link_latency_us * (1 - 1e-9)) << n;
      if (beta > 0) EXPECT_EQ(e.chosen, attnModeAllGatherKV) << n;
    }
    // Decode: one query row against 4K cached keys.
    const attnCostModel_t slow{0.01, 50.0, 1000.0, beta};
    ASSERT_EQ(attnEstimateModes(&slow, &cfg, 4, 4, 4092, &e), attnSuccess);
    EXPECT_EQ(e.chosen, attnModeShipQ);
    EXPECT_GT(e.all_gather_kv_us, e.ship_q_us);
    // Low miss rate on slow links: Q moves, in one hop (ship-Q).
    ASSERT_EQ(attnEstimateModes(&slow, &cfg, 4, 64, 4032, &e), attnSuccess);
    EXPECT_EQ(e.chosen, attnModeShipQ);
    EXPECT_LT(e.pass_q_us, e.all_gather_kv_us);
    // The same miss rate over 200K new tokens: every peer's queries and
    // partials (3 x 50K rows x 4 KB) would not fit at once: the ring.
    ASSERT_EQ(attnEstimateModes(&slow, &cfg, 4, 200000, 12600000, &e), attnSuccess);
    EXPECT_LT(e.ship_q_us, e.pass_q_us);
    EXPECT_EQ(e.chosen, attnModePassQ);
  }
}

TEST(EstimateModes, BadArguments) {
  const attnAttnConfig_t cfg = Llama405B();
  const attnCostModel_t m = H100Model();
  attnModeEstimate_t est;
  EXPECT_EQ(attnEstimateModes(nullptr, &cfg, 4, 10, 10, &est), attnInvalidArgument);
  EXPECT_STRNE(attnGetLastError(nullptr), "");
  EXPECT_EQ(attnEstimateModes(&m, nullptr, 4, 10, 10, &est), attnInvalidArgument);
  EXPECT_EQ(attnEstimateModes(&m, &cfg, 4, 10, 10, nullptr), attnInvalidArgument);
  EXPECT_EQ(attnEstimateModes(&m, &cfg, 0, 10, 10, &est), attnInvalidArgument);
  EXPECT_EQ(attnEstimateModes(&m, &cfg, 4, -1, 10, &est), attnInvalidArgument);
  EXPECT_EQ(attnEstimateModes(&m, &cfg, 4, 10, -1, &est), attnInvalidArgument);
  attnCostModel_t bad = m;
  bad.link_bandwidth_GBps = 0;
  EXPECT_EQ(attnEstimateModes(&bad, &cfg, 4, 10, 10, &est), attnInvalidArgument);
  bad = m;
  bad.attn_tflops = -1;
  EXPECT_EQ(attnEstimateModes(&bad, &cfg, 4, 10, 10, &est), attnInvalidArgument);
  bad = m;
  bad.link_latency_us = -1;
  EXPECT_EQ(attnEstimateModes(&bad, &cfg, 4, 10, 10, &est), attnInvalidArgument);
  for (double beta : {-0.1, 1.5, std::nan("")}) {
    bad = m;
    bad.comm_interference = beta;
    EXPECT_EQ(attnEstimateModes(&bad, &cfg, 4, 10, 10, &est), attnInvalidArgument) << beta;
    EXPECT_NE(std::strstr(attnGetLastError(nullptr), "interference"), nullptr) << attnGetLastError(nullptr);
  }
  attnAttnConfig_t c2 = cfg;
  c2.num_kv_heads = 3;
  EXPECT_EQ(attnEstimateModes(&m, &c2, 4, 10, 10, &est), attnInvalidArgument);
  c2 = cfg;
  c2.dtype = attnInt8;
  EXPECT_EQ(attnEstimateModes(&m, &c2, 4, 10, 10, &est), attnInvalidArgument);
}

// ---------------------------------------------------------------------------
// attnSelectMode: collective and deterministic; auto runs what it says.

attnAttnMode_t LastModeRun(attnComm_t comm) { return attn::attnStateOf(comm).last.mode; }

struct SelectCase {
  std::shared_ptr<const AttnCase> c;
  Placement pl;
};

// Each rank selects for its own (different) shard; every rank must get the
// same estimate, bit for bit; then auto must run that mode and be exact.
void SelectAndRun(const std::vector<SelectCase>& cases, int rank, int n, attnComm_t comm,
                  std::vector<std::vector<attnModeEstimate_t>>* got, std::mutex* mu,
                  std::vector<attnAttnMode_t>* ran) {
  for (size_t i = 0; i < cases.size(); ++i) {
    RankShard sh = GatherShard(*cases[i].c, cases[i].pl, rank);
    attnModeEstimate_t est;
    std::memset(&est, 0, sizeof(est));
    ATTN_ASSERT_OK(comm, attnSelectMode(&sh.layout, &cases[i].c->cfg, comm, &est));
    ExpectRingAttentionExact(*cases[i].c, cases[i].pl, rank, comm, attnModeAuto, true, "auto after select");
    std::lock_guard<std::mutex> g(*mu);
    (*got)[i][rank] = est;
    (*ran)[i * n + rank] = LastModeRun(comm);
  }
}

void CheckSameEverywhere(const std::vector<SelectCase>& cases, int n,
                         const std::vector<std::vector<attnModeEstimate_t>>& got,
                         const std::vector<attnAttnMode_t>& ran) {
  for (size_t i = 0; i < cases.size(); ++i)
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(0, std::memcmp(&got[i][r], &got[i][0], sizeof(attnModeEstimate_t)))
          << cases[i].c->name << ": rank " << r << " got another estimate than rank 0 ("
          << ModeName(got[i][r].chosen) << " vs " << ModeName(got[i][0].chosen) << ")";
      EXPECT_EQ(ran[i * n + r], got[i][0].chosen)
          << cases[i].c->name << ": auto ran " << ModeName(ran[i * n + r]) << " on rank " << r
          << " but attnSelectMode said " << ModeName(got[i][0].chosen);
    }
}

std::vector<SelectCase> SelectCases(int n) {
  std::vector<SelectCase> cs;
  attnAttnConfig_t cfg = ATTN_ATTN_CONFIG_INITIALIZER;
  cfg.num_q_heads = 16;
  cfg.num_kv_heads = 2;
  cfg.head_dim = 32;
  cfg.dtype = attnBfloat16;
  cfg.causal = 1;
  {  // prefill, high miss rate
    std::vector<int32_t> T = {96, 33}, P = {0, 10};
    auto c = std::make_shared<AttnCase>(MakeCase("select prefill", PrefillSpec(cfg, T, P), 1));
    cs.push_back({c, PlannerPlacement(*c, T, P, n)});
  }
  {  // low miss rate, uneven random placement
    std::vector<int32_t> T = {5}, P = {300};
    auto c = std::make_shared<AttnCase>(MakeCase("select low miss", PrefillSpec(cfg, T, P), 2));
    cs.push_back({c, RandomPlacement(*c, n, 3, -1)});
  }
  {  // decode: one query per sequence over a long cache
    AttnProblemSpec spec;
    spec.cfg = cfg;
    for (int s = 0; s < 5; ++s) {
      spec.q_pos.push_back({400 + s});
      spec.kv_pos.emplace_back();
      for (int p = 0; p <= 400 + s; ++p) spec.kv_pos.back().push_back(p);
    }
    auto c = std::make_shared<AttnCase>(MakeCase("select decode", spec, 4));
    cs.push_back({c, RandomPlacement(*c, n, 5, -1)});
  }
  {  // prefill without GQA (8 KV heads): moving KV around the ring costs
     // twice Q's bytes per step
    attnAttnConfig_t mha = cfg;
    mha.num_q_heads = mha.num_kv_heads = 8;
    std::vector<int32_t> T = {120}, P = {0};
    auto c = std::make_shared<AttnCase>(MakeCase("select MHA prefill", PrefillSpec(mha, T, P), 6));
    cs.push_back({c, PlannerPlacement(*c, T, P, n)});
  }
  return cs;
}

TEST(SelectMode, SameAnswerOnEveryRankCalibratedThreads) {
  const int n = 4;
  auto cases = SelectCases(n);
  std::vector<std::vector<attnModeEstimate_t>> got(cases.size(), std::vector<attnModeEstimate_t>(n));
  std::vector<attnAttnMode_t> ran(cases.size() * n, attnModeAuto);
  std::mutex mu;
  RunThreads(n, [&](int rank, int, attnComm_t& comm) {
    SelectAndRun(cases, rank, n, comm, &got, &mu, &ran);
    attnCostModel_t m;
    ATTN_ASSERT_OK(comm, attnCommGetCostModel(comm, &m));
    EXPECT_GT(m.link_bandwidth_GBps, 0);
    EXPECT_GE(m.link_latency_us, 0);
    EXPECT_GT(m.attn_tflops, 0);
    EXPECT_TRUE(std::isfinite(m.link_bandwidth_GBps) && std::isfinite(m.attn_tflops));
    EXPECT_GE(m.comm_interference, 0.0);  // measured, agreed by all ranks
    EXPECT_LE(m.comm_interference, 1.0);
  });
  CheckSameEverywhere(cases, n, got, ran);
}

TEST(SelectMode, SameAnswerOnEveryRankProcesses) {
  const int n = 3;
  auto cases = SelectCases(n);
  // Children check against each other through shared memory.
  const size_t words = sizeof(attnModeEstimate_t) / sizeof(int64_t) + 1;
  SharedCounters shared(cases.size() * n * (words + 1));
  RunProcesses(n, [&](int rank, int, attnComm_t& comm) {
    for (size_t i = 0; i < cases.size(); ++i) {
      RankShard sh = GatherShard(*cases[i].c, cases[i].pl, rank);
      attnModeEstimate_t est;
      std::memset(&est, 0, sizeof(est));
      ATTN_ASSERT_OK(comm, attnSelectMode(&sh.layout, &cases[i].c->cfg, comm, &est));
      ExpectRingAttentionExact(*cases[i].c, cases[i].pl, rank, comm, attnModeAuto, true, "auto (processes)");
      int64_t buf[words + 1];
      std::memset(buf, 0, sizeof(buf));
      std::memcpy(buf, &est, sizeof(est));
      buf[words] = LastModeRun(comm);
      for (size_t w = 0; w <= words; ++w) shared[(i * n + rank) * (words + 1) + w].store(buf[w]);
    }
    ATTN_ASSERT_OK(comm, attnBarrier(comm, nullptr));
    for (size_t i = 0; i < cases.size(); ++i)
      for (size_t w = 0; w <= words; ++w)
        EXPECT_EQ(shared[(i * n + rank) * (words + 1) + w].load(), shared[(i * n + 0) * (words + 1) + w].load())
            << cases[i].c->name << ": rank " << rank << " differs from rank 0 in word " << w
            << (w == words ? " (the mode auto ran)" : " of the estimate");
    // What auto ran is what attnSelectMode said.
    for (size_t i = 0; i < cases.size(); ++i) {
      attnModeEstimate_t est;
      int64_t buf[words + 1];
      for (size_t w = 0; w <= words; ++w) buf[w] = shared[(i * n + rank) * (words + 1) + w].load();
      std::memcpy(&est, buf, sizeof(est));
      EXPECT_EQ(buf[words], est.chosen) << cases[i].c->name;
    }
  });
}

// With rates set by hand, each mode can be made the winner, and auto follows.
TEST(SelectMode, OverriddenModelDrivesAuto) {
  const int n = 4;
  auto cases = SelectCases(n);
  struct Scenario {
    const char* what;
    attnCostModel_t model;
    size_t caseIndex;
    attnAttnMode_t expect;
  };
  // Fast links, slow compute: communication hides, pass-KV (no all-to-all).
  // Slow links, fast compute, low miss rate: Q is smaller than KV, so Q
  // moves; in one hop (ship-Q: the queries and partials of a short prefill
  // fit in memory) rather than around the ring, which adds latencies.
  // Decode with little compute and slow links: one hop (ship-Q) beats the
  // ring of Q blocks by two message latencies and moves far less than KV.
  // Full prefill without GQA, slow links, fast compute: head-parallel sends
  // (N-1)/N of Q, K, V and O, the ring N-1 KV blocks.
  const Scenario scenarios[] = {
      {"prefill, fast links", {1000.0, 1.0, 0.001}, 0, attnModePassKV},
      {"low miss, slow links", {0.01, 1.0, 1000.0}, 1, attnModeShipQ},
      {"decode, slow links", {0.01, 50.0, 1000.0}, 2, attnModeShipQ},
      {"MHA prefill, slow links", {0.01, 1.0, 1000.0}, 3, attnModeHeadParallel},
  };
  std::vector<attnAttnMode_t> ran(std::size(scenarios) * n, attnModeAuto);
  std::vector<attnModeEstimate_t> est0(std::size(scenarios));
  std::mutex mu;
  RunThreads(n, [&](int rank, int, attnComm_t& comm) {
    for (size_t i = 0; i < std::size(scenarios); ++i) {
      const Scenario& s = scenarios[i];
      ATTN_ASSERT_OK(comm, attnCommSetCostModel(comm, &s.model));
      attnCostModel_t back;
      ATTN_ASSERT_OK(comm, attnCommGetCostModel(comm, &back));
      EXPECT_EQ(back.link_bandwidth_GBps, s.model.link_bandwidth_GBps);
      EXPECT_EQ(back.link_latency_us, s.model.link_latency_us);
      EXPECT_EQ(back.attn_tflops, s.model.attn_tflops);
      const SelectCase& c = cases[s.caseIndex];
      RankShard sh = GatherShard(*c.c, c.pl, rank);
      attnModeEstimate_t est;
      ATTN_ASSERT_OK(comm, attnSelectMode(&sh.layout, &c.c->cfg, comm, &est));
      EXPECT_EQ(est.chosen, s.expect) << s.what << ": pass-KV " << est.pass_kv_us << " us, pass-Q "
                                      << est.pass_q_us << " us, ship-Q " << est.ship_q_us
                                      << " us, heads " << est.head_parallel_us << " us";
      ExpectRingAttentionExact(*c.c, c.pl, rank, comm, attnModeAuto, true, s.what);
      std::lock_guard<std::mutex> g(mu);
      ran[i * n + rank] = LastModeRun(comm);
      if (rank == 0) est0[i] = est;
    }
    // NULL goes back to the calibrated rates.
    ATTN_ASSERT_OK(comm, attnCommSetCostModel(comm, nullptr));
    attnCostModel_t m;
    ATTN_ASSERT_OK(comm, attnCommGetCostModel(comm, &m));
    EXPECT_NE(m.link_latency_us, 50.0) << "NULL did not restore the calibrated model";
  });
  for (size_t i = 0; i < std::size(scenarios); ++i)
    for (int r = 0; r < n; ++r)
      EXPECT_EQ(ran[i * n + r], scenarios[i].expect) << scenarios[i].what << ", rank " << r;
}

TEST(SelectMode, BadArguments) {
  RunThreads(2, [&](int rank, int, attnComm_t& comm) {
    attnAttnConfig_t cfg = Llama405B();
    std::vector<int32_t> off{0, 0};
    attnSeqLayout_t lay{1, off.data(), nullptr, off.data(), nullptr};
    attnModeEstimate_t est;
    EXPECT_EQ(attnSelectMode(nullptr, &cfg, comm, &est), attnInvalidArgument);
    EXPECT_STRNE(attnGetLastError(comm), "");
    EXPECT_EQ(attnSelectMode(&lay, nullptr, comm, &est), attnInvalidArgument);
    EXPECT_EQ(attnSelectMode(&lay, &cfg, comm, nullptr), attnInvalidArgument);
    attnAttnConfig_t bad = cfg;
    bad.head_dim = 300;
    EXPECT_EQ(attnSelectMode(&lay, &bad, comm, &est), attnInvalidArgument);
    attnCostModel_t m = H100Model();
    m.link_bandwidth_GBps = 0;
    EXPECT_EQ(attnCommSetCostModel(comm, &m), attnInvalidArgument);
    m = H100Model();
    m.attn_tflops = -5;
    EXPECT_EQ(attnCommSetCostModel(comm, &m), attnInvalidArgument);
    m = H100Model();
    m.comm_interference = 2;
    EXPECT_EQ(attnCommSetCostModel(comm, &m), attnInvalidArgument);
    EXPECT_EQ(attnCommGetCostModel(comm, nullptr), attnInvalidArgument);
    // Still collective-safe after local errors: a valid select works.
    ATTN_EXPECT_OK(comm, attnSelectMode(&lay, &cfg, comm, &est));
    (void)rank;
  });
}

// The ATTN_MODEL_* variables override the calibrated rates field by field.
TEST(SelectMode, EnvironmentOverridesRates) {
  RunOptions o;
  o.env = {{"ATTN_MODEL_BW_GBPS", "12.5"},
           {"ATTN_MODEL_LAT_US", "7"},
           {"ATTN_MODEL_TFLOPS", "3"},
           {"ATTN_MODEL_INTERFERENCE", "0.25"}};
  RunProcesses(2, [&](int, int, attnComm_t& comm) {
    attnCostModel_t m;
    ATTN_ASSERT_OK(comm, attnCommGetCostModel(comm, &m));
    EXPECT_DOUBLE_EQ(m.link_bandwidth_GBps, 12.5);
    EXPECT_DOUBLE_EQ(m.link_latency_us, 7.0);
    EXPECT_DOUBLE_EQ(m.attn_tflops, 3.0);
    EXPECT_DOUBLE_EQ(m.comm_interference, 0.25);
  }, o);
}

// An out-of-range variable is refused with a message naming it, not used.
TEST(SelectMode, EnvironmentOutOfRangeIsRefused) {
  RunOptions o;
  o.env = {{"ATTN_MODEL_INTERFERENCE", "3"}};
  RunProcesses(2, [&](int, int, attnComm_t& comm) {
    attnCostModel_t m;
    EXPECT_EQ(attnCommGetCostModel(comm, &m), attnInvalidArgument);
    EXPECT_NE(std::strstr(attnGetLastError(comm), "ATTN_MODEL_"), nullptr) << attnGetLastError(comm);
  }, o);
}

// Ranks whose rates differ (ATTN_MODEL_* set differently per process, as a
// launcher may do by mistake, or attnCommSetCostModel with other values):
// attnSelectMode is documented to give every rank the same answer, and auto
// must not run different algorithms on different ranks.
TEST(SelectMode, PerRankOverridesStillAgree) {
  const int n = 3;
  auto cases = SelectCases(n);
  const SelectCase& c = cases[1];  // low miss rate: the rates decide
  attnConfig_t ccfg = ATTN_CONFIG_INITIALIZER;
  ccfg.timeout_ms = 5000;
  RunOptions o;
  o.config = &ccfg;
  o.deadline_ms = 60000;
  o.child_setup = [](int rank) {
    if (rank == 0) {
      setenv("ATTN_MODEL_TFLOPS", "1e-6", 1);  // compute dominates: pass-KV
    } else {
      setenv("ATTN_MODEL_BW_GBPS", "1e-6", 1);  // the link dominates: pass-Q
      setenv("ATTN_MODEL_TFLOPS", "1e6", 1);
    }
  };
  const size_t slots = 2;
  SharedCounters shared(n * slots);
  auto results = RunProcessesCollect(n, [&](int rank, int, attnComm_t& comm) {
    RankShard sh = GatherShard(*c.c, c.pl, rank);
    attnModeEstimate_t est;
    ATTN_ASSERT_OK(comm, attnSelectMode(&sh.layout, &c.c->cfg, comm, &est));
    shared[rank * slots].store(est.chosen);
    RankRun run = RunRingAttentionRank(*c.c, c.pl, rank, comm, attnModeAuto, true);
    shared[rank * slots + 1].store(run.rc);
    if (run.rc != attnSuccess) std::printf("[ per-rank rates ] rank %d: %s\n", rank, run.error.c_str());
    if (run.rc == attnSuccess)
      EXPECT_TRUE(WithinBounds(run.stats, c.c->cfg.dtype, "auto with per-rank rates"));
  }, o);
  for (int r = 0; r < n; ++r) {
    std::printf("[ per-rank rates ] rank %d: attnSelectMode -> %s, auto -> %s\n", r,
                ModeName(static_cast<attnAttnMode_t>(shared[r * slots].load())),
                ResultName(static_cast<attnResult_t>(shared[r * slots + 1].load())));
    EXPECT_EQ(shared[r * slots].load(), shared[0].load())
        << "rank " << r << " and rank 0 got different answers from attnSelectMode";
    EXPECT_EQ(shared[r * slots + 1].load(), attnSuccess)
        << "rank " << r << ": auto failed although every rank made the same call";
  }
  for (const auto& r : results)
    if (!r.passed()) std::printf("[ per-rank rates ] %s\n", r.Describe().c_str());
}

}  // namespace
}  // namespace attn_test
