// attnLevelAttention (CSPS §3.2.4, level-aware all-to-all with token
// dropping) against attention in double precision over exactly the keys
// each rank should see: its own keys, and from every peer the keys that
// peer keeps for the tier between them (the test picks them itself, from
// the importance scores, with the rule the header documents).
//   - keep everything (drop NULL, or every keep 1): exact attention over the
//     whole unsharded input, on threads and processes, causal and not,
//     GQA, fp32 and bf16, several sequences, a rank with no rows;
//   - dropping between threads (one host: every peer at the host tier), and
//     between processes on emulated hosts and racks (ATTN_HOSTID /
//     ATTN_RACKID), each tier with its own keep;
//   - dropped keys are not sent: the rows and bytes a rank sends are those
//     of the kept keys;
//   - the selection rule itself (keptCount, selectKept);
//   - a user kernel through attnCommSetAttnKernel;
//   - bad input: clear errors on every rank, no hang.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attncomm.h"
#include "kernels/cpu/reference_attention.h"
#include "src/attn/attn_state.h"
#include "src/attn/level_routes.h"
#include "src/attn/level_select.h"
#include "tests/support/attn_fixtures.h"
#include "tests/support/level_fixtures.h"
#include "tests/support/multirank.h"

namespace attn_test {
namespace {

// How many of the global key rows `keys` a rank holding pl.q_rows[peer]
// can use: its queries of the key's sequence include one at or after the
// key (causal) or any (not causal). The others are never sent.
int64_t UsableBy(const AttnCase& c, const Placement& pl, int peer, const std::vector<int64_t>& keys) {
  int64_t n = 0;
  for (int64_t g : keys)
    for (int64_t qr : pl.q_rows[peer])
      if (c.q_seq[qr] == c.kv_seq[g] && (!c.cfg.causal || c.q_pos[qr] >= c.kv_pos[g])) {
        ++n;
        break;
      }
  return n;
}

struct LevelRun {
  attnResult_t rc = attnSuccess;
  std::string error;
  AttnErrorStats stats;
  attn::AttnCallStats call;
};

// One attnLevelAttention call on this rank, compared with `ref`'s rows.
LevelRun RunLevelRank(const AttnCase& c, const AttnCase& ref, const Placement& pl, int rank,
                      attnComm_t comm, const attnLevelDrop_t* drop, const std::vector<float>* imp) {
  LevelRun run;
  RankShard sh = GatherShard(c, pl, rank);
  std::vector<float> localImp;
  attnLevelDrop_t d{};
  if (drop) {
    d = *drop;
    if (imp) {
      for (int64_t g : pl.kv_rows[rank]) localImp.push_back((*imp)[g]);
      d.importance = localImp.data();
    }
  }
  const size_t qn = sh.q_global.size();
  std::vector<uint8_t> out(qn * c.cfg.num_q_heads * c.cfg.head_dim * AttnElemSize(c.cfg.dtype), 0xFF);
  std::vector<float> lse(qn * c.cfg.num_q_heads, std::numeric_limits<float>::quiet_NaN());
  const bool noQ = qn == 0, noKv = sh.kv_pos.empty();
  run.rc = attnLevelAttention(noQ ? nullptr : sh.q.data(), noKv ? nullptr : sh.k.data(),
                              noKv ? nullptr : sh.v.data(), noQ ? nullptr : out.data(),
                              noQ ? nullptr : lse.data(), &sh.layout, &c.cfg, drop ? &d : nullptr,
                              comm, nullptr);
  if (run.rc != attnSuccess) {
    run.error = attnGetLastError(comm);
    return run;
  }
  run.stats = CompareShard(ref, sh, out.data(), lse.data());
  run.call = attn::attnStateOf(comm).last;
  return run;
}

void ExpectLevelExact(const AttnCase& c, const AttnCase& ref, const Placement& pl, int rank,
                      attnComm_t comm, const attnLevelDrop_t* drop, const std::vector<float>* imp,
                      const std::string& what, LevelRun* out = nullptr) {
  LevelRun run = RunLevelRank(c, ref, pl, rank, comm, drop, imp);
  const std::string where = what + " [" + c.name + ", " + CfgName(c.cfg) + ", rank " +
                            std::to_string(rank) + "/" + std::to_string(pl.nranks) + "]";
  EXPECT_EQ(run.rc, attnSuccess) << where << ": " << run.error;
  if (run.rc == attnSuccess) {
    EXPECT_TRUE(WithinBounds(run.stats, c.cfg.dtype, where));
  }
  if (out) *out = run;
}

// ---------------------------------------------------------------------------
// The selection rule

TEST(LevelSelect, KeptCountRoundsToNearestWithAtLeastOne) {
  EXPECT_EQ(attn::keptCount(10, 0.1f), 1);  // 0.1f is a hair above 0.1
  EXPECT_EQ(attn::keptCount(10, 0.25f), 3);
  EXPECT_EQ(attn::keptCount(10, 0.24f), 2);
  EXPECT_EQ(attn::keptCount(3, 0.01f), 1);  // at least one
  EXPECT_EQ(attn::keptCount(3, 0.0f), 0);
  EXPECT_EQ(attn::keptCount(0, 0.5f), 0);
  EXPECT_EQ(attn::keptCount(7, 1.0f), 7);
  for (int64_t n : {1, 2, 5, 17, 1000})
    for (float k : {0.0f, 0.01f, 0.1f, 0.3f, 0.5f, 0.77f, 0.99f, 1.0f})
      EXPECT_EQ(attn::keptCount(n, k), ExpectedKept(n, k)) << n << " " << k;
}

TEST(LevelSelect, BoundCoversEveryBatch) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    const int seqs = 1 + static_cast<int>(rng() % 6);
    std::vector<int32_t> off(seqs + 1, 0);
    for (int s = 0; s < seqs; ++s) off[s + 1] = off[s] + static_cast<int32_t>(rng() % 40);
    const float keep = static_cast<float>(rng() % 1001) / 1000.0f;
    int64_t total = 0;
    for (int s = 0; s < seqs; ++s) total += attn::keptCount(off[s + 1] - off[s], keep);
    EXPECT_LE(total, attn::keptBound(off[seqs], seqs, keep)) << "keep " << keep;
    EXPECT_LE(attn::keptBound(off[seqs], seqs, keep), off[seqs]);
  }
}

