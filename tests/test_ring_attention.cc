// attnRingAttention against exact attention in double precision on the
// unsharded input (DESIGN.md §4), in every mode (pass-KV, pass-Q, ship-Q,
// head-parallel, all-gather KV, auto), on ranks as threads and as processes:
//   - full prefill, partial prefill with cached keys, fused batches with
//     unequal and zero lengths (T = 0, P = 0), decode steps (one query row per
//     sequence, KV spread by attnDecodePlacement over several steps), tokens
//     placed on ranks arbitrarily (a rank holding nothing at all), fully
//     masked rows (out = 0, lse = -inf, no NaN);
//   - N in {1, 2, 3, 4, 5, 8}, GQA ratios 1/4/8/16, causal and not, fp32 and
//     bf16, with and without lse;
//   - bf16 error at N = 8 no worse than 1.5x the error at N = 1;
//   - attnMergeAttnStates over a partition of the keys;
//   - a user kernel through attnCommSetAttnKernel (and NULL restoring the
//     built-in);
//   - bad input: clear errors, on every rank, no hang.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "attncomm.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/reference_attention.h"
#include "tests/support/attn_fixtures.h"
#include "tests/support/multirank.h"

namespace attn_test {
namespace {

// The head shapes of the sweep: GQA ratios 1, 4, 8, 16, small dims (odd
// ones included) so the sweep stays fast.
struct HeadShape {
  int hq, hkv, d;
  float scale;
};
constexpr HeadShape kHeadShapes[] = {{2, 2, 16, 0.0f}, {8, 2, 12, 0.0f}, {8, 1, 8, 0.35f},
                                     {16, 1, 4, 0.0f}};

std::vector<attnAttnConfig_t> AllSweepConfigs() {
  std::vector<attnAttnConfig_t> out;
  for (const HeadShape& h : kHeadShapes)
    for (int causal = 0; causal < 2; ++causal)
      for (attnDataType_t t : {attnFloat32, attnBfloat16})
        out.push_back(AttnCfg(h.hq, h.hkv, h.d, t, causal != 0, h.scale));
  return out;
}

// One attnRingAttention call of a sweep: every rank runs the jobs in the
// same order.
struct Job {
  std::shared_ptr<const AttnCase> c;
  Placement pl;
  attnAttnMode_t mode;
  bool lse;
};

uint64_t Mix(uint64_t a, uint64_t b) {
  uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E5Bull + (a << 6) + (a >> 2));
  x ^= x >> 31;
  return x * 0xBF58476D1CE4E5B9ull;
}

// The scenarios of the sweep for one config on n ranks; `modes` are the
// modes each case runs in.
void AddScenarios(std::vector<Job>* jobs, const attnAttnConfig_t& cfg, int n, uint64_t seed,
                  const std::vector<attnAttnMode_t>& modes) {
  int lseToggle = 0;
  auto add = [&](std::shared_ptr<const AttnCase> c, const Placement& pl) {
    for (attnAttnMode_t m : modes) jobs->push_back({c, pl, m, (lseToggle++ % 3) != 2});
  };
  const std::string tag = CfgName(cfg) + ", N=" + std::to_string(n);
  // 1. Full prefill, one sequence, not a multiple of 2N.
  {
    std::vector<int32_t> T = {4 * n + 3};
    auto c = std::make_shared<AttnCase>(MakeCase("full prefill (" + tag + ")", PrefillSpec(cfg, T, {}),
                                                 Mix(seed, 1)));
    add(c, PlannerPlacement(*c, T, {}, n));
  }
  // 2. Partial prefill: new tokens after cached ones.
  {
    std::vector<int32_t> T = {3 * n + 2, n}, P = {4 * n + 1, 7};
    auto c = std::make_shared<AttnCase>(
        MakeCase("partial prefill (" + tag + ")", PrefillSpec(cfg, T, P), Mix(seed, 2)));
    add(c, PlannerPlacement(*c, T, P, n));
  }
  // 3. Fused batch: unequal lengths, T = 0 with a cache, P = 0, a sequence
  //    with nothing at all, one shorter than the number of ranks.
  {
    std::vector<int32_t> T = {2 * n + 3, 0, 1, 7, 0}, P = {5, 9, 0, 0, 0};
    auto c = std::make_shared<AttnCase>(
        MakeCase("fused batch (" + tag + ")", PrefillSpec(cfg, T, P), Mix(seed, 3)));
    add(c, PlannerPlacement(*c, T, P, n));
  }
  // 4. Decode: a planner prefill of P0 tokens, then steps of one new token per
  //    sequence whose KV goes where attnDecodePlacement says (a different
  //    rank each step) and whose query sits on its q_rank.
  {
    const std::vector<int32_t> P0 = {2 * n + 1, 5, 0};
    const int S = static_cast<int>(P0.size());
    const int steps = std::min(n + 1, 6);  // the decode KV visits several ranks
    for (int step = 0; step < steps; ++step) {
      AttnProblemSpec spec;
      spec.cfg = cfg;
      spec.q_pos.resize(S);
      spec.kv_pos.resize(S);
      for (int s = 0; s < S; ++s) {
        for (int32_t p = 0; p <= P0[s] + step; ++p) spec.kv_pos[s].push_back(p);
        spec.q_pos[s].push_back(P0[s] + step);
      }
      auto c = std::make_shared<AttnCase>(MakeCase(
          "decode step " + std::to_string(step) + " (" + tag + ")", spec, Mix(seed, 40 + step)));
      // Prefill keys: where the planner put them.
      Placement pre;
      {
        AttnCase prefix = MakeCase("decode prefix", PrefillSpec(cfg, P0, {}), 1);
        pre = PlannerPlacement(prefix, P0, {}, n);
      }
      Placement pl;
      pl.nranks = n;
      pl.q_rows.resize(n);
      pl.kv_rows.resize(n);
      std::vector<int32_t> qRank(S), kvRank(S);
      ASSERT_EQ(attnDecodePlacement(S, 0, n, nullptr, qRank.data()), attnSuccess);
      // kv rows of the case, per sequence: [0, P0) prefill, then the decode
      // tokens of steps 0..step.
      std::vector<std::vector<std::vector<int64_t>>> kvOf(n, std::vector<std::vector<int64_t>>(S));
      // prefix row -> (sequence, position)
      std::vector<int32_t> preBase(S + 1, 0);
      for (int s = 0; s < S; ++s) preBase[s + 1] = preBase[s] + P0[s];
      for (int r = 0; r < n; ++r)
        for (int64_t g : pre.kv_rows[r]) {
          int s = 0;
          while (g >= preBase[s + 1]) ++s;
          kvOf[r][s].push_back(c->kv_off[s] + (g - preBase[s]));
        }
      for (int st = 0; st <= step; ++st) {
        ASSERT_EQ(attnDecodePlacement(S, st, n, kvRank.data(), nullptr), attnSuccess);
        for (int s = 0; s < S; ++s) kvOf[kvRank[s]][s].push_back(c->kv_off[s] + P0[s] + st);
      }
      for (int r = 0; r < n; ++r)
        for (int s = 0; s < S; ++s)
          pl.kv_rows[r].insert(pl.kv_rows[r].end(), kvOf[r][s].begin(), kvOf[r][s].end());
      for (int s = 0; s < S; ++s) pl.q_rows[qRank[s]].push_back(c->q_off[s]);
      add(c, pl);
    }
  }
  // 5. Arbitrary placement: every query and key row on a random rank
  //    (independently), random order within a rank, one rank holding nothing.
  {
    std::vector<int32_t> T = {n + 2, 2 * n + 5, 3}, P = {4, 0, 2 * n};
    auto c = std::make_shared<AttnCase>(
        MakeCase("random placement (" + tag + ")", PrefillSpec(cfg, T, P), Mix(seed, 5)));
    add(c, RandomPlacement(*c, n, Mix(seed, 55), n > 1 ? n - 1 : -1));
  }
  // 7. Lopsided: every query on rank 0, every key on the last rank (on one
  //    rank, both there).
  {
    std::vector<int32_t> T = {3 * n + 4, 2}, P = {6, 5};
    auto c = std::make_shared<AttnCase>(
        MakeCase("lopsided (" + tag + ")", PrefillSpec(cfg, T, P), Mix(seed, 7)));
    Placement pl;
    pl.nranks = n;
    pl.q_rows.resize(n);
    pl.kv_rows.resize(n);
    for (int64_t i = 0; i < c->q_rows(); ++i) pl.q_rows[0].push_back(i);
    for (int64_t j = 0; j < c->kv_rows(); ++j) pl.kv_rows[n - 1].push_back(j);
    add(c, pl);
  }
  // 6. Fully masked rows: queries before every key (causal), a sequence with
  //    queries and no keys, one with keys and no queries; random placement.
  {
    AttnProblemSpec spec;
    spec.cfg = cfg;
    spec.q_pos = {{0, 3, 9, 10, 12, 30}, {1, 2}, {}};
    spec.kv_pos = {{}, {}, {0, 1, 2, 3, 4, 5}};
    for (int32_t p = 10; p < 10 + 2 * n + 4; ++p) spec.kv_pos[0].push_back(p);
    auto c = std::make_shared<AttnCase>(MakeCase("masked rows (" + tag + ")", spec, Mix(seed, 6)));
    add(c, RandomPlacement(*c, n, Mix(seed, 66), n > 2 ? 0 : -1));
  }
}

void RunJobsOnRank(const std::vector<Job>& jobs, int rank, attnComm_t comm, const char* runner) {
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job& j = jobs[i];
    ExpectRingAttentionExact(*j.c, j.pl, rank, comm, j.mode, j.lse,
                             std::string(runner) + " job " + std::to_string(i));
  }
}

