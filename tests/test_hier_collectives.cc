// Hierarchical all-gather / reduce-scatter / all-reduce (src/coll/*_hier.cc)
// and the algorithm choice (src/coll/algo_select.cc).
//
// - buildHierarchy as a pure function: shapes, coordinates, proximity order,
//   irregular trees; a simulation of the rail plan proves every rank ends
//   with every block, each carried by a rank that holds it.
// - The cost model: hier on a slow host link, ring inside one host, ring on
//   an irregular tree even when forced.
// - Ranks as processes with per-rank ATTN_HOSTID / ATTN_RACKID (ranks of one
//   "host" use shm, others tcp): every type, odd counts, exact values, over
//   2x2, 2x3, 3+1, 2 racks x 2 hosts x 2, interleaved hosts, 1 host, N=1,
//   with ATTN_ALGO=hier, ring and auto.
// - An unknown ATTN_ALGO is a clear attnInvalidArgument.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "attncomm.h"
#include "src/coll/algo_select.h"
#include "src/coll/hierarchy.h"
#include "tests/support/multirank.h"

using namespace attn_test;
using attn::buildHierarchy;
using attn::Hierarchy;
using attn::TierKeys;

namespace {

// A placement: rack and host of every rank.
struct Shape {
  const char* name;
  std::vector<int> rack, host;
  int n() const { return static_cast<int>(host.size()); }
};

std::vector<TierKeys> keysOf(const Shape& s) {
  std::vector<TierKeys> k(s.n());
  for (int r = 0; r < s.n(); ++r) k[r] = {uint64_t(100 + s.rack[r]), uint64_t(1000 + s.host[r])};
  return k;
}

std::vector<int> identity(int n) {
  std::vector<int> o(n);
  for (int i = 0; i < n; ++i) o[i] = i;
  return o;
}

// r -> host r / perHost, rack host / hostsPerRack.
Shape grid(const char* name, int racks, int hostsPerRack, int perHost) {
  Shape s{name, {}, {}};
  for (int r = 0; r < racks * hostsPerRack * perHost; ++r) {
    s.host.push_back(r / perHost);
    s.rack.push_back(r / perHost / hostsPerRack);
  }
  return s;
}

const Shape k2x2 = grid("2x2", 1, 2, 2);
const Shape k2x3 = grid("2x3", 1, 2, 3);
const Shape k3plus1{"3plus1", {0, 0, 0, 0}, {0, 0, 0, 1}};
const Shape k2r2h2 = grid("2racks_2x2", 2, 2, 2);
const Shape kInterleaved{"interleaved_2x2", {0, 0, 0, 0}, {0, 1, 0, 1}};
const Shape kOneHost = grid("1host", 1, 1, 3);
const Shape kSingle = grid("N1", 1, 1, 1);

// ---------------------------------------------------------------------------
// The hierarchy as a pure function

TEST(Hierarchy, TwoHostsTwoRanks) {
  Hierarchy h = buildHierarchy(keysOf(k2x2), identity(4));
  ASSERT_TRUE(h.regular);
  EXPECT_EQ(h.shape, (std::vector<int>{2, 2}));
  EXPECT_EQ(h.tierOfLevel, (std::vector<int>{0, 1}));
  EXPECT_EQ(h.coords[3], (std::vector<int>{1, 1}));
  EXPECT_EQ(h.coords[1], (std::vector<int>{1, 0}));
  EXPECT_TRUE(h.worthwhile());
  // Rail of rank 1 across hosts: ranks 1 and 3; its host: 0 and 1.
  EXPECT_EQ(attn::sliceMembers(h, 1, 1, 0), (std::vector<int>{1, 3}));
  EXPECT_EQ(attn::sliceMembers(h, 1, 0, 0), (std::vector<int>{0, 1}));
  EXPECT_EQ(attn::sliceMembers(h, 1, 0, 1), (std::vector<int>{2, 3}));
}

TEST(Hierarchy, RacksHostsRanks) {
  Hierarchy h = buildHierarchy(keysOf(k2r2h2), identity(8));
  ASSERT_TRUE(h.regular);
  EXPECT_EQ(h.shape, (std::vector<int>{2, 2, 2}));
  EXPECT_EQ(h.tierOfLevel, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(h.coords[6], (std::vector<int>{0, 1, 1}));
  EXPECT_EQ(h.groupsPerTier, (std::vector<int>{4, 2}));
  EXPECT_EQ(attn::sliceMembers(h, 5, 2, 0), (std::vector<int>{1, 5}));  // rail across racks
  EXPECT_EQ(attn::slicesAbove(h, 0), 4);
}

TEST(Hierarchy, OneHostPerRackDropsTheHostLevel) {
  Hierarchy h = buildHierarchy(keysOf(grid("2r1h2", 2, 1, 2)), identity(4));
  ASSERT_TRUE(h.regular);
  EXPECT_EQ(h.shape, (std::vector<int>{2, 2}));
  EXPECT_EQ(h.tierOfLevel, (std::vector<int>{0, 2}));  // ranks, racks
}

TEST(Hierarchy, ProximityOrderDecidesPositions) {
  // Hosts interleaved by rank; the order puts host 1 first.
  Hierarchy h = buildHierarchy(keysOf(kInterleaved), {3, 1, 2, 0});
  ASSERT_TRUE(h.regular);
  EXPECT_EQ(h.coords[3], (std::vector<int>{0, 0}));
  EXPECT_EQ(h.coords[1], (std::vector<int>{1, 0}));
  EXPECT_EQ(h.coords[2], (std::vector<int>{0, 1}));
  EXPECT_EQ(h.coords[0], (std::vector<int>{1, 1}));
}

TEST(Hierarchy, IrregularAndDegenerate) {
  Hierarchy u = buildHierarchy(keysOf(k3plus1), identity(4));
  EXPECT_FALSE(u.regular);
  EXPECT_TRUE(u.worthwhile());
  EXPECT_EQ(u.maxGroupSizePerTier[0], 3);
  EXPECT_NE(u.describe().find("irregular"), std::string::npos);

  Hierarchy one = buildHierarchy(keysOf(kOneHost), identity(3));
  EXPECT_TRUE(one.regular);
  EXPECT_EQ(one.shape, (std::vector<int>{3}));
  EXPECT_FALSE(one.worthwhile());

  Hierarchy single = buildHierarchy(keysOf(kSingle), identity(1));
  EXPECT_TRUE(single.regular);
  EXPECT_EQ(single.levels(), 0);
  EXPECT_FALSE(single.worthwhile());

  Hierarchy perRank = buildHierarchy(keysOf(grid("4x1", 1, 4, 1)), identity(4));
  EXPECT_EQ(perRank.shape, (std::vector<int>{4}));
  EXPECT_FALSE(perRank.worthwhile());
}

// Runs the all-gather plan on sets of held blocks: at each ring, member m
// must hold the block it forwards, and at the end everyone holds all.
void SimulateAllGather(const Hierarchy& h) {
  const int n = h.nranks;
  std::vector<std::set<int>> held(n);
  for (int r = 0; r < n; ++r) held[r] = {r};
  for (int k = h.levels() - 1; k >= 0; --k) {
    std::vector<std::set<int>> next = held;
    for (int me = 0; me < n; ++me)
      for (int j = 0; j < attn::slicesAbove(h, k); ++j) {
        std::vector<int> ring = attn::sliceMembers(h, me, k, attn::sliceOf(h, me, k));
        std::vector<int> owners = attn::sliceMembers(h, me, k, j);
        ASSERT_EQ(ring[h.coords[me][k]], me);
        for (int pos = 0; pos < static_cast<int>(ring.size()); ++pos) {
          // Position pos forwards the block of owners[pos] (it must hold
          // it); a block must never arrive twice.
          const int m = ring[pos], block = owners[pos];
          ASSERT_TRUE(held[m].count(block)) << "rank " << m << " forwards block " << block
                                            << " it does not hold (level " << k << ")";
          if (m == me) {
            EXPECT_TRUE(next[me].count(block));
            continue;
          }
          ASSERT_FALSE(next[me].count(block)) << "block " << block << " reaches rank " << me
                                              << " twice (level " << k << ")";
          next[me].insert(block);
        }
      }
    held = next;
  }
  for (int r = 0; r < n; ++r) EXPECT_EQ(held[r].size(), size_t(n)) << "rank " << r;
}

TEST(Hierarchy, RailPlanCoversEveryBlockOnce) {
  for (const Shape& s : {k2x2, k2x3, k2r2h2, kOneHost, kSingle, grid("3r2h2", 3, 2, 2)}) {
    SCOPED_TRACE(s.name);
    SimulateAllGather(buildHierarchy(keysOf(s), identity(s.n())));
  }
  SimulateAllGather(buildHierarchy(keysOf(kInterleaved), {3, 1, 2, 0}));
}

// ---------------------------------------------------------------------------
// The cost model

TEST(AlgoSelect, ModelPrefersHierAcrossSlowHostLink) {
  Hierarchy h = buildHierarchy(keysOf(grid("2x4", 1, 2, 4)), identity(8));
  const size_t big = size_t(64) << 20;
  // With shared memory ~free, the link decides. Ring: 7 blocks over the
  // host link; hier: 4 (all that must cross).
  attn::TierRates linkBound{{1e13, 1.25e8, 1.25e8}, {0, 0, 0}};
  EXPECT_NEAR(attn::flatRingSeconds(h, big, linkBound) / attn::hierSeconds(h, big, linkBound),
              7.0 / 4.0, 0.01);
  attn::TierRates rates = attn::defaultTierRates();
  EXPECT_EQ(attn::chooseAlgo(attn::AlgoSetting::kAuto, h, big, rates), attn::CollAlgo::kHier);
  EXPECT_EQ(attn::chooseAlgo(attn::AlgoSetting::kRing, h, big, rates), attn::CollAlgo::kRing);

  Hierarchy one = buildHierarchy(keysOf(kOneHost), identity(3));
  EXPECT_EQ(attn::chooseAlgo(attn::AlgoSetting::kAuto, one, big, rates), attn::CollAlgo::kRing);
  EXPECT_EQ(attn::chooseAlgo(attn::AlgoSetting::kHier, one, big, rates), attn::CollAlgo::kHier);

  Hierarchy odd = buildHierarchy(keysOf(k3plus1), identity(4));
  EXPECT_EQ(attn::chooseAlgo(attn::AlgoSetting::kHier, odd, big, rates), attn::CollAlgo::kRing);
}

// Direct all-gather: auto takes it on one host over single-copy shm links
// with blocks of at most kDirectMaxBlock, and over any link for blocks of
// at most kAllGatherDirectSmallMax; ATTN_ALGO=direct forces it for
// all-gather and leaves the reductions on the ring.
TEST(AlgoSelect, DirectAllGatherOnlyOnSingleCopyLinks) {
  using attn::AlgoSetting;
  using attn::CollAlgo;
  const attn::TierRates rates = attn::defaultTierRates();
  Hierarchy one = buildHierarchy(keysOf(kOneHost), identity(3));
  const size_t small = attn::kDirectMaxBlock, big = attn::kDirectMaxBlock + 1;
  EXPECT_EQ(attn::chooseAllGatherAlgo(AlgoSetting::kAuto, one, true, small, 3 * small, rates),
            CollAlgo::kDirect);
  EXPECT_EQ(attn::chooseAllGatherAlgo(AlgoSetting::kAuto, one, true, big, 3 * big, rates),
            CollAlgo::kRing);
  EXPECT_EQ(attn::chooseAllGatherAlgo(AlgoSetting::kAuto, one, false, small, 3 * small, rates),
            CollAlgo::kRing);
  EXPECT_EQ(attn::chooseAllGatherAlgo(AlgoSetting::kRing, one, true, small, 3 * small, rates),
            CollAlgo::kRing);
  EXPECT_EQ(attn::chooseAllGatherAlgo(AlgoSetting::kDirect, one, false, big, 3 * big, rates),
            CollAlgo::kDirect);
  // Small blocks among few ranks: direct over any link (one message time
  // instead of n - 1 in a row), on one host or several.
  const size_t tiny = attn::kAllGatherDirectSmallMax;
  EXPECT_EQ(attn::chooseAllGatherAlgo(AlgoSetting::kAuto, one, false, tiny, 3 * tiny, rates), CollAlgo::kDirect);
  EXPECT_EQ(attn::chooseAllGatherAlgo(AlgoSetting::kAuto, one, false, tiny + 1, 3 * (tiny + 1), rates),
            CollAlgo::kRing);
  EXPECT_EQ(attn::chooseAllGatherAlgo(AlgoSetting::kRing, one, false, tiny, 3 * tiny, rates), CollAlgo::kRing);
  // Several hosts: the ring / hier model decides, whatever the links.
  Hierarchy h = buildHierarchy(keysOf(grid("2x4", 1, 2, 4)), identity(8));
  const size_t total = size_t(64) << 20;
  EXPECT_EQ(attn::chooseAllGatherAlgo(AlgoSetting::kAuto, h, true, small, total, rates),
            attn::chooseAlgo(AlgoSetting::kAuto, h, total, rates));
  // The reductions have no direct variant.
  EXPECT_EQ(attn::chooseAlgo(AlgoSetting::kDirect, h, total, rates), CollAlgo::kRing);
  // Where staging applies, the caller raises the limit to the staging one.
  const size_t stage = attn::kStageMaxBlock;
  EXPECT_EQ(attn::chooseAllGatherAlgo(AlgoSetting::kAuto, one, true, stage, 3 * stage, rates, stage),
            CollAlgo::kDirect);
  EXPECT_EQ(attn::chooseAllGatherAlgo(AlgoSetting::kAuto, one, true, stage + 1, 3 * stage, rates,
                                      stage),
            CollAlgo::kRing);
}

TEST(AlgoSelect, ReduceDirectOrTreeForSmallScatterForMidSizesOnSingleCopyLinks) {
  using attn::ReduceAlgo;
  using attn::ReduceSetting;
  auto choose = [](ReduceSetting s, int n, bool singleCopy, size_t bytes) {
    return attn::chooseReduceAlgo(s, n, singleCopy, bytes);
  };
  const size_t mid = size_t(512) << 10;
  EXPECT_EQ(choose(ReduceSetting::kAuto, 4, true, 1), ReduceAlgo::kDirect);
  EXPECT_EQ(choose(ReduceSetting::kAuto, attn::kReduceDirectMaxRanks, true, attn::kReduceDirectMax),
            ReduceAlgo::kDirect);
  EXPECT_EQ(choose(ReduceSetting::kAuto, attn::kReduceDirectMaxRanks + 1, true, 1), ReduceAlgo::kTree);
  EXPECT_EQ(choose(ReduceSetting::kAuto, 4, true, attn::kReduceDirectMax + 1), ReduceAlgo::kTree);
  EXPECT_EQ(choose(ReduceSetting::kAuto, 4, false, 1), ReduceAlgo::kTree);  // another host, or tcp
  EXPECT_EQ(choose(ReduceSetting::kAuto, 3, false, attn::kReduceTreeMax), ReduceAlgo::kTree);
  EXPECT_EQ(choose(ReduceSetting::kAuto, 2, true, 1), ReduceAlgo::kChain);  // the same one hop
  EXPECT_EQ(choose(ReduceSetting::kAuto, 4, false, attn::kReduceTreeMax + 1), ReduceAlgo::kChain);
  EXPECT_EQ(choose(ReduceSetting::kAuto, 4, true, mid), ReduceAlgo::kScatter);
  EXPECT_EQ(choose(ReduceSetting::kAuto, 3, true, attn::kReduceScatterMin), ReduceAlgo::kScatter);
  EXPECT_EQ(choose(ReduceSetting::kAuto, 3, true, attn::kReduceScatterMax), ReduceAlgo::kScatter);
  EXPECT_EQ(choose(ReduceSetting::kAuto, 4, false, mid), ReduceAlgo::kChain);  // another host, or tcp
  EXPECT_EQ(choose(ReduceSetting::kAuto, 2, true, mid), ReduceAlgo::kChain);   // nothing to spread
  EXPECT_EQ(choose(ReduceSetting::kAuto, 4, true, attn::kReduceScatterMax + 1), ReduceAlgo::kChain);
  EXPECT_EQ(choose(ReduceSetting::kScatter, 2, false, 1), ReduceAlgo::kScatter);
  EXPECT_EQ(choose(ReduceSetting::kTree, 2, false, mid), ReduceAlgo::kTree);
  EXPECT_EQ(choose(ReduceSetting::kScatter, 1, true, mid), ReduceAlgo::kChain);  // one rank: a copy
  EXPECT_EQ(choose(ReduceSetting::kChain, 4, true, 1), ReduceAlgo::kChain);
  EXPECT_EQ(choose(ReduceSetting::kDirect, 40, false, attn::kReduceScatterMax), ReduceAlgo::kDirect);
  ReduceSetting s;
  for (const auto& [v, want] : std::vector<std::pair<std::string, ReduceSetting>>{
           {"", ReduceSetting::kAuto}, {"auto", ReduceSetting::kAuto}, {"tree", ReduceSetting::kTree},
           {"chain", ReduceSetting::kChain}, {"scatter", ReduceSetting::kScatter},
           {"direct", ReduceSetting::kDirect}}) {
    ScopedEnv env(std::vector<std::pair<std::string, std::string>>{{"ATTN_REDUCE_ALGO", v}});
    ASSERT_EQ(attn::readReduceSetting(&s), attnSuccess) << v;
    EXPECT_EQ(s, want) << v;
  }
  ScopedEnv env(std::vector<std::pair<std::string, std::string>>{{"ATTN_REDUCE_ALGO", "ring"}});
  EXPECT_EQ(attn::readReduceSetting(&s), attnInvalidArgument);
}

TEST(AlgoSelect, AllReduceDoublingForSmallMessages) {
  using attn::AllReduceAlgo;
  using attn::AllReduceSetting;
  auto choose = [](AllReduceSetting s, int n, bool singleCopy, size_t bytes) {
    return attn::chooseAllReduceAlgo(s, n, singleCopy, bytes);
  };
  EXPECT_EQ(choose(AllReduceSetting::kAuto, 4, true, 8), AllReduceAlgo::kDoubling);
  EXPECT_EQ(choose(AllReduceSetting::kAuto, 5, true, attn::kAllReduceDoublingShmMax), AllReduceAlgo::kDoubling);
  EXPECT_EQ(choose(AllReduceSetting::kAuto, 5, true, attn::kAllReduceDoublingShmMax + 1), AllReduceAlgo::kScatter);
  EXPECT_EQ(choose(AllReduceSetting::kAuto, 5, false, attn::kAllReduceDoublingShmMax + 1), AllReduceAlgo::kDoubling);
  EXPECT_EQ(choose(AllReduceSetting::kAuto, 2, false, attn::kAllReduceDoublingMax), AllReduceAlgo::kDoubling);
  EXPECT_EQ(choose(AllReduceSetting::kAuto, 3, false, attn::kAllReduceDoublingMax + 1), AllReduceAlgo::kScatter);
  EXPECT_EQ(choose(AllReduceSetting::kDoubling, 8, true, size_t(1) << 30), AllReduceAlgo::kDoubling);
  EXPECT_EQ(choose(AllReduceSetting::kScatter, 8, false, 8), AllReduceAlgo::kScatter);
  EXPECT_EQ(choose(AllReduceSetting::kScatter, 1, false, 8), AllReduceAlgo::kDoubling);  // one rank: a copy
  AllReduceSetting s;
  for (const auto& [v, want] : std::vector<std::pair<std::string, AllReduceSetting>>{
           {"", AllReduceSetting::kAuto}, {"auto", AllReduceSetting::kAuto},
           {"doubling", AllReduceSetting::kDoubling}, {"scatter", AllReduceSetting::kScatter}}) {
    ScopedEnv env(std::vector<std::pair<std::string, std::string>>{{"ATTN_ALLREDUCE_ALGO", v}});
    ASSERT_EQ(attn::readAllReduceSetting(&s), attnSuccess) << v;
    EXPECT_EQ(s, want) << v;
  }
  ScopedEnv env(std::vector<std::pair<std::string, std::string>>{{"ATTN_ALLREDUCE_ALGO", "ring"}});
  EXPECT_EQ(attn::readAllReduceSetting(&s), attnInvalidArgument);
}

TEST(AlgoSelect, BroadcastDirectForSmallFewTreeForSmallManyStagedDirectBetweenProcesses) {
  using attn::BroadcastAlgo;
  using attn::BroadcastSetting;
  const size_t stage = attn::kStageMaxBlock, small = attn::kBroadcastSmallMax;
  const int many = attn::kBroadcastDirectMaxRanks + 1;
  auto choose = [&](BroadcastSetting s, int n, bool processes, size_t bytes) {
    return attn::chooseBroadcastAlgo(s, n, processes, bytes, stage);
  };
  EXPECT_EQ(choose(BroadcastSetting::kAuto, 4, false, 8), BroadcastAlgo::kDirect);
  EXPECT_EQ(choose(BroadcastSetting::kAuto, attn::kBroadcastDirectMaxRanks, true, small), BroadcastAlgo::kDirect);
  EXPECT_EQ(choose(BroadcastSetting::kAuto, many, false, 8), BroadcastAlgo::kTree);
  EXPECT_EQ(choose(BroadcastSetting::kAuto, many, true, small), BroadcastAlgo::kTree);
  EXPECT_EQ(choose(BroadcastSetting::kAuto, many, true, small + 1), BroadcastAlgo::kDirect);
  EXPECT_EQ(choose(BroadcastSetting::kAuto, 4, true, stage), BroadcastAlgo::kDirect);
  EXPECT_EQ(choose(BroadcastSetting::kAuto, 4, true, stage + 1), BroadcastAlgo::kChain);
  EXPECT_EQ(choose(BroadcastSetting::kAuto, 4, false, small + 1), BroadcastAlgo::kChain);  // threads, or hosts
  EXPECT_EQ(attn::chooseBroadcastAlgo(BroadcastSetting::kAuto, 4, true, small + 1, 0), BroadcastAlgo::kChain);
  EXPECT_EQ(choose(BroadcastSetting::kTree, 2, true, stage), BroadcastAlgo::kTree);
  EXPECT_EQ(choose(BroadcastSetting::kChain, 4, true, 8), BroadcastAlgo::kChain);
  EXPECT_EQ(choose(BroadcastSetting::kDirect, many, false, stage + 1), BroadcastAlgo::kDirect);
  BroadcastSetting s;
  for (const auto& [v, want] : std::vector<std::pair<std::string, BroadcastSetting>>{
           {"", BroadcastSetting::kAuto}, {"auto", BroadcastSetting::kAuto}, {"tree", BroadcastSetting::kTree},
           {"chain", BroadcastSetting::kChain}, {"direct", BroadcastSetting::kDirect}}) {
    ScopedEnv env(std::vector<std::pair<std::string, std::string>>{{"ATTN_BROADCAST_ALGO", v}});
    ASSERT_EQ(attn::readBroadcastSetting(&s), attnSuccess) << v;
    EXPECT_EQ(s, want) << v;
  }
  ScopedEnv env(std::vector<std::pair<std::string, std::string>>{{"ATTN_BROADCAST_ALGO", "ring"}});
  EXPECT_EQ(attn::readBroadcastSetting(&s), attnInvalidArgument);
}

// ATTN_STAGE_MAX: the default, a value, and 0 for "never stage".
TEST(AlgoSelect, StageLimitFromEnvironment) {
  {
    ScopedEnv env(std::vector<std::pair<std::string, std::string>>{});
    unsetenv("ATTN_STAGE_MAX");
    EXPECT_EQ(attn::readStageMaxBlock(), attn::kStageMaxBlock);
  }
  {
    ScopedEnv env(std::vector<std::pair<std::string, std::string>>{{"ATTN_STAGE_MAX", "4096"}});
    EXPECT_EQ(attn::readStageMaxBlock(), 4096u);
  }
  {
    ScopedEnv env(std::vector<std::pair<std::string, std::string>>{{"ATTN_STAGE_MAX", "0"}});
    EXPECT_EQ(attn::readStageMaxBlock(), 0u);
  }
}

// ---------------------------------------------------------------------------
// Processes with per-rank host / rack identity

void CollectiveMatrix(attnComm_t comm, int rank, int n) {
  for (attnDataType_t t : kAllTypes) {
    for (bool inPlace : {false, true}) {
      for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(1001)})
        CheckAllGather(comm, rank, n, t, count, inPlace);
      for (attnRedOp_t op : kAllOps) {
        CheckReduceScatter(comm, rank, n, t, op, 5, inPlace);
        CheckAllReduce(comm, rank, n, t, op, 13, inPlace);
        CheckAllReduce(comm, rank, n, t, op, 1, inPlace);  // fewer elements than ranks
        CheckReduce(comm, rank, n, t, op, 13, int(op) % n, inPlace);
      }
      if (::testing::Test::HasFatalFailure()) return;
    }
    // Several pipeline chunks per block (ATTN_CHUNK_SIZE = 4096 below).
    CheckAllGather(comm, rank, n, t, 3001, false);
    CheckReduceScatter(comm, rank, n, t, attnSum, 3001, false);
    CheckAllReduce(comm, rank, n, t, attnMax, 12007, true);
    CheckReduce(comm, rank, n, t, attnSum, 12007, n - 1, false);  // the chain along the proximity ring
  }
}