TEST(LevelSelect, HighestScoresPerSequenceInRowOrderTiesToEarlierRowNaNLowest) {
  const int32_t off[] = {0, 5, 5, 9};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  //                 seq 0: rows 0..4              seq 2: rows 5..8
  const float imp[] = {0.5f, 0.9f, 0.5f, nan, 0.1f, 2.0f, 2.0f, 2.0f, 3.0f};
  attn::KeptRows k = attn::selectKept(3, off, imp, 0.5f);  // 3 of 5 (round 2.5 up), 0, 2 of 4
  EXPECT_EQ(k.offsets, (std::vector<int32_t>{0, 3, 3, 5}));
  // Seq 0: 0.9 (row 1), then the tie 0.5 at rows 0 and 2: both kept; NaN and 0.1 dropped.
  // Seq 2: 3.0 (row 8), then the tie at 2.0: the earlier row (5) wins.
  EXPECT_EQ(k.rows, (std::vector<int32_t>{0, 1, 2, 5, 8}));
  attn::KeptRows one = attn::selectKept(3, off, imp, 0.2f);  // 1 of 5, 0, 1 of 4
  EXPECT_EQ(one.rows, (std::vector<int32_t>{1, 8}));
  attn::KeptRows all = attn::selectKept(3, off, nullptr, 1.0f);
  EXPECT_EQ(all.rows.size(), 9u);
  attn::KeptRows none = attn::selectKept(3, off, imp, 0.0f);
  EXPECT_EQ(none.offsets, (std::vector<int32_t>{0, 0, 0, 0}));
}