// ---------------------------------------------------------------------------
// The sweep on threads: every config, every scenario, every mode.

class RingAttentionThreads : public ::testing::TestWithParam<int> {};

TEST_P(RingAttentionThreads, SweepEqualsReference) {
  const int n = GetParam();
  std::vector<Job> jobs;
  uint64_t seed = 1000 + n;
  for (const attnAttnConfig_t& cfg : AllSweepConfigs()) {
    AddScenarios(&jobs, cfg, n, seed++,
                 {attnModePassKV, attnModePassQ, attnModeShipQ, attnModeAuto, attnModeHeadParallel,
                  attnModeAllGatherKV});
    if (HasFatalFailure()) return;
  }
  RunThreads(n, [&](int rank, int, attnComm_t& comm) { RunJobsOnRank(jobs, rank, comm, "threads"); },
             AttnRunOptions());
}

INSTANTIATE_TEST_SUITE_P(N, RingAttentionThreads, ::testing::Values(1, 2, 3, 4, 5, 8),
                         [](const auto& info) { return "N" + std::to_string(info.param); });

// ---------------------------------------------------------------------------
// The sweep on processes: every scenario and mode; the configs are spread
// over the values of N so that together they cover every config.

class RingAttentionProcesses : public ::testing::TestWithParam<int> {};

TEST_P(RingAttentionProcesses, SweepEqualsReference) {
  const int n = GetParam();
  const std::vector<int> ns = {1, 2, 3, 4, 5, 8};
  const int slot = static_cast<int>(std::find(ns.begin(), ns.end(), n) - ns.begin());
  std::vector<Job> jobs;
  const auto cfgs = AllSweepConfigs();
  for (size_t i = 0; i < cfgs.size(); ++i) {
    if (static_cast<int>(i % ns.size()) != slot && static_cast<int>((i + 3) % ns.size()) != slot)
      continue;
    AddScenarios(&jobs, cfgs[i], n, 5000 + 31 * n + i,
                 {attnModePassKV, attnModePassQ, attnModeShipQ, attnModeAuto, attnModeHeadParallel,
                  attnModeAllGatherKV});
    if (HasFatalFailure()) return;
  }
  RunProcesses(n, [&](int rank, int, attnComm_t& comm) { RunJobsOnRank(jobs, rank, comm, "processes"); },
               AttnRunOptions());
}

INSTANTIATE_TEST_SUITE_P(N, RingAttentionProcesses, ::testing::Values(1, 2, 3, 4, 5, 8),
                         [](const auto& info) { return "N" + std::to_string(info.param); });

// ---------------------------------------------------------------------------
// A few larger problems (realistic head dims, longer sequences).

std::vector<Job> BigHeadsJobs(int n) {
  std::vector<Job> jobs;
  for (attnDataType_t t : {attnFloat32, attnBfloat16}) {
    attnAttnConfig_t cfg = AttnCfg(16, 2, 128, t, true);
    std::vector<int32_t> T = {300, 61}, P = {150, 0};
    auto c = std::make_shared<AttnCase>(MakeCase("large partial prefill", PrefillSpec(cfg, T, P), 77));
    Placement pl = PlannerPlacement(*c, T, P, n);
    for (attnAttnMode_t m : kAllModes) jobs.push_back({c, pl, m, true});
  }
  {
    attnAttnConfig_t cfg = AttnCfg(32, 4, 64, attnFloat32, false);
    std::vector<int32_t> T = {129}, P = {200};
    auto c = std::make_shared<AttnCase>(MakeCase("large non-causal", PrefillSpec(cfg, T, P), 78));
    Placement pl = RandomPlacement(*c, n, 79, -1);
    for (attnAttnMode_t m : kAllModes) jobs.push_back({c, pl, m, m != attnModePassQ});
  }
  return jobs;
}

TEST(RingAttentionLarge, PartialPrefillBigHeads) {
  const std::vector<Job> jobs = BigHeadsJobs(4);
  RunThreads(4, [&](int rank, int, attnComm_t& comm) { RunJobsOnRank(jobs, rank, comm, "large"); },
             AttnRunOptions());
}

// The same as processes: query blocks, KV blocks and partials of several
// hundred KiB travel from the communicator's shareable buffers, so peers
// read them through their mappings (rotation, pass-Q's and ship-Q's
// outgoing slots), twice per mode, so the second call reuses the mappings.
TEST(RingAttentionLarge, PartialPrefillBigHeadsProcesses) {
  std::vector<Job> jobs = BigHeadsJobs(4);
  const size_t once = jobs.size();
  for (size_t i = 0; i < once; ++i) jobs.push_back(jobs[i]);
  RunProcesses(4, [&](int rank, int, attnComm_t& comm) { RunJobsOnRank(jobs, rank, comm, "large"); },
               AttnRunOptions());
}

// Peaky softmax (large scores): the merge must subtract maxima correctly.
TEST(RingAttentionLarge, PeakySoftmaxFp32) {
  const int n = 3;
  std::vector<Job> jobs;
  attnAttnConfig_t cfg = AttnCfg(4, 2, 32, attnFloat32, true, 1.0f);
  AttnProblemSpec spec = PrefillSpec(cfg, {70}, {40});
  spec.q_scale = 6.0f;  // scores up to ~hundreds
  auto c = std::make_shared<AttnCase>(MakeCase("peaky softmax", spec, 91));
  Placement pl = RandomPlacement(*c, n, 92, -1);
  for (attnAttnMode_t m : kAllModes) jobs.push_back({c, pl, m, true});
  RunThreads(n, [&](int rank, int, attnComm_t& comm) { RunJobsOnRank(jobs, rank, comm, "peaky"); },
             AttnRunOptions());
}