void RunShape(const Shape& s, const char* algo, const char* segments = nullptr) {
  RunOptions o;
  o.env = {{"ATTN_ALGO", algo}, {"ATTN_CHUNK_SIZE", "4096"}};
  if (segments) o.env.push_back({"ATTN_HIER_SEGMENTS", segments});
  o.child_setup = [&s](int rank) {
    setenv("ATTN_HOSTID", ("h" + std::to_string(s.host[rank])).c_str(), 1);
    setenv("ATTN_RACKID", ("r" + std::to_string(s.rack[rank])).c_str(), 1);
  };
  o.deadline_ms = 240000;
  RunProcesses(s.n(), [](int rank, int n, attnComm_t& comm) { CollectiveMatrix(comm, rank, n); }, o);
}

class HierProcs : public ::testing::TestWithParam<const Shape*> {};

TEST_P(HierProcs, AllCollectivesForcedHier) { RunShape(*GetParam(), "hier"); }

INSTANTIATE_TEST_SUITE_P(Shapes, HierProcs,
                         ::testing::Values(&k2x2, &k2x3, &k3plus1, &k2r2h2, &kInterleaved,
                                           &kOneHost, &kSingle),
                         [](const ::testing::TestParamInfo<const Shape*>& i) {
                           return std::string(i.param->name);
                         });