// Every rank gets every other rank's block exactly once, along a path of at
// most three hops, and each block enters another rack, and another host,
// exactly once.
TEST(LevelRoutes, EveryRankReachedOnceEachBoundaryCrossedOnce) {
  const std::vector<std::string> host = {"a", "b", "b", "c", "c", "d", "e", "e", "e"};
  const std::vector<std::string> rack = {"r0", "r0", "r0", "r1", "r1", "r1", "", "", ""};
  const int n = static_cast<int>(host.size());
  attn::LevelRoutes routes(host, rack);
  auto rackKey = [&](int r) { return rack[r].empty() ? "host " + host[r] : rack[r]; };
  for (int s = 0; s < n; ++s) {
    std::vector<int> reached(n, 0);
    std::vector<std::string> racksEntered, hostsEntered;
    for (int r = 0; r < n; ++r) {
      if (r == s) continue;
      int hops = 0;
      for (int x = r; x != s; x = routes.parent(s, x)) ASSERT_LT(++hops, 4) << "s " << s << " r " << r;
      const int p = routes.parent(s, r);
      if (rackKey(p) != rackKey(r)) racksEntered.push_back(rackKey(r));
      if (host[p] != host[r]) hostsEntered.push_back(host[r]);
      // children() is the inverse of parent().
      const std::vector<int> kids = routes.children(s, p);
      EXPECT_NE(std::find(kids.begin(), kids.end(), r), kids.end()) << "s " << s << " r " << r;
      ++reached[routes.firstHop(s, r)];
    }
    for (const std::string& k : racksEntered)
      EXPECT_EQ(std::count(racksEntered.begin(), racksEntered.end(), k), 1) << "s " << s << " rack " << k;
    for (const std::string& h : hostsEntered)
      EXPECT_EQ(std::count(hostsEntered.begin(), hostsEntered.end(), h), 1) << "s " << s << " host " << h;
    // s sends one block per first hop: one per host mate, per other host of
    // its rack and per other rack.
    int firstHops = 0;
    for (int r = 0; r < n; ++r) firstHops += reached[r] > 0;
    std::vector<std::string> groups;
    for (int r = 0; r < n; ++r) {
      if (r == s) continue;
      const std::string g = host[r] == host[s] ? "rank " + std::to_string(r)
                            : rackKey(r) == rackKey(s) ? "host " + host[r] : rackKey(r);
      if (std::find(groups.begin(), groups.end(), g) == groups.end()) groups.push_back(g);
    }
    EXPECT_EQ(firstHops, static_cast<int>(groups.size())) << "s " << s;
  }
}

// ---------------------------------------------------------------------------
// Keeping everything: exact attention

std::vector<std::shared_ptr<const AttnCase>> ExactCases(int n) {
  std::vector<std::shared_ptr<const AttnCase>> cases;
  cases.push_back(PrefillCase("gqa causal fp32", AttnCfg(8, 2, 12, attnFloat32, true), {5 * n + 3, 2 * n}, 11));
  cases.push_back(PrefillCase("mha bf16", AttnCfg(4, 4, 16, attnBfloat16, false), {3 * n + 1}, 12));
  cases.push_back(PrefillCase("mqa causal bf16 with an empty sequence", AttnCfg(8, 1, 8, attnBfloat16, true),
                              {4 * n, 0, 7}, 13));
  return cases;
}

void ExactOnRank(int rank, int n, attnComm_t comm, const char* how) {
  const auto cases = ExactCases(n);
  const attnLevelDrop_t keepAll{{1, 1, 1, 1}, nullptr};
  for (const auto& c : cases) {
    const Placement pl = ContiguousPlacement(*c, n);
    ExpectLevelExact(*c, *c, pl, rank, comm, nullptr, nullptr, std::string(how) + ", drop NULL");
    ExpectLevelExact(*c, *c, pl, rank, comm, &keepAll, nullptr, std::string(how) + ", keep all");
  }
  // A rank that holds nothing (n > 1) and random placement.
  if (n > 1) {
    const auto& c = cases[0];
    const Placement pl = ContiguousPlacement(*c, n, n - 1);
    ExpectLevelExact(*c, *c, pl, rank, comm, nullptr, nullptr, std::string(how) + ", empty rank");
    const Placement rnd = RandomPlacement(*c, n, 99, -1);
    ExpectLevelExact(*c, *c, rnd, rank, comm, nullptr, nullptr, std::string(how) + ", random placement");
  }
}

class LevelAttentionExact : public ::testing::TestWithParam<int> {};