// fp16 is accepted too (DESIGN.md §4: bf16/fp16 within 1e-2).
TEST(RingAttentionLarge, Fp16AllModes) {
  const int n = 3;
  std::vector<Job> jobs;
  attnAttnConfig_t cfg = AttnCfg(8, 2, 24, attnFloat16, true);
  std::vector<int32_t> T = {40, 9}, P = {13, 0};
  auto c = std::make_shared<AttnCase>(MakeCase("fp16", PrefillSpec(cfg, T, P), 93));
  Placement pl = PlannerPlacement(*c, T, P, n);
  for (attnAttnMode_t m : kAllModes) jobs.push_back({c, pl, m, true});
  RunThreads(n, [&](int rank, int, attnComm_t& comm) { RunJobsOnRank(jobs, rank, comm, "fp16"); },
             AttnRunOptions());
}

// head_dim at both ends of [1, 256]. With D = 1 a row is one value, an
// average of values of both signs: its size says nothing of the sums'
// rounding, so it is measured against the largest |V| (1) instead, i.e. by
// the absolute error.
TEST(RingAttentionLarge, HeadDimOneAnd256) {
  for (int n : {1, 2}) {
    for (int d : {1, 256}) {
      attnAttnConfig_t cfg = AttnCfg(4, 1, d, attnFloat32, true);
      std::vector<int32_t> T = {13}, P = {6};
      auto c = std::make_shared<AttnCase>(MakeCase("head_dim " + std::to_string(d), PrefillSpec(cfg, T, P), 80 + d));
      Placement pl = PlannerPlacement(*c, T, P, n);
      RunThreads(n, [&](int rank, int, attnComm_t& comm) {
        for (attnAttnMode_t m : kAllModes) {
          RankRun run = RunRingAttentionRank(*c, pl, rank, comm, m, true);
          ASSERT_EQ(run.rc, attnSuccess) << run.error;
          const std::string what = "D=" + std::to_string(d) + " N=" + std::to_string(n) + " " + ModeName(m);
          EXPECT_EQ(run.stats.nan_rows, 0) << what;
          EXPECT_EQ(run.stats.empty_mismatch, 0) << what;
          EXPECT_LE(run.stats.max_lse_abs, LseBound(cfg.dtype)) << what;
          EXPECT_LE(d == 1 ? run.stats.max_o_abs : run.stats.max_o_rel, OutBound(cfg.dtype))
              << what << ": " << run.stats.Describe();
        }
      }, AttnRunOptions());
    }
  }
}

// The built-in kernel on several threads (ATTN_KERNEL_THREADS), in processes
// so the variable is seen when the communicator's attention state is made.
TEST(RingAttentionLarge, KernelThreadsProcesses) {
  const int n = 2;
  std::vector<Job> jobs;
  for (attnDataType_t t : {attnFloat32, attnBfloat16}) {
    attnAttnConfig_t cfg = AttnCfg(8, 2, 32, t, true);
    std::vector<int32_t> T = {150, 7}, P = {60, 0};
    auto c = std::make_shared<AttnCase>(MakeCase("kernel threads", PrefillSpec(cfg, T, P), 81));
    Placement pl = PlannerPlacement(*c, T, P, n);
    for (attnAttnMode_t m : kAllModes) jobs.push_back({c, pl, m, true});
  }
  RunOptions o = AttnRunOptions();
  o.env = {{"ATTN_KERNEL_THREADS", "3"}};
  RunProcesses(n, [&](int rank, int, attnComm_t& comm) { RunJobsOnRank(jobs, rank, comm, "kernel threads"); },
               o);
}

// An empty batch (num_seqs 0) and a batch with no rows anywhere.
TEST(RingAttentionEdge, EmptyBatches) {
  RunThreads(3, [&](int rank, int, attnComm_t& comm) {
    attnAttnConfig_t cfg = AttnCfg(4, 2, 8, attnFloat32, true);
    int32_t zero[1] = {0};
    attnSeqLayout_t lay{0, zero, nullptr, zero, nullptr};
    for (attnAttnMode_t m : kAllModes)
      ATTN_EXPECT_OK(comm, attnRingAttention(nullptr, nullptr, nullptr, nullptr, nullptr, &lay, &cfg, m,
                                             comm, nullptr));
    std::vector<int32_t> offs(4, 0);
    attnSeqLayout_t lay3{3, offs.data(), nullptr, offs.data(), nullptr};
    for (attnAttnMode_t m : kAllModes)
      ATTN_EXPECT_OK(comm, attnRingAttention(nullptr, nullptr, nullptr, nullptr, nullptr, &lay3, &cfg, m,
                                             comm, nullptr));
    (void)rank;
  }, AttnRunOptions(60000));
}

// num_seqs 0 with NULL offsets: checkOffsets accepts it (no rows), so the
// call must not read the offsets. In a child process: a crash must not take
// the test binary down.
TEST(RingAttentionEdge, ZeroSeqsWithNullOffsetsDoesNotCrash) {
  auto results = RunProcessesCollect(1, [&](int, int, attnComm_t& comm) {
    attnAttnConfig_t cfg = AttnCfg(4, 2, 8, attnFloat32, false);
    attnSeqLayout_t lay{0, nullptr, nullptr, nullptr, nullptr};
    const attnResult_t r = attnRingAttention(nullptr, nullptr, nullptr, nullptr, nullptr, &lay, &cfg,
                                             attnModePassKV, comm, nullptr);
    EXPECT_TRUE(r == attnSuccess || r == attnInvalidArgument) << ResultName(r);
  }, AttnRunOptions(60000));
  for (const auto& r : results)
    EXPECT_TRUE(r.passed()) << "attnRingAttention(num_seqs 0, NULL offsets): " << r.Describe();
}

// A non-blocking communicator: the call may return attnInProgress and
// completes in the background.
TEST(RingAttentionEdge, NonBlockingCommunicator) {
  const int n = 3;
  attnConfig_t ccfg = ATTN_CONFIG_INITIALIZER;
  ccfg.blocking = 0;
  ccfg.timeout_ms = 60000;
  RunOptions o;
  o.config = &ccfg;
  o.deadline_ms = 120000;
  attnAttnConfig_t cfg = AttnCfg(8, 2, 16, attnBfloat16, true);
  std::vector<int32_t> T = {33, 5}, P = {12, 4};
  auto c = std::make_shared<AttnCase>(MakeCase("non-blocking", PrefillSpec(cfg, T, P), 88));
  Placement pl = PlannerPlacement(*c, T, P, n);
  RunThreads(n, [&](int rank, int, attnComm_t& comm) {
    for (attnAttnMode_t m : kAllModes) {
      RankShard sh = GatherShard(*c, pl, rank);
      std::vector<uint16_t> out(sh.q_global.size() * 8 * 16, 0x7FC0);
      std::vector<float> lse(sh.q_global.size() * 8, 0.0f);
      attnResult_t r = attnRingAttention(sh.q.data(), sh.k.data(), sh.v.data(), out.data(), lse.data(),
                                         &sh.layout, &cfg, m, comm, nullptr);
      ASSERT_TRUE(r == attnSuccess || r == attnInProgress) << ResultName(r) << ": " << attnGetLastError(comm);
      const auto t0 = std::chrono::steady_clock::now();
      attnResult_t st = attnInProgress;
      while (st == attnInProgress && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60)) {
        ASSERT_EQ(attnCommGetAsyncError(comm, &st), attnSuccess);
        if (st == attnInProgress) std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      ASSERT_EQ(st, attnSuccess) << ModeName(m) << ": " << attnGetLastError(comm);
      EXPECT_TRUE(WithinBounds(CompareShard(*c, sh, out.data(), lse.data()), cfg.dtype,
                               std::string("non-blocking ") + ModeName(m)));
    }
  }, o);
}