// The pipelined schedule (hier_pipeline.h) with uneven segments: 3 of them
// over blocks of 1, 5, 7, 1001 elements (some segments empty), so levels run
// at once on different segments.
TEST_P(HierProcs, AllCollectivesHierThreeSegments) { RunShape(*GetParam(), "hier", "3"); }

TEST(HierProcsAlgo, RingAndAutoOnRacks) {
  RunShape(k2r2h2, "ring");
  RunShape(k2r2h2, "auto");
}

TEST(HierProcsAlgo, RingOnInterleavedHosts) { RunShape(kInterleaved, "ring"); }

// Direct all-gather on one host (shm, single copy: auto picks it too) and,
// forced, across hosts; the reductions run the ring under it.
TEST(HierProcsAlgo, DirectAndAutoOnOneHost) {
  RunShape(kOneHost, "direct");
  RunShape(kOneHost, "auto");
}

TEST(HierProcsAlgo, DirectForcedAcrossHosts) { RunShape(k2x2, "direct"); }

// Staged direct all-gather (algo_select.h): ranks as processes on one host,
// ordinary buffers, so each rank copies its block into the communicator's
// shareable staging buffer and peers read it through a mapping. Blocks
// below ATTN_SHM_MAP_MIN (not staged), above it, growing (the staging
// buffer is reallocated and peers map the new one) and shrinking again (a
// stale tail must not leak), odd byte counts, in and out of place; with a
// 1 MiB staging limit, a 2 MiB block runs direct unstaged. A block read at
// the wrong place or before it was copied fails the value check.
TEST(HierProcsAlgo, StagedDirectOnOneHostProcessesN4) {
  RunOptions o;
  o.env = {{"ATTN_STAGE_MAX", "1048576"}, {"ATTN_SHM_MAP_MIN", "32768"}};
  o.deadline_ms = 180000;
  RunProcesses(4, [](int rank, int n, attnComm_t& comm) {
    const attn::CollTopo& t = attn::collTopo(comm);
    ASSERT_TRUE(t.singleCopy);
    ASSERT_TRUE(t.peersAreProcesses);
    CheckAllGather(comm, rank, n, attnUint8, 1001, false);  // below the mapping threshold
    EXPECT_EQ(t.staging.capacity(), 0u);
    const size_t counts[] = {40001, 250007, 9, 40001, 262144};
    for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); ++i) {
      CheckAllGather(comm, rank, n, attnFloat32, counts[i], i % 2 == 1);
      CheckAllGather(comm, rank, n, attnInt8, counts[i] * 3 + 1, i % 2 == 0);
      if (::testing::Test::HasFatalFailure()) return;
    }
    EXPECT_GE(t.staging.capacity(), size_t(262144) * 4);
    const size_t before = t.staging.capacity();
    CheckAllGather(comm, rank, n, attnFloat32, (size_t(2) << 20) / 4, false);  // over the limit
    EXPECT_EQ(t.staging.capacity(), before);
  }, o);
}