TEST_P(LevelAttentionExact, KeepAllEqualsExactAttentionThreads) {
  const int n = GetParam();
  RunThreads(n, [&](int rank, int, attnComm_t& comm) { ExactOnRank(rank, n, comm, "threads"); }, AttnRunOptions());
}

TEST_P(LevelAttentionExact, KeepAllEqualsExactAttentionProcesses) {
  const int n = GetParam();
  RunProcesses(n, [&](int rank, int, attnComm_t& comm) { ExactOnRank(rank, n, comm, "processes"); }, AttnRunOptions());
}

INSTANTIATE_TEST_SUITE_P(N, LevelAttentionExact, ::testing::Values(1, 2, 3, 5));

// ---------------------------------------------------------------------------
// Dropping

// Threads share one host: every peer is at the host tier.
TEST(LevelAttentionDrop, HostTierKeepsTheMostImportantKeysThreads) {
  const int n = 4;
  auto c = PrefillCase("drop threads", AttnCfg(8, 2, 16, attnFloat32, true), {8 * n + 5, 3 * n + 1}, 21);
  const Placement pl = ContiguousPlacement(*c, n);
  const std::vector<float> imp = RandomImportance(*c, 22);
  auto hostTier = [](int, int) { return int(attnTierHost); };
  for (float keepHost : {0.5f, 0.2f, 0.0f}) {
    const attnLevelDrop_t drop{{1, keepHost, 1, 1}, nullptr};
    std::vector<AttnCase> refs;
    for (int r = 0; r < n; ++r) refs.push_back(ReferenceOverKeptKeys(*c, pl, r, drop.keep, imp, hostTier));
    RunThreads(n, [&](int rank, int, attnComm_t& comm) {
      LevelRun run;
      ExpectLevelExact(*c, refs[rank], pl, rank, comm, &drop, &imp,
                       "keep " + std::to_string(keepHost), &run);
      // What went out is the kept keys each peer can use, and nothing else.
      const std::vector<int64_t> kept = KeptFrom(*c, pl, rank, keepHost, imp);
      int64_t rows = 0;
      for (int p = 0; p < n; ++p)
        if (p != rank) rows += UsableBy(*c, pl, p, kept);
      EXPECT_EQ(run.call.rowsSent, rows) << "rank " << rank;
      // Causal and contiguous: the last chunks are after every peer's queries.
      if (rank == n - 1) {
        EXPECT_EQ(run.call.rowsSent, 0);
      } else if (keepHost > 0) {
        EXPECT_GT(rows, 0) << "rank " << rank;
      }
      const uint64_t kvRow = 2 * sizeof(float) * c->cfg.num_kv_heads * c->cfg.head_dim;
      EXPECT_GE(run.call.bytesSent, static_cast<uint64_t>(rows) * kvRow);
      EXPECT_LT(run.call.bytesSent, static_cast<uint64_t>(rows) * kvRow + (n - 1) * 4096u);
    }, AttnRunOptions());
  }
}