// Two attention calls queued in one group run at attnGroupEnd.
TEST(RingAttentionEdge, InsideAGroup) {
  const int n = 3;
  attnAttnConfig_t cfg = AttnCfg(4, 2, 8, attnFloat32, true);
  std::vector<int32_t> T1 = {20}, T2 = {9, 14}, P2 = {3, 0};
  auto c1 = std::make_shared<AttnCase>(MakeCase("group 1", PrefillSpec(cfg, T1, {}), 90));
  auto c2 = std::make_shared<AttnCase>(MakeCase("group 2", PrefillSpec(cfg, T2, P2), 91));
  Placement p1 = PlannerPlacement(*c1, T1, {}, n), p2 = PlannerPlacement(*c2, T2, P2, n);
  RunThreads(n, [&](int rank, int, attnComm_t& comm) {
    RankShard s1 = GatherShard(*c1, p1, rank), s2 = GatherShard(*c2, p2, rank);
    std::vector<float> o1(s1.q_global.size() * 4 * 8, NAN), l1(s1.q_global.size() * 4, NAN);
    std::vector<float> o2(s2.q_global.size() * 4 * 8, NAN), l2(s2.q_global.size() * 4, NAN);
    ATTN_ASSERT_OK(comm, attnGroupStart());
    attnResult_t a = attnRingAttention(s1.q.data(), s1.k.data(), s1.v.data(), o1.data(), l1.data(),
                                       &s1.layout, &cfg, attnModePassKV, comm, nullptr);
    attnResult_t b = attnRingAttention(s2.q.data(), s2.k.data(), s2.v.data(), o2.data(), l2.data(),
                                       &s2.layout, &cfg, attnModePassQ, comm, nullptr);
    attnResult_t e = attnGroupEnd();
    ASSERT_EQ(a, attnSuccess) << attnGetLastError(comm);
    ASSERT_EQ(b, attnSuccess) << attnGetLastError(comm);
    ASSERT_EQ(e, attnSuccess) << attnGetLastError(comm);
    EXPECT_TRUE(WithinBounds(CompareShard(*c1, s1, o1.data(), l1.data()), cfg.dtype, "group call 1"));
    EXPECT_TRUE(WithinBounds(CompareShard(*c2, s2, o2.data(), l2.data()), cfg.dtype, "group call 2"));
  }, AttnRunOptions(60000));
}

// ---------------------------------------------------------------------------
// bf16: the distributed error does not grow with N (partials merge in fp32).

TEST(RingAttentionBf16, ErrorAtN8NoWorseThan1p5xN1) {
  struct Input {
    std::shared_ptr<const AttnCase> c;
    std::vector<int32_t> T, P;
  };
  std::vector<Input> inputs;
  {
    attnAttnConfig_t cfg = AttnCfg(8, 2, 64, attnBfloat16, true);
    std::vector<int32_t> T = {160, 33}, P = {0, 90};
    inputs.push_back({std::make_shared<AttnCase>(MakeCase("bf16 growth causal", PrefillSpec(cfg, T, P), 123)), T, P});
  }
  {
    attnAttnConfig_t cfg = AttnCfg(16, 1, 32, attnBfloat16, false);
    std::vector<int32_t> T = {120}, P = {64};
    inputs.push_back({std::make_shared<AttnCase>(MakeCase("bf16 growth full", PrefillSpec(cfg, T, P), 124)), T, P});
  }
  // Per input and mode: the stats merged over ranks.
  auto measure = [&](int n) {
    std::vector<std::vector<AttnErrorStats>> err(inputs.size(), std::vector<AttnErrorStats>(4));
    std::mutex mu;
    std::vector<Placement> pls;
    for (const Input& in : inputs) pls.push_back(PlannerPlacement(*in.c, in.T, in.P, n));
    RunThreads(n, [&](int rank, int, attnComm_t& comm) {
      for (size_t i = 0; i < inputs.size(); ++i)
        for (int m = 0; m < 4; ++m) {
          AttnErrorStats st;
          ExpectRingAttentionExact(*inputs[i].c, pls[i], rank, comm, kAllModes[m], true,
                                   "bf16 growth N=" + std::to_string(n), &st);
          std::lock_guard<std::mutex> g(mu);
          err[i][m].Merge(st);
        }
    }, AttnRunOptions());
    return err;
  };
  const auto e1 = measure(1);
  const auto e8 = measure(8);
  for (size_t i = 0; i < inputs.size(); ++i)
    for (int m = 0; m < 4; ++m) {
      const AttnErrorStats& a = e1[i][m];
      const AttnErrorStats& b = e8[i][m];
      EXPECT_EQ(a.compared, b.compared);
      EXPECT_GT(a.max_o_rel, 0.0) << "bf16 output rounding should show some error";
      EXPECT_LE(b.max_o_rel, 1.5 * a.max_o_rel)
          << inputs[i].c->name << ", " << ModeName(kAllModes[m]) << ": bf16 max error at N=8 "
          << b.max_o_rel << " vs N=1 " << a.max_o_rel;
      EXPECT_LE(b.mean_o_rel(), 1.5 * a.mean_o_rel())
          << inputs[i].c->name << ", " << ModeName(kAllModes[m]) << ": bf16 mean error at N=8 "
          << b.mean_o_rel() << " vs N=1 " << a.mean_o_rel();
      std::printf("[ bf16 ] %s %s: max_o_rel N=1 %.3g N=8 %.3g; mean N=1 %.3g N=8 %.3g\n",
                  inputs[i].c->name.c_str(), ModeName(kAllModes[m]), a.max_o_rel, b.max_o_rel,
                  a.mean_o_rel(), b.mean_o_rel());
    }
}

// ---------------------------------------------------------------------------
// Fully masked rows, looked at directly: out exactly 0, lse exactly -inf.

