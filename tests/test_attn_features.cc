// Sliding windows, softcap and attention sinks (issue 48 items 2-4) through
// the attention collectives, against exact attention in double precision
// extended to the same feature (tests/support/attn_fixtures: the kernel
// reference with the window and the cap, the sinks added to each row's
// denominator), in every mode, ranks as threads and as processes:
//   - windows left-only, two-sided, causal and not, window 0, windows wider
//     than the sequence; softcap; sinks; window + sinks + GQA; window +
//     causal + partial prefill with cached keys; decode steps;
//   - placements: the planner's, arbitrary (a rank holding nothing), and
//     contiguous shards a narrow window hides from most ranks;
//   - attnLevelAttention (keeping every key: exact) and the engine's kernel
//     registered from a 0.3 header;
//   - bad input: a bad window, softcap or sink, a window without positions,
//     ranks disagreeing on the window, an engine kernel that cannot apply a
//     window: a clear error on every rank, in step.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attncomm.h"
#include "src/attn/attn_state.h"
#include "src/attn/visibility.h"
#include "src/attn/wire.h"
#include "tests/support/attn_fixtures.h"
#include "tests/support/attn_jobs.h"
#include "tests/support/level_fixtures.h"
#include "tests/support/multirank.h"

namespace attn_test {
namespace {

attnAttnConfig_t With(attnAttnConfig_t c, int left, int right, float softcap) {
  c.window_left = left;
  c.window_right = right;
  c.softcap = softcap;
  return c;
}

// The feature sets every mode is checked with.
struct FeatureSet {
  std::string name;
  attnAttnConfig_t cfg;
  bool sinks;
};
std::vector<FeatureSet> FeatureSets() {
  const attnAttnConfig_t gqa = AttnCfg(8, 2, 16, attnFloat32, true);
  const attnAttnConfig_t mha = AttnCfg(4, 4, 8, attnFloat32, true);
  const attnAttnConfig_t full = AttnCfg(4, 2, 8, attnFloat32, false);
  const attnAttnConfig_t bf16 = AttnCfg(8, 2, 32, attnBfloat16, true);
  return {
      {"causal window 5", With(mha, 5, -1, 0), false},
      {"full window (3, 2)", With(full, 3, 2, 0), false},
      {"full right-only window 1", With(full, -1, 1, 0), false},
      {"causal window 0 (self only)", With(mha, 0, -1, 0), false},
      {"causal window wider than the sequence", With(mha, 100000, -1, 0), false},
      {"softcap 2", With(gqa, -1, -1, 2.0f), false},
      {"sinks", gqa, true},
      {"window 7 + sinks + GQA", With(gqa, 7, -1, 0), true},
      {"window + softcap + sinks bf16", With(bf16, 9, -1, 5.0f), true},
  };
}

const std::vector<attnAttnMode_t> kModes(std::begin(kAllModes), std::end(kAllModes));

class AttnFeaturesThreads : public ::testing::TestWithParam<int> {};

TEST_P(AttnFeaturesThreads, EveryModeEqualsReference) {
  const int n = GetParam();
  std::vector<AttnJob> jobs;
  uint64_t seed = 700 + n;
  for (const FeatureSet& f : FeatureSets()) AddScenarioJobs(&jobs, f.cfg, f.sinks, n, seed++, kModes, f.name);
  if (HasFailure()) return;
  RunThreads(n, [&](int rank, int, attnComm_t& comm) { RunAttnJobs(jobs, rank, comm, "threads"); }, AttnRunOptions());
}
INSTANTIATE_TEST_SUITE_P(N, AttnFeaturesThreads, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "N" + std::to_string(info.param); });

TEST(AttnFeaturesProcesses, EveryModeEqualsReference) {
  const int n = 3;
  std::vector<AttnJob> jobs;
  uint64_t seed = 900;
  for (const FeatureSet& f : FeatureSets()) AddScenarioJobs(&jobs, f.cfg, f.sinks, n, seed++, kModes, f.name);
  if (HasFailure()) return;
  RunProcesses(n, [&](int rank, int, attnComm_t& comm) { RunAttnJobs(jobs, rank, comm, "processes"); },
               AttnRunOptions());
}

// Gemma / Mistral alternate windowed and global layers: the window changes
// from one call to the next on the same communicator.
TEST(AttnFeatures, WindowChangesPerCall) {
  const int n = 3;
  const attnAttnConfig_t base = AttnCfg(4, 2, 16, attnFloat32, true);
  std::vector<std::shared_ptr<AttnCase>> cases;
  const std::vector<int32_t> T = {40}, P = {8};
  for (int layer = 0; layer < 4; ++layer) {
    const attnAttnConfig_t cfg = layer % 2 ? base : With(base, 6, -1, 0);
    cases.push_back(std::make_shared<AttnCase>(
        MakeCase("layer " + std::to_string(layer), PrefillSpec(cfg, T, P), MixSeed(77, layer))));
  }
  const Placement pl = PlannerPlacement(*cases[0], T, P, n);
  RunThreads(n, [&](int rank, int, attnComm_t& comm) {
    for (attnAttnMode_t m : {attnModePassKV, attnModeShipQ})
      for (auto& c : cases) ExpectRingAttentionExact(*c, pl, rank, comm, m, true, "alternating layers");
  }, AttnRunOptions());
}

// Contiguous shards of one sequence on 4 ranks and a window narrower than
// a shard: rank r's queries see only ranks r - 1 and r. Pass-KV then sends
// each block one hop (the last rank's none: its keys are in every other
// rank's future) instead of three, and only its last 20 rows (all the next
// rank's window reaches); pass-Q's ring turns backwards, so queries go one
// hop too; ship-Q and all-gather KV send to the one rank that needs it.
// Results stay exact.
TEST(AttnFeatures, HiddenBlocksAreNotSent) {
  const int n = 4, len = 64 * n;
  const attnAttnConfig_t causal = AttnCfg(4, 2, 16, attnFloat32, true);
  const std::vector<int32_t> T = {len}, P = {0};
  const AttnCase none = MakeCase("no window", PrefillSpec(causal, T, P), 61);
  const AttnCase win = MakeCase("window 20", PrefillSpec(With(causal, 20, -1, 0), T, P), 61);
  const Placement pl = ContiguousPlacement(none, n);
  RunThreads(n, [&](int rank, int, attnComm_t& comm) {
    for (attnAttnMode_t m : {attnModePassKV, attnModePassQ, attnModeShipQ, attnModeAllGatherKV}) {
      const std::string what = std::string(ModeName(m)) + ", rank " + std::to_string(rank);
      ExpectRingAttentionExact(none, pl, rank, comm, m, true, "no window");
      const uint64_t all = attn::attnStateOf(comm).last.bytesSent;
      ExpectRingAttentionExact(win, pl, rank, comm, m, true, "window");
      const uint64_t some = attn::attnStateOf(comm).last.bytesSent;
      if (m == attnModePassKV) {
        const size_t rowBytes = 2 * 16 * sizeof(float);  // Hkv x D fp32
        const attn::RowBytes kv = attn::RowBytes::two(rowBytes, rowBytes);
        const uint64_t trimmed = attn::BlockLayout::of(1, 20, kv).total;
        EXPECT_EQ(some, rank == n - 1 ? 0u : trimmed) << what << ": " << some << " of " << all;
        EXPECT_EQ(all, 3 * attn::BlockLayout::of(1, 64, kv).total) << what;
      } else if (m == attnModePassQ) {
        // The ring turns backwards: our queries go one hop, to the rank
        // before ours (rank 0's nowhere), and we send home the partial of
        // the next rank's queries over our keys (the last rank none).
        const uint64_t block = attn::BlockLayout::of(1, 64, attn::RowBytes::one(4 * 16 * sizeof(float))).total;
        const uint64_t partial = 64 * 4 * (16 + 1) * sizeof(float);
        EXPECT_EQ(some, (rank > 0 ? block : 0) + (rank < n - 1 ? partial : 0)) << what << ": " << some << " of " << all;
      } else {
        EXPECT_LT(some, all) << what;
        EXPECT_LE(some, 2 * all / (n - 1)) << what << ": " << some << " of " << all;
      }
    }
  }, AttnRunOptions());
}

// The ring's direction from the cards alone: contiguous shards of 64
// positions under a causal window of 20 need keys one rank forward and
// queries one rank back; without a window every block goes all the way.
TEST(AttnFeatures, RingTurnsTheWayItsBlocksMoveLeast) {
  std::vector<attn::PosRanges> ranges;
  for (int r = 0; r < 4; ++r) ranges.push_back({64 * r, 64 * r + 63, 64 * r, 64 * r + 63});
  const attn::RankVisibility win(With(AttnCfg(4, 2, 16, attnFloat32, true), 20, -1, 0), ranges);
  EXPECT_EQ(win.ringDirection(false), 1);
  EXPECT_EQ(win.ringDirection(true), -1);
  EXPECT_EQ(win.ringMovesMax(false), 1);
  EXPECT_EQ(win.ringMovesMax(true), 1);
  EXPECT_TRUE(win.ringMoves(2, 0, true, -1));    // rank 2's queries to rank 1
  EXPECT_FALSE(win.ringMoves(1, 1, true, -1));   // and no further
  EXPECT_FALSE(win.ringMoves(0, 0, true, -1));   // rank 0's queries see only its own keys
  // A right-only window (not causal) mirrors it.
  const attn::RankVisibility right(With(AttnCfg(4, 2, 16, attnFloat32, false), 0, 20, 0), ranges);
  EXPECT_EQ(right.ringDirection(false), -1);
  EXPECT_EQ(right.ringDirection(true), 1);
  const attn::RankVisibility none(AttnCfg(4, 2, 16, attnFloat32, true), ranges);
  EXPECT_EQ(none.ringDirection(true), 1);
  EXPECT_EQ(none.ringMovesMax(true), 3);
}

// attnLevelAttention keeping every key is exact attention: the window and
// sinks apply there too.
TEST(AttnFeatures, LevelAttentionWithWindowSoftcapAndSinks) {
  const int n = 3;
  AttnProblemSpec s = PrefillSpec(With(AttnCfg(8, 2, 16, attnFloat32, true), 5, -1, 3.0f), {30, 4}, {6, 0});
  s.sinks = RandomSinks(8, 5);
  const AttnCase c = MakeCase("level", s, 31);
  const Placement pl = RandomPlacement(c, n, 32, -1);
  RunThreads(n, [&](int rank, int, attnComm_t& comm) {
    RankShard sh = GatherShard(c, pl, rank);
    const size_t qn = sh.q_global.size();
    std::vector<float> out(qn * 8 * 16, NAN), lse(qn * 8, NAN);
    const attnAttnConfig_t cfg = c.runCfg();
    ATTN_EXPECT_OK(comm, attnLevelAttention(qn ? sh.q.data() : nullptr, sh.k.data(), sh.v.data(),
                                            qn ? out.data() : nullptr, qn ? lse.data() : nullptr, &sh.layout, &cfg,
                                            nullptr, comm, nullptr));
    EXPECT_TRUE(WithinBounds(CompareShard(c, sh, out.data(), lse.data()), attnFloat32, "level attention"));
  }, AttnRunOptions());
}

// Level attention keeping every key under a window narrower than a shard
// (contiguous shards): each rank sends only the keys some peer's queries
// may see, fewer than without the window, and the result stays exact.
TEST(AttnFeatures, LevelAttentionSendsOnlyKeysAWindowShows) {
  const int n = 3, len = 48 * n;
  const attnAttnConfig_t causal = AttnCfg(4, 2, 16, attnFloat32, true);
  const AttnCase none = MakeCase("level, no window", PrefillSpec(causal, {len}, {0}), 51);
  const AttnCase win = MakeCase("level, window 10", PrefillSpec(With(causal, 10, -1, 0), {len}, {0}), 51);
  const Placement pl = ContiguousPlacement(none, n);
  RunThreads(n, [&](int rank, int, attnComm_t& comm) {
    int64_t sent[2] = {0, 0};
    for (int w = 0; w < 2; ++w) {
      const AttnCase& c = w ? win : none;
      RankShard sh = GatherShard(c, pl, rank);
      const size_t qn = sh.q_global.size();
      std::vector<float> out(qn * 4 * 16, NAN), lse(qn * 4, NAN);
      ATTN_EXPECT_OK(comm, attnLevelAttention(sh.q.data(), sh.k.data(), sh.v.data(), out.data(), lse.data(),
                                              &sh.layout, &c.cfg, nullptr, comm, nullptr));
      EXPECT_TRUE(WithinBounds(CompareShard(c, sh, out.data(), lse.data()), attnFloat32, c.name));
      sent[w] = attn::attnStateOf(comm).last.rowsSent;
    }
    // Without a window a rank sends every key to each rank after it (the
    // causal bound); with it, only its last 10 keys to the next rank.
    EXPECT_EQ(sent[0], int64_t(48) * (n - 1 - rank)) << "rank " << rank;
    EXPECT_EQ(sent[1], rank == n - 1 ? 0 : 10) << "rank " << rank;
  }, AttnRunOptions());
}

// The engine's kernel from a 0.3 header reads the window and the cap from
// cfg; one set through attnCommSetAttnKernel cannot, so a windowed call is
// refused on every rank (and the communicator stays usable).
TEST(AttnFeatures, EngineKernelWindowsAndRefusal) {
  const int n = 2;
  AttnProblemSpec s = PrefillSpec(With(AttnCfg(4, 2, 8, attnFloat32, true), 4, -1, 2.0f), {20}, {5});
  s.sinks = RandomSinks(4, 9);
  const AttnCase c = MakeCase("engine kernel", s, 41);
  const Placement pl = RandomPlacement(c, n, 42, -1);
  RunThreads(n, [&](int rank, int, attnComm_t& comm) {
    const attnAttnKernel_t k = ATTN_ATTN_KERNEL(LoopAttentionKernel, nullptr, attnFloat32, attnLseNatural,
                                                attnLseTokenMajor);
    ASSERT_EQ(attnCommSetAttnKernelEx(comm, &k), attnSuccess);
    for (attnAttnMode_t m : {attnModePassKV, attnModePassQ, attnModeShipQ, attnModeHeadParallel})
      ExpectRingAttentionExact(c, pl, rank, comm, m, true, "0.3 engine kernel");
    ASSERT_EQ(attnCommSetAttnKernel(comm, LoopAttentionKernel, nullptr), attnSuccess);
    const RankRun run = RunRingAttentionRank(c, pl, rank, comm, attnModePassKV, true);
    EXPECT_EQ(run.rc, attnNotSupported) << run.error;
    EXPECT_NE(run.error.find("attnCommSetAttnKernelEx"), std::string::npos) << run.error;
    // A call without window or cap still runs on it.
    AttnProblemSpec plain = PrefillSpec(AttnCfg(4, 2, 8, attnFloat32, true), {20}, {5});
    const AttnCase pc = MakeCase("plain", plain, 43);
    ExpectRingAttentionExact(pc, RandomPlacement(pc, n, 44, -1), rank, comm, attnModeShipQ, true, "legacy kernel");
    ASSERT_EQ(attnCommSetAttnKernel(comm, nullptr, nullptr), attnSuccess);
    ExpectRingAttentionExact(c, pl, rank, comm, attnModePassQ, true, "built-in again");
  }, AttnRunOptions());
}

// A small problem every rank holds a slice of, for the bad-input tests.
struct Small {
  std::vector<float> q, k, v, out, lse;
  std::vector<int32_t> qo{0, 4}, ko{0, 4}, qp{0, 1, 2, 3}, kp{0, 1, 2, 3};
  attnSeqLayout_t layout{};
  Small() : q(4 * 4 * 8, 0.5f), k(4 * 2 * 8, 0.25f), v(4 * 2 * 8, 1.0f), out(4 * 4 * 8), lse(4 * 4) {
    layout = {1, qo.data(), qp.data(), ko.data(), kp.data()};
  }
  attnResult_t run(attnComm_t comm, const attnAttnConfig_t& cfg, const attnSeqLayout_t& l, attnAttnMode_t m) {
    return attnRingAttention(q.data(), k.data(), v.data(), out.data(), lse.data(), &l, &cfg, m, comm, nullptr);
  }
};

TEST(AttnFeaturesBadInput, RefusedOnOneRankFailsEveryRankInStep) {
  RunThreads(3, [&](int rank, int n, attnComm_t& comm) {
    const float nanSinks[4] = {0, NAN, 0, 0};
    for (int variant = 0; variant < 6; ++variant) {
      Small p;
      attnAttnConfig_t cfg = With(AttnCfg(4, 2, 8, attnFloat32, false), 2, -1, 0);
      attnSeqLayout_t lay = p.layout;
      const int refuser = variant % n;
      const char* expect = "";
      if (rank == refuser) {
        switch (variant) {
          case 0: cfg.window_left = -2; expect = "window_left -2"; break;
          case 1: cfg.window_right = -7; expect = "window_right -7"; break;
          case 2: cfg.softcap = NAN; expect = "softcap"; break;
          case 3: cfg.softcap = -1; expect = "softcap"; break;
          case 4: cfg.sinks = nanSinks; expect = "cfg.sinks[1]"; break;
          case 5: lay.kv_pos = nullptr; expect = "windowed attention needs"; break;  // not causal, windowed
        }
      }
      const attnResult_t r = p.run(comm, cfg, lay, attnModePassKV);
      const std::string err = attnGetLastError(comm);
      const std::string what = "variant " + std::to_string(variant) + ", rank " + std::to_string(rank) + ": " + err;
      if (rank == refuser) {
        EXPECT_EQ(r, attnInvalidArgument) << what;
        EXPECT_NE(err.find(expect), std::string::npos) << what;
      } else {
        EXPECT_EQ(r, attnRemoteError) << what;
      }
      ATTN_EXPECT_OK(comm, p.run(comm, With(AttnCfg(4, 2, 8, attnFloat32, true), 2, -1, 0), p.layout, attnModeShipQ));
    }
  }, AttnRunOptions(60000));
}

TEST(AttnFeaturesBadInput, RanksDisagreeingOnTheWindowOrSinksFailAll) {
  RunThreads(2, [&](int rank, int, attnComm_t& comm) {
    const float sinks[4] = {0.5f, 0.5f, 0.5f, 0.5f};
    for (int variant = 0; variant < 3; ++variant) {
      Small p;
      attnAttnConfig_t cfg = With(AttnCfg(4, 2, 8, attnFloat32, true), 3, -1, 0);
      if (rank == 1) {
        if (variant == 0) cfg.window_left = 4;
        if (variant == 1) cfg.softcap = 10;
        if (variant == 2) cfg.sinks = sinks;
      }
      const attnResult_t r = p.run(comm, cfg, p.layout, attnModeAuto);
      const std::string err = attnGetLastError(comm);
      EXPECT_EQ(r, attnInvalidUsage) << "variant " << variant << ": " << err;
      EXPECT_NE(err.find("same window"), std::string::npos) << err;
      ATTN_EXPECT_OK(comm, p.run(comm, With(AttnCfg(4, 2, 8, attnFloat32, true), 3, -1, 0), p.layout,
                                 attnModePassQ));
    }
  }, AttnRunOptions(60000));
}

// A config from a 0.2 header (no window, softcap or sinks fields) keeps
// 0.2's behaviour: the fields it lacks take their defaults.
TEST(AttnFeatures, OlderConfigTakesDefaults) {
  RunThreads(2, [&](int rank, int, attnComm_t& comm) {
    (void)rank;
    Small p;
    attnAttnConfig_t cfg = AttnCfg(4, 2, 8, attnFloat32, true);
    cfg.size = offsetof(attnAttnConfig_t, window_left);
    cfg.window_left = -55;  // past the caller's size: never read
    cfg.softcap = NAN;
    ATTN_EXPECT_OK(comm, p.run(comm, cfg, p.layout, attnModePassKV));
  }, AttnRunOptions(60000));
}

}  // namespace
}  // namespace attn_test