// Processes on emulated hosts and racks: rank 0 is host a and ranks 1, 2
// host b of rack 0; ranks 3, 4 are host c and rank 5 host d of rack 1.
// Every tier but the device one occurs, each with its own keep; blocks for
// another host go through a relay there, blocks for the other rack through
// a relay in it that passes them to its host mates and to a relay on the
// rack's other host. Causal (later ranks use earlier keys) and not (every
// block is used everywhere).
TEST(LevelAttentionDrop, EveryTierWithItsOwnKeepProcessesOnEmulatedHosts) {
  const int n = 6;
  static const char* kHost[] = {"lvl-a", "lvl-b", "lvl-b", "lvl-c", "lvl-c", "lvl-d"};
  static const char* kRack[] = {"rack0", "rack0", "rack0", "rack1", "rack1", "rack1"};
  auto tierOf = [](int a, int b) {
    if (std::strcmp(kHost[a], kHost[b]) == 0) return int(attnTierHost);
    if (std::strcmp(kRack[a], kRack[b]) == 0) return int(attnTierRack);
    return int(attnTierCluster);
  };
  const std::vector<std::shared_ptr<const AttnCase>> cases = {
      PrefillCase("drop tiers causal", AttnCfg(4, 2, 8, attnBfloat16, true), {10 * n + 3, 6 * n}, 31),
      PrefillCase("drop tiers", AttnCfg(2, 1, 16, attnFloat32, false), {7 * n + 2}, 33)};
  const attnLevelDrop_t drop{{1, 0.8f, 0.4f, 0.2f}, nullptr};
  std::vector<Placement> pls;
  std::vector<std::vector<float>> imps;
  std::vector<std::vector<AttnCase>> refs(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    pls.push_back(ContiguousPlacement(*cases[i], n));
    imps.push_back(RandomImportance(*cases[i], 32 + i));
    for (int r = 0; r < n; ++r)
      refs[i].push_back(ReferenceOverKeptKeys(*cases[i], pls[i], r, drop.keep, imps[i], tierOf));
  }
  RunOptions o = AttnRunOptions();
  o.child_setup = [](int rank) {
    setenv("ATTN_HOSTID", kHost[rank], 1);
    setenv("ATTN_RACKID", kRack[rank], 1);
  };
  RunProcesses(n, [&](int rank, int, attnComm_t& comm) {
    for (size_t i = 0; i < cases.size(); ++i) {
      const AttnCase& c = *cases[i];
      const Placement& pl = pls[i];
      LevelRun run;
      ExpectLevelExact(c, refs[i][rank], pl, rank, comm, &drop, &imps[i], "tiers", &run);
      // Our host's peers get what they can use; another host of our rack
      // gets, once, what any of its ranks can use; the other rack gets,
      // once, what any of its ranks can use.
      int64_t sent = 0;
      std::vector<std::string> groupsDone;
      for (int p = 0; p < n; ++p) {
        if (p == rank) continue;
        const std::vector<int64_t> kept = KeptFrom(c, pl, rank, drop.keep[tierOf(rank, p)], imps[i]);
        if (std::strcmp(kHost[p], kHost[rank]) == 0) {
          sent += UsableBy(c, pl, p, kept);
          continue;
        }
        const bool sameRack = std::strcmp(kRack[p], kRack[rank]) == 0;
        const std::string group = sameRack ? kHost[p] : kRack[p];
        if (std::find(groupsDone.begin(), groupsDone.end(), group) != groupsDone.end()) continue;
        groupsDone.push_back(group);
        for (int64_t g : kept) {
          bool any = false;
          for (int r = 0; r < n; ++r)
            any = any || ((sameRack ? kHost[r] : kRack[r]) == group && UsableBy(c, pl, r, {g}) == 1);
          sent += any;
        }
      }
      EXPECT_EQ(run.call.rowsSent, sent) << c.name << ", rank " << rank;
    }
  }, o);
}

// The engine's own kernel (attnCommSetAttnKernel) computes every block.
TEST(LevelAttentionDrop, UserKernelComputesEveryBlock) {
  const int n = 3;
  auto c = PrefillCase("user kernel", AttnCfg(4, 2, 8, attnFloat32, true), {6 * n + 2}, 41);
  const Placement pl = ContiguousPlacement(*c, n);
  const std::vector<float> imp = RandomImportance(*c, 42);
  const attnLevelDrop_t drop{{1, 0.5f, 1, 1}, nullptr};
  auto hostTier = [](int, int) { return int(attnTierHost); };
  std::vector<AttnCase> refs;
  for (int r = 0; r < n; ++r) refs.push_back(ReferenceOverKeptKeys(*c, pl, r, drop.keep, imp, hostTier));
  std::atomic<int64_t> calls{0};
  AttnKernelCounter counter{&calls, nullptr};
  RunThreads(n, [&](int rank, int, attnComm_t& comm) {
    ASSERT_EQ(attnCommSetAttnKernel(comm, LoopAttentionKernel, &counter), attnSuccess);
    ExpectLevelExact(*c, refs[rank], pl, rank, comm, &drop, &imp, "user kernel");
  }, AttnRunOptions());
  // Rank r: its own block and one per earlier rank. Later ranks' keys come
  // after every query of r (causal, contiguous chunks): never sent, never
  // computed.
  EXPECT_EQ(calls.load(), n * (n + 1) / 2);
}

// ---------------------------------------------------------------------------
// Bad input