TEST(RingAttentionMasked, RowsBeforeEveryKeyGiveZeroAndMinusInf) {
  const int n = 3;
  attnAttnConfig_t cfg = AttnCfg(4, 2, 8, attnBfloat16, true);
  AttnProblemSpec spec;
  spec.cfg = cfg;
  spec.q_pos = {{0, 1, 2, 50}};
  spec.kv_pos.resize(1);
  for (int p = 20; p < 40; ++p) spec.kv_pos[0].push_back(p);
  auto c = std::make_shared<AttnCase>(MakeCase("masked", spec, 7));
  // Queries on rank 0 (three masked, one not); keys on ranks 1 and 2.
  Placement pl;
  pl.nranks = n;
  pl.q_rows = {{0, 1, 2, 3}, {}, {}};
  pl.kv_rows.resize(n);
  for (int64_t j = 0; j < c->kv_rows(); ++j) pl.kv_rows[1 + j % 2].push_back(j);
  RunThreads(n, [&](int rank, int, attnComm_t& comm) {
    for (attnAttnMode_t m : kAllModes) {
      RankShard sh = GatherShard(*c, pl, rank);
      const size_t qn = sh.q_global.size();
      std::vector<uint16_t> out(qn * 4 * 8, 0x7FC0);  // NaN
      std::vector<float> lse(qn * 4, 123.0f);
      const attnResult_t r = attnRingAttention(qn ? sh.q.data() : nullptr, sh.k.data(), sh.v.data(),
                                               qn ? out.data() : nullptr, qn ? lse.data() : nullptr,
                                               &sh.layout, &cfg, m, comm, nullptr);
      ASSERT_EQ(r, attnSuccess) << ModeName(m) << ": " << attnGetLastError(comm);
      for (size_t i = 0; i < qn; ++i)
        for (int h = 0; h < 4; ++h) {
          const float l = lse[i * 4 + h];
          if (i < 3) {
            EXPECT_TRUE(std::isinf(l) && l < 0) << ModeName(m) << " row " << i << " lse " << l;
            for (int d = 0; d < 8; ++d)
              EXPECT_EQ(out[(i * 4 + h) * 8 + d] & 0x7FFF, 0) << ModeName(m) << " row " << i;
          } else {
            EXPECT_TRUE(std::isfinite(l)) << ModeName(m) << " row " << i << " lse " << l;
          }
        }
      EXPECT_TRUE(WithinBounds(CompareShard(*c, sh, out.data(), lse.data()), cfg.dtype, ModeName(m)));
    }
  }, AttnRunOptions());
}

// ---------------------------------------------------------------------------
// attnMergeAttnStates: partials over a partition of the keys merge to the
// full result.

struct Partial {
  std::vector<uint8_t> o;  // in dtype
  std::vector<float> lse;
};

// Partial of all queries of `c` over the keys in `keys` (a subset of rows),
// computed with the double reference and stored in dtype.
Partial PartialOver(const AttnCase& c, const std::vector<int64_t>& keys) {
  Partial p;
  const attnAttnConfig_t& cfg = c.cfg;
  Placement pl;
  pl.nranks = 1;
  pl.q_rows = {{}};
  for (int64_t i = 0; i < c.q_rows(); ++i) pl.q_rows[0].push_back(i);
  pl.kv_rows = {keys};
  std::sort(pl.kv_rows[0].begin(), pl.kv_rows[0].end(),
            [&](int64_t a, int64_t b) { return c.kv_seq[a] < c.kv_seq[b] || (c.kv_seq[a] == c.kv_seq[b] && a < b); });
  RankShard sh = GatherShard(c, pl, 0);
  std::vector<attn::cpu::AttnSegment> segs;
  attn::cpu::AttnProblem pr = ProblemFor(sh, c.num_seqs, cfg, &segs);
  const size_t rows = size_t(pr.nq) * cfg.num_q_heads;
  std::vector<double> o(rows * cfg.head_dim), l(rows);
  EXPECT_EQ(attn::cpu::referenceAttention(pr, o.data(), l.data()), attnSuccess);
  p.o.resize(o.size() * AttnElemSize(cfg.dtype));
  p.lse.resize(rows);
  for (size_t i = 0; i < o.size(); ++i) {
    const float f = static_cast<float>(o[i]);
    if (cfg.dtype == attnFloat32) std::memcpy(p.o.data() + 4 * i, &f, 4);
    else {
      const uint16_t h = cfg.dtype == attnBfloat16 ? attn::cpu::floatToBf16(f) : attn::cpu::floatToHalf(f);
      std::memcpy(p.o.data() + 2 * i, &h, 2);
    }
  }
  for (size_t i = 0; i < rows; ++i) p.lse[i] = static_cast<float>(l[i]);
  return p;
}

TEST(MergeAttnStates, PartitionOfKeysEqualsFullResult) {
  for (attnDataType_t t : {attnFloat32, attnBfloat16, attnFloat16}) {
    for (int parts : {1, 2, 3, 7}) {
      for (bool inPlace : {false, true}) {
        attnAttnConfig_t cfg = AttnCfg(4, 2, 16, t, true);
        AttnProblemSpec spec = PrefillSpec(cfg, {23, 5}, {11, 0});
        // Rows whose every partial is -inf: queries before every key.
        spec.q_pos.push_back({0, 1});
        spec.kv_pos.push_back({5, 6, 7});
        AttnCase c = MakeCase("merge", spec, 300 + parts);
        std::mt19937_64 rng(parts * 17 + t);
        std::vector<std::vector<int64_t>> keys(parts);
        for (int64_t j = 0; j < c.kv_rows(); ++j) keys[rng() % parts].push_back(j);
        keys[parts - 1].clear();  // an empty part too (all -inf) when parts > 1
        if (parts == 1)
          for (int64_t j = 0; j < c.kv_rows(); ++j) keys[0].push_back(j);
        else
          for (int64_t j = 0; j < c.kv_rows(); ++j)
            if (std::find(keys[0].begin(), keys[0].end(), j) == keys[0].end() &&
                std::none_of(keys.begin() + 1, keys.end() - 1, [&](const auto& k) {
                  return std::find(k.begin(), k.end(), j) != k.end();
                }))
              keys[0].push_back(j);
        std::vector<Partial> ps;
        for (auto& k : keys) ps.push_back(PartialOver(c, k));
        std::vector<const void*> outs;
        std::vector<const float*> lses;
        for (auto& p : ps) {
          outs.push_back(p.o.data());
          lses.push_back(p.lse.data());
        }
        const size_t rows = c.q_rows() * cfg.num_q_heads;
        std::vector<uint8_t> out(rows * cfg.head_dim * AttnElemSize(t), 0xFF);
        std::vector<float> lse(rows, 7.0f);
        void* o = inPlace ? ps[0].o.data() : out.data();
        float* l = inPlace ? ps[0].lse.data() : lse.data();
        ASSERT_EQ(attnMergeAttnStates(parts, outs.data(), lses.data(), o, l, c.q_rows(),
                                      cfg.num_q_heads, cfg.head_dim, t, nullptr),
                  attnSuccess)
            << attnGetLastError(nullptr);
        RankShard whole = GatherShard(c, RoundRobinPlacement(c, 1, 0), 0);
        const AttnErrorStats e = CompareShard(c, whole, o, l);
        // Partials were rounded to dtype before merging: allow twice the bound.
        EXPECT_EQ(e.nan_rows, 0);
        EXPECT_EQ(e.empty_mismatch, 0) << "rows with no key must give out = 0, lse = -inf";
        EXPECT_LE(e.max_o_rel, 2 * OutBound(t)) << AttnDtypeName(t) << " parts " << parts;
        EXPECT_LE(e.max_lse_abs, LseBound(t)) << AttnDtypeName(t) << " parts " << parts;
        // lse == NULL is allowed.
        ASSERT_EQ(attnMergeAttnStates(parts, outs.data(), lses.data(), out.data(), nullptr,
                                      c.q_rows(), cfg.num_q_heads, cfg.head_dim, t, nullptr),
                  attnSuccess);
      }
    }
  }
}