// Direct broadcast between processes (run_algo.cc): from 32 KiB up to the
// staging limit every rank reads the root's staged copy at once; outside
// that range the chain runs. Every root, odd sizes on both sides of both
// bounds, in and out of place, NULL sendbuff off the root; a staged copy
// left over from a bigger message or another root must never leak.
TEST(HierProcsAlgo, DirectBroadcastOnOneHostProcessesN4) {
  RunOptions o;
  o.env = {{"ATTN_STAGE_MAX", "1048576"}};
  o.deadline_ms = 180000;
  RunProcesses(4, [](int rank, int n, attnComm_t& comm) {
    const size_t counts[] = {32767, 32768, 1048576, 1048577, 300001, 40000, 7};
    for (int root = 0; root < n; ++root) {
      for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); ++i) {
        CheckBroadcast(comm, rank, n, attnUint8, counts[i], root, (i + root) % 2 == 0, i == 4);
        if (::testing::Test::HasFatalFailure()) return;
      }
      CheckBroadcast(comm, rank, n, attnBfloat16, 100003, root, false);
    }
    // Every rank was a root once, so every rank staged.
    EXPECT_GE(attn::collTopo(comm).staging.capacity(), size_t(1048576));
  }, o);
}

// ---------------------------------------------------------------------------
// Bad setting

