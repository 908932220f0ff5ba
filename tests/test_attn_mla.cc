// MLA-shaped heads (issue 48 item 1): V and the output have a head dim of
// their own (cfg.head_dim_v, DeepSeek's 192 / 128), through every attention
// collective, against exact attention in double precision:
//   - every mode over the shared scenarios (planned prefill with cached
//     keys, arbitrary placement with an empty rank, contiguous shards,
//     decode), Dv below and above D, GQA, fp32 / fp16 / bf16, with a window
//     and sinks, ranks as threads and as processes;
//   - what travels: pass-KV blocks carry K rows of D and V rows of Dv,
//     exactly, nothing padded;
//   - attnLevelAttention, the engine's kernel (from a 0.4 header it gets
//     Dv; an older one is refused), and a config from a 0.3 header (V takes
//     head_dim);
//   - bad input: a V head dim outside 1..256, ranks disagreeing on it, a KV
//     pool asked for another V head dim: a clear error on every rank.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "attncomm.h"
#include "src/attn/attn_state.h"
#include "src/attn/wire.h"
#include "tests/support/attn_fixtures.h"
#include "tests/support/attn_jobs.h"
#include "tests/support/level_fixtures.h"
#include "tests/support/multirank.h"

namespace attn_test {
namespace {

attnAttnConfig_t Mla(int hq, int hkv, int d, int dv, attnDataType_t t, bool causal) {
  attnAttnConfig_t c = AttnCfg(hq, hkv, d, t, causal);
  c.head_dim_v = dv;
  return c;
}

struct MlaSet {
  std::string name;
  attnAttnConfig_t cfg;
  bool sinks;
};
std::vector<MlaSet> MlaSets() {
  attnAttnConfig_t windowed = Mla(8, 2, 24, 16, attnFloat32, true);
  windowed.window_left = 7;
  return {
      {"Dv < D, GQA fp32", Mla(8, 2, 24, 16, attnFloat32, true), false},
      {"Dv > D, MHA bf16", Mla(4, 4, 16, 40, attnBfloat16, true), false},
      {"DeepSeek 192/128 fp16", Mla(2, 1, 192, 128, attnFloat16, true), false},
      {"Dv < D, full attention", Mla(4, 2, 12, 8, attnFloat32, false), false},
      {"Dv < D + window 7 + sinks", windowed, true},
  };
}

const std::vector<attnAttnMode_t> kModes(std::begin(kAllModes), std::end(kAllModes));

class MlaThreads : public ::testing::TestWithParam<int> {};

TEST_P(MlaThreads, EveryModeEqualsReference) {
  const int n = GetParam();
  std::vector<AttnJob> jobs;
  uint64_t seed = 4800 + n;
  for (const MlaSet& f : MlaSets()) AddScenarioJobs(&jobs, f.cfg, f.sinks, n, seed++, kModes, f.name);
  if (HasFailure()) return;
  RunThreads(n, [&](int rank, int, attnComm_t& comm) { RunAttnJobs(jobs, rank, comm, "threads"); },
             AttnRunOptions());
}
INSTANTIATE_TEST_SUITE_P(N, MlaThreads, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "N" + std::to_string(info.param); });

TEST(MlaProcesses, EveryModeEqualsReference) {
  const int n = 3;
  std::vector<AttnJob> jobs;
  uint64_t seed = 4900;
  for (const MlaSet& f : MlaSets()) AddScenarioJobs(&jobs, f.cfg, f.sinks, n, seed++, kModes, f.name);
  if (HasFailure()) return;
  RunProcesses(n, [&](int rank, int, attnComm_t& comm) { RunAttnJobs(jobs, rank, comm, "processes"); },
               AttnRunOptions());
}

// Contiguous shards of 32 rows on 3 ranks: pass-KV sends each rank's block
// twice (n - 1 hops), each of 32 K rows of Hkv x D and 32 V rows of Hkv x
// Dv, to the byte; the same call with V padded to D would send more.
TEST(Mla, PassKvMovesKOfDAndVOfDv) {
  const int n = 3, hkv = 2, d = 24, dv = 8;
  const AttnCase c = MakeCase("mla bytes", PrefillSpec(Mla(4, hkv, d, dv, attnFloat32, true), {32 * n}, {0}), 71);
  const Placement pl = ContiguousPlacement(c, n);
  const attn::RowBytes kv = attn::RowBytes::two(hkv * d * sizeof(float), hkv * dv * sizeof(float));
  const uint64_t block = attn::BlockLayout::of(1, 32, kv).total;
  RunThreads(n, [&](int rank, int, attnComm_t& comm) {
    ExpectRingAttentionExact(c, pl, rank, comm, attnModePassKV, true, "pass-KV");
    EXPECT_EQ(attn::attnStateOf(comm).last.bytesSent, (n - 1) * block) << "rank " << rank;
    EXPECT_LT(block, attn::BlockLayout::of(1, 32, attn::RowBytes::two(kv.t0, kv.t0)).total);
  }, AttnRunOptions());
}

// attnLevelAttention keeping every key is exact attention, MLA-shaped too.
TEST(Mla, LevelAttention) {
  const int n = 3;
  const AttnCase c = MakeCase("level mla", PrefillSpec(Mla(8, 2, 24, 16, attnFloat32, true), {30, 4}, {6, 0}), 31);
  const Placement pl = RandomPlacement(c, n, 32, -1);
  RunThreads(n, [&](int rank, int, attnComm_t& comm) {
    RankShard sh = GatherShard(c, pl, rank);
    const size_t qn = sh.q_global.size();
    std::vector<float> out(qn * 8 * 16, NAN), lse(qn * 8, NAN);
    ATTN_EXPECT_OK(comm, attnLevelAttention(qn ? sh.q.data() : nullptr, sh.k.data(), sh.v.data(),
                                            qn ? out.data() : nullptr, qn ? lse.data() : nullptr, &sh.layout, &c.cfg,
                                            nullptr, comm, nullptr));
    EXPECT_TRUE(WithinBounds(CompareShard(c, sh, out.data(), lse.data()), attnFloat32, "level attention"));
  }, AttnRunOptions());
}

// The engine's kernel registered from a 0.4 header reads cfg->head_dim_v;
// one registered from 0.3 (or through attnCommSetAttnKernel) cannot, so an
// MLA call on it is refused on every rank, and plain calls still run.
TEST(Mla, EngineKernelGetsTheValueDimOrIsRefused) {
  const int n = 2;
  const AttnCase c = MakeCase("engine mla", PrefillSpec(Mla(4, 2, 16, 8, attnFloat32, true), {20}, {5}), 41);
  const AttnCase plain = MakeCase("engine plain", PrefillSpec(AttnCfg(4, 2, 16, attnFloat32, true), {20}, {5}), 42);
  const Placement pl = RandomPlacement(c, n, 43, -1);
  RunThreads(n, [&](int rank, int, attnComm_t& comm) {
    attnAttnKernel_t k = ATTN_ATTN_KERNEL(LoopAttentionKernel, nullptr, attnFloat32, attnLseNatural,
                                          attnLseTokenMajor);
    ASSERT_EQ(attnCommSetAttnKernelEx(comm, &k), attnSuccess);
    for (attnAttnMode_t m : {attnModePassKV, attnModePassQ, attnModeShipQ, attnModeHeadParallel})
      ExpectRingAttentionExact(c, pl, rank, comm, m, true, "0.4 engine kernel");
    k.version = ATTN_VERSION(0, 3, 0);
    ASSERT_EQ(attnCommSetAttnKernelEx(comm, &k), attnSuccess);
    const RankRun run = RunRingAttentionRank(c, pl, rank, comm, attnModePassQ, true);
    EXPECT_EQ(run.rc, attnNotSupported) << run.error;
    EXPECT_NE(run.error.find("head_dim_v"), std::string::npos) << run.error;
    ExpectRingAttentionExact(plain, pl, rank, comm, attnModeShipQ, true, "0.3 kernel, plain call");
    ASSERT_EQ(attnCommSetAttnKernel(comm, nullptr, nullptr), attnSuccess);
    ExpectRingAttentionExact(c, pl, rank, comm, attnModePassKV, true, "built-in again");
  }, AttnRunOptions());
}

// A small problem: 4 rows, heads 4/2, D 8, Dv 4.
struct SmallMla {
  std::vector<float> q, k, v, out, lse;
  std::vector<int32_t> qo{0, 4}, ko{0, 4}, qp{0, 1, 2, 3}, kp{0, 1, 2, 3};
  attnSeqLayout_t layout{};
  SmallMla() : q(4 * 4 * 8, 0.5f), k(4 * 2 * 8, 0.25f), v(4 * 2 * 8, 1.0f), out(4 * 4 * 8), lse(4 * 4) {
    layout = {1, qo.data(), qp.data(), ko.data(), kp.data()};
  }
  attnResult_t run(attnComm_t comm, const attnAttnConfig_t& cfg, attnAttnMode_t m) {
    return attnRingAttention(q.data(), k.data(), v.data(), out.data(), lse.data(), &layout, &cfg, m, comm, nullptr);
  }
};

TEST(MlaBadInput, ValueDimOutsideRangeFailsEveryRankInStep) {
  RunThreads(3, [&](int rank, int n, attnComm_t& comm) {
    const int bad[] = {257, -1, 100000};
    for (int variant = 0; variant < 3; ++variant) {
      SmallMla p;
      attnAttnConfig_t cfg = Mla(4, 2, 8, 4, attnFloat32, true);
      const int refuser = variant % n;
      if (rank == refuser) cfg.head_dim_v = bad[variant];
      const attnResult_t r = p.run(comm, cfg, attnModePassKV);
      const std::string err = attnGetLastError(comm);
      const std::string what = "variant " + std::to_string(variant) + ", rank " + std::to_string(rank) + ": " + err;
      if (rank == refuser) {
        EXPECT_EQ(r, attnInvalidArgument) << what;
        EXPECT_NE(err.find("head_dim_v"), std::string::npos) << what;
      } else {
        EXPECT_EQ(r, attnRemoteError) << what;
      }
      ATTN_EXPECT_OK(comm, p.run(comm, Mla(4, 2, 8, 4, attnFloat32, true), attnModeShipQ));
    }
  }, AttnRunOptions(60000));
}

TEST(MlaBadInput, RanksDisagreeingOnTheValueDimFailAll) {
  RunThreads(2, [&](int rank, int, attnComm_t& comm) {
    SmallMla p;
    const attnResult_t r = p.run(comm, Mla(4, 2, 8, rank == 1 ? 8 : 4, attnFloat32, true), attnModeAuto);
    const std::string err = attnGetLastError(comm);
    EXPECT_EQ(r, attnInvalidUsage) << err;
    EXPECT_NE(err.find("8/4"), std::string::npos) << err;  // rank 0's D/Dv, named on both ranks
    ATTN_EXPECT_OK(comm, p.run(comm, Mla(4, 2, 8, 4, attnFloat32, true), attnModePassQ));
  }, AttnRunOptions(60000));
}

// A config from a 0.3 header has no head_dim_v: V takes head_dim, and a
// value past the caller's size is never read (the call equals one with V of
// head_dim).
TEST(Mla, OlderConfigKeepsOneHeadDim) {
  RunThreads(2, [&](int rank, int, attnComm_t& comm) {
    (void)rank;
    SmallMla now, old;
    for (size_t i = 0; i < now.v.size(); ++i) now.v[i] = old.v[i] = float(i % 7) * 0.25f;
    ATTN_EXPECT_OK(comm, now.run(comm, Mla(4, 2, 8, 0, attnFloat32, true), attnModePassKV));
    attnAttnConfig_t cfg = Mla(4, 2, 8, 3, attnFloat32, true);
    cfg.size = offsetof(attnAttnConfig_t, head_dim_v);
    ATTN_EXPECT_OK(comm, old.run(comm, cfg, attnModePassKV));
    EXPECT_EQ(now.out, old.out);
    EXPECT_EQ(now.lse, old.lse);
  }, AttnRunOptions(60000));
}

// A KV pool holds V rows of its head_dim: an attention call on it asking
// for another V head dim is refused on every rank, before anything moves.
TEST(MlaBadInput, KvPoolRefusesAnotherValueDim) {
  RunThreads(2, [&](int rank, int, attnComm_t& comm) {
    attnKvPoolConfig_t pc{4, 2, 8, attnFloat32, 8};
    attnKvPool_t pool = nullptr;
    ASSERT_EQ(attnKvPoolCreate(comm, &pc, &pool), attnSuccess);
    std::vector<float> k(4 * 2 * 8, 0.5f), v(k);
    const int32_t pos[4] = {4 * rank, 4 * rank + 1, 4 * rank + 2, 4 * rank + 3};
    ASSERT_EQ(attnKvAppend(pool, 1, k.data(), v.data(), pos, 4, nullptr), attnSuccess);
    std::vector<float> q(4 * 8, 0.5f), out(4 * 8);
    const int64_t reqs[1] = {1};
    const int32_t qpos[1] = {100};
    const int32_t qoff[2] = {0, 1};
    const attnAttnConfig_t cfg = Mla(4, 2, 8, 4, attnFloat32, true);
    const attnResult_t r = attnKvAttention(pool, 1, reqs, qoff, q.data(), qpos, out.data(), nullptr, &cfg, nullptr);
    const std::string err = attnGetLastError(comm);
    EXPECT_NE(r, attnSuccess) << err;
    if (r == attnInvalidArgument) EXPECT_NE(err.find("head_dim_v"), std::string::npos) << err;
    EXPECT_EQ(attnKvPoolDestroy(pool), attnSuccess);
  }, AttnRunOptions(60000));
}

}  // namespace
}  // namespace attn_test