TEST(MergeAttnStates, AllMinusInfGivesZeroNoNaN) {
  const int rows = 3, heads = 2, d = 5;
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<float> o1(rows * heads * d, std::numeric_limits<float>::quiet_NaN());  // garbage
  std::vector<float> o2(rows * heads * d, 42.0f);
  std::vector<float> l1(rows * heads, ninf), l2(rows * heads, ninf);
  // Row 2 head 1 of part 2 saw keys.
  l2[2 * heads + 1] = 0.5f;
  const void* outs[] = {o1.data(), o2.data()};
  const float* lses[] = {l1.data(), l2.data()};
  std::vector<float> out(o1.size(), 9.0f), lse(l1.size(), 9.0f);
  ASSERT_EQ(attnMergeAttnStates(2, outs, lses, out.data(), lse.data(), rows, heads, d, attnFloat32, nullptr),
            attnSuccess)
      << attnGetLastError(nullptr);
  for (int r = 0; r < rows * heads; ++r) {
    if (r == 2 * heads + 1) {
      EXPECT_FLOAT_EQ(lse[r], 0.5f);
      for (int k = 0; k < d; ++k) EXPECT_FLOAT_EQ(out[r * d + k], 42.0f);
    } else {
      EXPECT_TRUE(std::isinf(lse[r]) && lse[r] < 0) << "row " << r;
      for (int k = 0; k < d; ++k) EXPECT_EQ(out[r * d + k], 0.0f) << "row " << r;
    }
  }
}

TEST(MergeAttnStates, BadArguments) {
  std::vector<float> o(8), l(2);
  const void* outs[] = {o.data()};
  const float* lses[] = {l.data()};
  EXPECT_EQ(attnMergeAttnStates(0, outs, lses, o.data(), l.data(), 1, 2, 4, attnFloat32, nullptr),
            attnInvalidArgument);
  EXPECT_EQ(attnMergeAttnStates(1, outs, lses, o.data(), l.data(), 1, 2, 4, attnInt8, nullptr),
            attnInvalidArgument);
  EXPECT_EQ(attnMergeAttnStates(1, nullptr, lses, o.data(), l.data(), 1, 2, 4, attnFloat32, nullptr),
            attnInvalidArgument);
  EXPECT_EQ(attnMergeAttnStates(1, outs, lses, nullptr, l.data(), 1, 2, 4, attnFloat32, nullptr),
            attnInvalidArgument);
  EXPECT_EQ(attnMergeAttnStates(1, outs, lses, o.data(), l.data(), 1, 0, 4, attnFloat32, nullptr),
            attnInvalidArgument);
  EXPECT_STRNE(attnGetLastError(nullptr), "");
}

// ---------------------------------------------------------------------------
// A user kernel through attnCommSetAttnKernel.

TEST(RingAttentionKernel, UserKernelIsUsedAndExactNullRestores) {
  const int n = 3;
  attnAttnConfig_t cfg = AttnCfg(8, 2, 16, attnFloat32, true);
  std::vector<int32_t> T = {17, 4}, P = {9, 3};
  auto c = std::make_shared<AttnCase>(MakeCase("user kernel", PrefillSpec(cfg, T, P), 55));
  Placement pl = PlannerPlacement(*c, T, P, n);
  std::vector<std::atomic<int64_t>> calls(n), rows(n);
  RunThreads(n, [&](int rank, int, attnComm_t& comm) {
    AttnKernelCounter counter{&calls[rank], &rows[rank]};
    ATTN_ASSERT_OK(comm, attnCommSetAttnKernel(comm, LoopAttentionKernel, &counter));
    for (attnAttnMode_t m : kAllModes) {
      const int64_t before = calls[rank].load();
      ExpectRingAttentionExact(*c, pl, rank, comm, m, true, "user kernel");
      EXPECT_GT(calls[rank].load(), before) << ModeName(m) << ": the user kernel was not called";
    }
    ATTN_ASSERT_OK(comm, attnCommSetAttnKernel(comm, nullptr, nullptr));
    const int64_t frozen = calls[rank].load();
    for (attnAttnMode_t m : kAllModes) ExpectRingAttentionExact(*c, pl, rank, comm, m, true, "built-in again");
    EXPECT_EQ(calls[rank].load(), frozen) << "the user kernel was called after NULL restored the built-in";
  }, AttnRunOptions());
}

// A user kernel that fails: every mode reports the failure, no hang.
attnResult_t FailingKernel(const attnAttnKernelArgs_t*, void*, attnStream_t) { return attnInternalError; }

TEST(RingAttentionKernel, FailingUserKernelFailsTheCallOnN1) {
  // On one rank nothing can hang; the kernel's failure must come back.
  attnAttnConfig_t cfg = AttnCfg(2, 1, 8, attnFloat32, false);
  std::vector<int32_t> T = {5};
  auto c = std::make_shared<AttnCase>(MakeCase("failing kernel", PrefillSpec(cfg, T, {}), 56));
  Placement pl = PlannerPlacement(*c, T, {}, 1);
  RunThreads(1, [&](int rank, int, attnComm_t& comm) {
    ATTN_ASSERT_OK(comm, attnCommSetAttnKernel(comm, FailingKernel, nullptr));
    for (attnAttnMode_t m : {attnModePassKV, attnModePassQ, attnModeShipQ, attnModeAllGatherKV}) {
      RankRun run = RunRingAttentionRank(*c, pl, rank, comm, m, true);
      EXPECT_NE(run.rc, attnSuccess) << ModeName(m);
      EXPECT_FALSE(run.error.empty()) << ModeName(m);
    }
  }, AttnRunOptions());
}

// The kernel fails on one rank of three while its transfers are posted:
// that rank returns the kernel's error and no rank hangs (the communicators'
// timeout is 60 s; the watchdog ends the test at 40 s). A peer that already
// holds everything it needs may still finish: under pass-KV rank 0 gets
// rank 1's block forwarded by rank 2, so when rank 1 fails late, rank 0's
// result is complete, and then it must be exact. Rank 2 needs rank 0's
// block that only rank 1 forwards (pass-KV), or its queries' partial from
// rank 1 (pass-Q, ship-Q), so at least one peer always fails. Under
// all-gather KV rank 1 sends its block before its kernel runs, so both
// peers may finish, exact. The failing
// rank must also not leave the engine holding requests of a frame that is
// gone; ranks as threads share one address space, where that would crash
// or corrupt. Both orders are run: the kernel fails at once, and after
// the peers have had time to run ahead.
attnResult_t SlowFailingKernel(const attnAttnKernelArgs_t*, void*, attnStream_t) {
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  return attnInternalError;
}

// How the two peers' first calls ended, shared by ranks as processes.
struct PeerOutcomes {
  std::atomic<int> failed{0}, finished{0};
};