// auto decides with the fabric model's tiers (here from ATTN_TOPO_FILE),
// and our defaults where the model has no figure.
TEST(AlgoSelect, RatesComeFromTheFabricModel) {
  const std::string file = "/tmp/attn_hier_rates_" + std::to_string(getpid()) + ".json";
  {
    FILE* f = std::fopen(file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(R"({"attncomm_topology": 1, "tiers": {
        "host": {"bandwidth_Bps": 3e9, "latency_s": 4e-6},
        "rack": {"bandwidth_Bps": 5e7, "latency_s": 1e-4}}})", f);
    std::fclose(f);
  }
  RunOptions o;
  o.env = {{"ATTN_TOPO_FILE", file}};
  RunThreads(2, [&](int, int, attnComm_t& comm) {
    const attn::TierRates& r = attn::collTopo(comm).rates;
    ASSERT_EQ(r.bytesPerSec.size(), 3u);
    EXPECT_EQ(r.bytesPerSec[0], 3e9);
    EXPECT_EQ(r.latencySec[0], 4e-6);
    EXPECT_EQ(r.bytesPerSec[1], 5e7);
    EXPECT_EQ(r.latencySec[1], 1e-4);
    EXPECT_GT(r.bytesPerSec[2], 0);  // cluster: the model's default for tcp
  }, o);
  std::remove(file.c_str());
}

TEST(AlgoSelect, UnknownAlgoIsInvalidArgument) {
  ScopedEnv env(std::vector<std::pair<std::string, std::string>>{{"ATTN_ALGO", "tree"}});
  RunThreads(2, [](int rank, int n, attnComm_t& comm) {
    std::vector<float> buf(2 * n, 0.f);
    attnResult_t r = attnAllGather(buf.data() + rank * 2, buf.data(), 2, attnFloat32, comm, nullptr);
    EXPECT_EQ(r, attnInvalidArgument);
    EXPECT_NE(std::string(attnGetLastError(comm)).find("ATTN_ALGO"), std::string::npos)
        << attnGetLastError(comm);
    r = attnAllReduce(buf.data(), buf.data(), 2, attnFloat32, attnSum, comm, nullptr);
    EXPECT_EQ(r, attnInvalidArgument);
    r = attnReduceScatter(buf.data(), buf.data(), 1, attnFloat32, attnSum, comm, nullptr);
    EXPECT_EQ(r, attnInvalidArgument);
  });
}

}  // namespace