TEST(LevelAttentionArgs, BadKeepAndMissingImportanceAreRefusedLocally) {
  auto c = PrefillCase("args", AttnCfg(2, 1, 4, attnFloat32, false), {6}, 51);
  RunThreads(1, [&](int, int, attnComm_t& comm) {
    const Placement pl = ContiguousPlacement(*c, 1);
    RankShard sh = GatherShard(*c, pl, 0);
    std::vector<float> out(sh.q_pos.size() * 2 * 4);
    std::vector<float> imp(sh.kv_pos.size(), 1.0f);
    auto call = [&](const attnLevelDrop_t* d, attnStream_t stream = nullptr) {
      return attnLevelAttention(sh.q.data(), sh.k.data(), sh.v.data(), out.data(), nullptr, &sh.layout,
                                &c->cfg, d, comm, stream);
    };
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (float bad : {-0.1f, 1.5f, nan}) {
      attnLevelDrop_t d{{1, bad, 1, 1}, imp.data()};
      EXPECT_EQ(call(&d), attnInvalidArgument) << bad;
      EXPECT_NE(std::string(attnGetLastError(comm)).find("keep[1]"), std::string::npos)
          << attnGetLastError(comm);
    }
    attnLevelDrop_t noImp{{1, 0.5f, 1, 1}, nullptr};
    EXPECT_EQ(call(&noImp), attnInvalidArgument);
    EXPECT_NE(std::string(attnGetLastError(comm)).find("importance is NULL"), std::string::npos);
    EXPECT_EQ(call(nullptr, reinterpret_cast<attnStream_t>(0x1)), attnInvalidArgument);
    EXPECT_EQ(attnLevelAttention(sh.q.data(), sh.k.data(), sh.v.data(), out.data(), nullptr, nullptr,
                                 &c->cfg, nullptr, comm, nullptr),
              attnInvalidArgument);
    EXPECT_EQ(attnLevelAttention(sh.q.data(), sh.k.data(), sh.v.data(), out.data(), nullptr, &sh.layout,
                                 &c->cfg, nullptr, nullptr, nullptr),
              attnInvalidArgument);
    // Still usable after refusals.
    ExpectLevelExact(*c, *c, pl, 0, comm, nullptr, nullptr, "after refusals");
  }, AttnRunOptions());
}

// Ranks that pass different keep fractions, or mix attnLevelAttention with
// attnRingAttention, fail together with a message naming both ranks.
TEST(LevelAttentionArgs, RanksThatDisagreeFailTogether) {
  const int n = 3;
  auto c = PrefillCase("disagree", AttnCfg(2, 1, 4, attnFloat32, true), {4 * n}, 61);
  const Placement pl = ContiguousPlacement(*c, n);
  const std::vector<float> imp = RandomImportance(*c, 62);
  for (int variant = 0; variant < 2; ++variant) {
    RunThreads(n, [&](int rank, int, attnComm_t& comm) {
      RankShard sh = GatherShard(*c, pl, rank);
      std::vector<float> out(sh.q_pos.size() * 2 * 4), localImp;
      for (int64_t g : pl.kv_rows[rank]) localImp.push_back(imp[g]);
      // Variant 0: rank 1 keeps more. Variant 1: the same keep, but rank 2
      // calls attnRingAttention.
      attnLevelDrop_t d{{1, (variant == 0 && rank == 1) ? 0.5f : 0.25f, 1, 1}, localImp.data()};
      attnResult_t rc;
      if (variant == 1 && rank == 2)
        rc = attnRingAttention(sh.q.data(), sh.k.data(), sh.v.data(), out.data(), nullptr, &sh.layout,
                               &c->cfg, attnModePassKV, comm, nullptr);
      else
        rc = attnLevelAttention(sh.q.data(), sh.k.data(), sh.v.data(), out.data(), nullptr, &sh.layout,
                                &c->cfg, &d, comm, nullptr);
      EXPECT_EQ(rc, attnInvalidUsage) << "variant " << variant << " rank " << rank;
      const std::string err = attnGetLastError(comm);
      const char* expected = variant == 0 ? "keep fractions" : "mode";
      EXPECT_NE(err.find(expected), std::string::npos) << err;
    }, AttnRunOptions(60000));
  }
}

}  // namespace
}  // namespace attn_test