void FailingKernelOnRank1(attnAttnMode_t mode, bool processes, bool slow) {
  attnAttnConfig_t cfg = AttnCfg(4, 2, 16, attnFloat32, true);
  std::vector<int32_t> T = {40, 23}, C = {17, 0};
  auto c = std::make_shared<AttnCase>(MakeCase("failing on rank 1", PrefillSpec(cfg, T, C), 57));
  Placement pl = PlannerPlacement(*c, T, C, 3);
  void* shared = mmap(nullptr, sizeof(PeerOutcomes), PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(shared, MAP_FAILED);
  auto* peers = new (shared) PeerOutcomes;
  const std::string how = std::string(ModeName(mode)) + (slow ? ", kernel fails late" : "");
  auto body = [&](int rank, int, attnComm_t& comm) {
    if (rank == 1)
      ATTN_ASSERT_OK(comm, attnCommSetAttnKernel(comm, slow ? SlowFailingKernel : FailingKernel,
                                                 nullptr));
    RankRun run = RunRingAttentionRank(*c, pl, rank, comm, mode, true);
    const std::string what = how + ", rank " + std::to_string(rank);
    if (rank == 1) {
      EXPECT_NE(run.rc, attnSuccess) << what;
      EXPECT_NE(run.error.find("attnCommSetAttnKernel"), std::string::npos) << run.error;
    } else if (run.rc == attnSuccess) {
      EXPECT_TRUE(WithinBounds(run.stats, cfg.dtype, what + " (finished before the failure)"));
      peers->finished.fetch_add(1);
    } else {
      EXPECT_FALSE(run.error.empty()) << what;
      peers->failed.fetch_add(1);
    }
    // The communicators are broken now; a second call fails on every rank
    // and must not hang either.
    RankRun again = RunRingAttentionRank(*c, pl, rank, comm, mode, true);
    EXPECT_NE(again.rc, attnSuccess) << what << " (second call)";
  };
  if (processes) RunProcesses(3, body, AttnRunOptions(40000));
  else RunThreads(3, body, AttnRunOptions(40000));
  if (mode != attnModeAllGatherKV)
    EXPECT_GE(peers->failed.load(), 1) << how << ": every peer finished without rank 1's work";
  EXPECT_EQ(peers->failed.load() + peers->finished.load(), 2) << how;
  peers->~PeerOutcomes();
  munmap(shared, sizeof(PeerOutcomes));
}

TEST(RingAttentionKernel, FailingUserKernelOnOneRankHangsNoRankThreads) {
  for (bool slow : {false, true})
    for (attnAttnMode_t m : {attnModePassKV, attnModePassQ, attnModeShipQ, attnModeAllGatherKV})
      FailingKernelOnRank1(m, false, slow);
}

TEST(RingAttentionKernel, FailingUserKernelOnOneRankHangsNoRankProcesses) {
  for (bool slow : {false, true})
    for (attnAttnMode_t m : {attnModePassKV, attnModePassQ, attnModeShipQ, attnModeAllGatherKV})
      FailingKernelOnRank1(m, true, slow);
}

// ---------------------------------------------------------------------------
// Bad input.

struct SmallProblem {
  std::vector<float> q, k, v, out, lse;
  std::vector<int32_t> qoff{0, 2}, kvoff{0, 3}, qpos{3, 4}, kvpos{0, 3, 4};
  attnSeqLayout_t layout{};
  SmallProblem(int hq, int hkv, int d) {
    q.assign(2 * hq * std::max(d, 1), 0.5f);
    k.assign(3 * hkv * std::max(d, 1), 0.25f);
    v = k;
    out.assign(q.size(), 0.0f);
    lse.assign(2 * hq, 0.0f);
    layout = {1, qoff.data(), qpos.data(), kvoff.data(), kvpos.data()};
  }
};

TEST(RingAttentionBadInput, LocalErrorsAreClearAndLeaveTheCommUsable) {
  const int n = 2;
  RunThreads(n, [&](int rank, int, attnComm_t& comm) {
    SmallProblem p(4, 2, 8);
    attnAttnConfig_t cfg = AttnCfg(4, 2, 8, attnFloat32, true);
    auto call = [&](const attnSeqLayout_t* lay, const attnAttnConfig_t* c) {
      return attnRingAttention(p.q.data(), p.k.data(), p.v.data(), p.out.data(), p.lse.data(), lay, c,
                               attnModePassKV, comm, nullptr);
    };
    auto expectBad = [&](attnResult_t r, const char* what) {
      EXPECT_EQ(r, attnInvalidArgument) << what << " -> " << ResultName(r);
      EXPECT_STRNE(attnGetLastError(comm), "") << what << ": no error text";
    };
    expectBad(call(nullptr, &cfg), "NULL layout");
    expectBad(call(&p.layout, nullptr), "NULL cfg");
    attnAttnConfig_t bad = cfg;
    bad.num_q_heads = 6;
    bad.num_kv_heads = 4;
    expectBad(call(&p.layout, &bad), "num_q_heads % num_kv_heads != 0");
    bad = cfg;
    bad.head_dim = 0;
    expectBad(call(&p.layout, &bad), "head_dim 0");
    bad = cfg;
    bad.head_dim = 300;
    expectBad(call(&p.layout, &bad), "head_dim 300");
    bad = cfg;
    bad.dtype = attnInt8;
    expectBad(call(&p.layout, &bad), "int8 dtype");
    bad = cfg;
    bad.num_kv_heads = 0;
    expectBad(call(&p.layout, &bad), "num_kv_heads 0");
    bad = cfg;
    bad.softmax_scale = -1.0f;
    expectBad(call(&p.layout, &bad), "negative softmax_scale");
    expectBad(attnRingAttention(p.q.data(), p.k.data(), p.v.data(), p.out.data(), p.lse.data(),
                                &p.layout, &cfg, static_cast<attnAttnMode_t>(7), comm, nullptr),
              "unknown mode");
    expectBad(attnRingAttention(nullptr, p.k.data(), p.v.data(), p.out.data(), p.lse.data(),
                                &p.layout, &cfg, attnModePassKV, comm, nullptr),
              "NULL q with rows");
    attnSeqLayout_t lay = p.layout;
    lay.q_pos = nullptr;
    expectBad(call(&lay, &cfg), "causal without q_pos");
    std::vector<int32_t> decreasing{0, 3, 1};
    lay = p.layout;
    lay.num_seqs = 2;
    lay.q_offsets = decreasing.data();
    std::vector<int32_t> kvo{0, 3, 3};
    lay.kv_offsets = kvo.data();
    expectBad(call(&lay, &cfg), "decreasing q_offsets");
    // A non-host stream on a host communicator.
    EXPECT_EQ(attnRingAttention(p.q.data(), p.k.data(), p.v.data(), p.out.data(), p.lse.data(),
                                &p.layout, &cfg, attnModePassKV, comm,
                                reinterpret_cast<attnStream_t>(0x1)),
              attnInvalidArgument);
    // The communicator still works after all of that.
    ATTN_EXPECT_OK(comm, call(&p.layout, &cfg));
    EXPECT_TRUE(std::isfinite(p.lse[0]));
  }, AttnRunOptions(60000));
}

TEST(RingAttentionBadInput, NullCommIsRejected) {
  SmallProblem p(2, 1, 4);
  attnAttnConfig_t cfg = AttnCfg(2, 1, 4, attnFloat32, false);
  EXPECT_NE(attnRingAttention(p.q.data(), p.k.data(), p.v.data(), p.out.data(), p.lse.data(), &p.layout,
                              &cfg, attnModePassKV, nullptr, nullptr),
            attnSuccess);
}

// Ranks that disagree on the call's shape: attnInvalidUsage on every rank,
// quickly, and the communicator survives.
void MismatchBody(int rank, int n, attnComm_t& comm, attnAttnMode_t mode, int variant) {
  attnAttnConfig_t cfg = AttnCfg(4, 2, 8, attnFloat32, true);
  if (rank == n - 1) {
    switch (variant) {
      case 0: cfg.num_q_heads = 8; break;               // head mismatch
      case 1: cfg.num_kv_heads = 1; break;              // kv head mismatch
      case 2: cfg.head_dim = 16; break;                 // head_dim mismatch
      case 3: cfg.dtype = attnBfloat16; break;          // dtype mismatch
      case 4: cfg.causal = 0; break;                    // causal mismatch
      case 5: cfg.softmax_scale = 0.5f; break;          // scale mismatch
    }
  }
  SmallProblem p(cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim);
  const auto t0 = std::chrono::steady_clock::now();
  attnResult_t r = attnRingAttention(p.q.data(), p.k.data(), p.v.data(), p.out.data(), p.lse.data(),
                                     &p.layout, &cfg, mode, comm, nullptr);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r, attnInvalidUsage) << "variant " << variant << " mode " << ModeName(mode) << " rank "
                                 << rank << " -> " << ResultName(r) << ": " << attnGetLastError(comm);
  EXPECT_STRNE(attnGetLastError(comm), "");
  EXPECT_LT(s, 30.0) << "the mismatch should be found at once, not by a timeout";
  // Still usable: a matching call succeeds.
  attnAttnConfig_t good = AttnCfg(4, 2, 8, attnFloat32, true);
  SmallProblem q(4, 2, 8);
  ATTN_EXPECT_OK(comm, attnRingAttention(q.q.data(), q.k.data(), q.v.data(), q.out.data(), q.lse.data(),
                                         &q.layout, &good, mode, comm, nullptr));
}

TEST(RingAttentionBadInput, ShapeMismatchAcrossRanksThreads) {
  for (int variant = 0; variant < 6; ++variant)
    RunThreads(3, [&](int rank, int n, attnComm_t& comm) {
      MismatchBody(rank, n, comm, variant % 2 ? attnModePassQ : attnModePassKV, variant);
    }, AttnRunOptions(60000));
}

TEST(RingAttentionBadInput, HeadMismatchAcrossRanksProcesses) {
  RunProcesses(3, [&](int rank, int n, attnComm_t& comm) {
    MismatchBody(rank, n, comm, attnModeAuto, 0);
    MismatchBody(rank, n, comm, attnModeShipQ, 2);
  }, AttnRunOptions(60000));
}

// One rank rejects its arguments locally while the others enter the
// collective: the refusing rank still takes part in the call's exchange, so
// every other rank fails at once, naming it, and all of them stay in step:
// the next call works everywhere. (Before, the others took the refusing
// rank's next call for this one and the communicator fell out of step.)
void OneRankRefuses(int rank, int n, attnComm_t& comm, bool level) {
  for (int variant = 0; variant < 4; ++variant) {
    attnAttnConfig_t cfg = AttnCfg(4, 2, 8, attnFloat32, true);
    SmallProblem p(4, 2, 8);
    attnSeqLayout_t lay = p.layout;
    std::vector<int32_t> decreasing{0, 3, 1}, kvo{0, 3, 3};
    const bool refuses = rank == variant % n;
    if (refuses) {
      switch (variant) {
        case 0: cfg.head_dim = 300; break;
        case 1: cfg.num_kv_heads = 0; break;
        case 2:
          lay.num_seqs = 2;
          lay.q_offsets = decreasing.data();
          lay.kv_offsets = kvo.data();
          break;
        case 3: lay.q_pos = nullptr; break;  // causal without positions
      }
    }
    auto call = [&](const attnSeqLayout_t& l, const attnAttnConfig_t& c) {
      return level ? attnLevelAttention(p.q.data(), p.k.data(), p.v.data(), p.out.data(), p.lse.data(), &l, &c,
                                        nullptr, comm, nullptr)
                   : attnRingAttention(p.q.data(), p.k.data(), p.v.data(), p.out.data(), p.lse.data(), &l, &c,
                                       attnModePassKV, comm, nullptr);
    };
    const attnResult_t r = call(lay, cfg);
    const std::string err = attnGetLastError(comm);
    const std::string what = std::string(level ? "level" : "ring") + ", variant " + std::to_string(variant) +
                             ", rank " + std::to_string(rank) + ": " + err;
    if (refuses) {
      EXPECT_EQ(r, attnInvalidArgument) << what;
    } else {
      EXPECT_EQ(r, attnRemoteError) << what;
      EXPECT_NE(err.find("rank " + std::to_string(variant % n) + " could not take part"), std::string::npos)
          << what;
    }
    ATTN_EXPECT_OK(comm, call(p.layout, AttnCfg(4, 2, 8, attnFloat32, true)));
  }
}

TEST(RingAttentionBadInput, ArgumentsRefusedOnOneRankFailEveryRankInStepThreads) {
  for (bool level : {false, true})
    RunThreads(3, [&](int rank, int n, attnComm_t& comm) { OneRankRefuses(rank, n, comm, level); },
               AttnRunOptions(60000));
}

TEST(RingAttentionBadInput, ArgumentsRefusedOnOneRankFailEveryRankInStepNonBlocking) {
  attnConfig_t ccfg = ATTN_CONFIG_INITIALIZER;
  ccfg.blocking = 0;
  RunOptions o = AttnRunOptions(60000);
  o.config = &ccfg;
  RunThreads(2, [&](int rank, int, attnComm_t& comm) {
    // A refused call returns its error at once; the exchange that tells the
    // peer is queued like the call, and the peer's call fails when it runs.
    attnAttnConfig_t cfg = AttnCfg(4, 2, 8, attnFloat32, true);
    if (rank == 1) cfg.head_dim = 300;
    SmallProblem p(4, 2, 8);
    const attnResult_t r = attnRingAttention(p.q.data(), p.k.data(), p.v.data(), p.out.data(), p.lse.data(),
                                             &p.layout, &cfg, attnModePassKV, comm, nullptr);
    if (rank == 1) {
      EXPECT_EQ(r, attnInvalidArgument) << attnGetLastError(comm);
    } else {
      EXPECT_EQ(r, attnInProgress) << attnGetLastError(comm);
    }
    attnResult_t async = attnInProgress;
    while (async == attnInProgress) ASSERT_EQ(attnCommGetAsyncError(comm, &async), attnSuccess);
    if (rank == 1) EXPECT_EQ(async, attnSuccess) << attnGetLastError(comm);
    else EXPECT_EQ(async, attnRemoteError) << attnGetLastError(comm);
  }, o);
}

TEST(RingAttentionBadInput, ArgumentsRefusedOnOneRankFailEveryRankInStepProcesses) {
  RunProcesses(3, [&](int rank, int n, attnComm_t& comm) { OneRankRefuses(rank, n, comm, false); },
               AttnRunOptions(60000));
}

// Ranks disagreeing on num_seqs or mode.
TEST(RingAttentionBadInput, ModeOrNumSeqsMismatch) {
  RunThreads(2, [&](int rank, int, attnComm_t& comm) {
    attnAttnConfig_t cfg = AttnCfg(4, 2, 8, attnFloat32, true);
    SmallProblem p(4, 2, 8);
    attnResult_t r = attnRingAttention(p.q.data(), p.k.data(), p.v.data(), p.out.data(), p.lse.data(),
                                       &p.layout, &cfg, rank ? attnModePassQ : attnModePassKV, comm,
                                       nullptr);
    EXPECT_EQ(r, attnInvalidUsage) << "mode mismatch, rank " << rank << ": " << attnGetLastError(comm);
    std::vector<int32_t> qoff{0, 2, 2}, kvoff{0, 3, 3};
    attnSeqLayout_t lay = p.layout;
    if (rank == 1) {
      lay.num_seqs = 2;
      lay.q_offsets = qoff.data();
      lay.kv_offsets = kvoff.data();
    }
    r = attnRingAttention(p.q.data(), p.k.data(), p.v.data(), p.out.data(), p.lse.data(), &lay, &cfg,
                          attnModePassKV, comm, nullptr);
    EXPECT_EQ(r, attnInvalidUsage) << "num_seqs mismatch, rank " << rank << ": " << attnGetLastError(comm);
  }, AttnRunOptions(60000));
}

}  // namespace
}  // namespace attn_test
