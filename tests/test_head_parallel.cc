// Head-parallel attention (attnModeHeadParallel, CSPS SP-NTP / Ulysses): the
// head split (every query head computed at exactly one rank, never a GQA
// group cut across KV heads), exactness on head counts that do not divide
// the ranks, and the traffic each rank sends (its rows once per other
// group, outputs home once). The common sweep (every placement and config,
// N = 1..8, threads and processes) runs this mode too: test_ring_attention.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "attncomm.h"
#include "src/attn/attn_state.h"
#include "src/attn/head_groups.h"
#include "tests/support/attn_fixtures.h"
#include "tests/support/multirank.h"

namespace attn_test {
namespace {

using attn::HeadGroup;
using attn::headGroups;

TEST(HeadGroups, EveryQueryHeadOnceAndNoGroupCutAcrossKvHeads) {
  for (int hkv = 1; hkv <= 12; ++hkv)
    for (int g = 1; g <= 8; ++g)
      for (int n = 1; n <= 20; ++n) {
        const int hq = hkv * g;
        const std::string what = "Hq " + std::to_string(hq) + ", Hkv " + std::to_string(hkv) +
                                 ", N " + std::to_string(n);
        const std::vector<HeadGroup> gs = headGroups(hq, hkv, n);
        ASSERT_EQ(static_cast<int>(gs.size()), n) << what;
        int next = 0, most = 0, least = hq;
        for (int r = 0; r < n; ++r) {
          const HeadGroup& h = gs[r];
          most = std::max(most, h.q());
          least = std::min(least, h.q());
          if (h.empty()) continue;
          // Contiguous, in rank order, covering every head once.
          ASSERT_EQ(h.qBegin, next) << what << ", rank " << r;
          ASSERT_LT(h.qBegin, h.qEnd) << what;
          next = h.qEnd;
          // Its KV heads are exactly the ones its query heads read, and its
          // share is a GQA problem of its own.
          ASSERT_EQ(h.kvBegin, h.qBegin / g) << what << ", rank " << r;
          ASSERT_EQ(h.kvEnd, (h.qEnd - 1) / g + 1) << what << ", rank " << r;
          ASSERT_EQ(h.q() % h.kv(), 0) << what << ", rank " << r;
          if (h.kv() > 1) ASSERT_EQ(h.q(), h.kv() * g) << what << ", rank " << r;
        }
        ASSERT_EQ(next, hq) << what;
        // Balanced as far as whole GQA groups (Hkv >= N) or shared KV heads
        // (Hkv < N) allow.
        if (hkv >= n) EXPECT_LE(most - least, g) << what;
        else EXPECT_LE(most, (g + n / hkv - 1) / (n / hkv)) << what;
        if (hq % n == 0 && (hkv % n == 0 || n % hkv == 0)) EXPECT_EQ(most, least) << what;
      }
}

// Head counts that leave ranks unequal shares, or none.
TEST(HeadParallel, UnevenHeadSplitsAreExactThreads) {
  struct Shape { int hq, hkv, n; };
  const Shape shapes[] = {{12, 3, 2}, {12, 3, 4}, {6, 6, 4}, {8, 8, 3}, {3, 1, 5}, {4, 4, 7}};
  for (const Shape& s : shapes) {
    for (attnDataType_t t : {attnFloat32, attnBfloat16}) {
      const attnAttnConfig_t cfg = AttnCfg(s.hq, s.hkv, 24, t, true);
      std::vector<int32_t> T = {5 * s.n + 3, 7}, P = {11, 0};
      const AttnCase c = MakeCase("uneven heads", PrefillSpec(cfg, T, P), 900 + s.hq * 10 + s.n);
      const Placement pl = RandomPlacement(c, s.n, 31 + s.n, -1);
      RunThreads(s.n, [&](int rank, int, attnComm_t& comm) {
        ExpectRingAttentionExact(c, pl, rank, comm, attnModeHeadParallel, true,
                                 "Hq " + std::to_string(s.hq) + " Hkv " + std::to_string(s.hkv));
      }, AttnRunOptions());
    }
  }
}

TEST(HeadParallel, LongCausalSequenceProcesses) {
  const int n = 4;
  const attnAttnConfig_t cfg = AttnCfg(8, 4, 64, attnBfloat16, true);
  std::vector<int32_t> T = {1000}, P = {200};
  const AttnCase c = MakeCase("long sequence", PrefillSpec(cfg, T, P), 4242);
  const Placement pl = PlannerPlacement(c, T, P, n);
  RunProcesses(n, [&](int rank, int, attnComm_t& comm) {
    ExpectRingAttentionExact(c, pl, rank, comm, attnModeHeadParallel, true, "processes");
  }, AttnRunOptions());
}

// What a rank sends is its rows once per other rank's heads, and the
// outputs for other ranks' rows once: (N-1)/N of Q, K, V and O when the
// heads divide evenly, against pass-KV's N-1 KV blocks.
TEST(HeadParallel, SendsEachRowOncePerOtherGroup) {
  const int n = 4, D = 32;
  const attnAttnConfig_t cfg = AttnCfg(8, 4, D, attnFloat32, false);
  std::vector<int32_t> T = {64}, P = {64};
  const AttnCase c = MakeCase("traffic", PrefillSpec(cfg, T, P), 77);
  const Placement pl = PlannerPlacement(c, T, P, n);
  std::vector<uint64_t> sent(n), rows(n), kvRows(n);
  RunThreads(n, [&](int rank, int, attnComm_t& comm) {
    ExpectRingAttentionExact(c, pl, rank, comm, attnModeHeadParallel, false, "traffic");
    sent[rank] = attn::attnStateOf(comm).last.bytesSent;
    rows[rank] = pl.q_rows[rank].size();
    kvRows[rank] = pl.kv_rows[rank].size();
  }, AttnRunOptions());
  for (int r = 0; r < n; ++r) {
    // Per other rank: 2 query heads and 1 KV head of our rows (fp32), and
    // 2 heads of output (fp32) plus their lse for its rows; headers and
    // 64-byte padding on top, a few hundred bytes at most.
    uint64_t payload = 0;
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      payload += rows[r] * 2 * D * 4 + kvRows[r] * 2 * 1 * D * 4;  // Q, then K and V
      payload += rows[p] * 2 * (D + 1) * 4;                        // O and lse
    }
    EXPECT_GE(sent[r], payload) << "rank " << r;
    EXPECT_LE(sent[r], payload + (n - 1) * 1024) << "rank " << r;
  }
}

// Ranks that disagree on the mode fail together, and the communicator
// still works afterwards.
TEST(HeadParallel, ModeMismatchFailsEveryRankThenWorks) {
  const int n = 3;
  const attnAttnConfig_t cfg = AttnCfg(6, 3, 16, attnFloat32, true);
  std::vector<int32_t> T = {20}, P = {5};
  const AttnCase c = MakeCase("mismatch", PrefillSpec(cfg, T, P), 5);
  const Placement pl = PlannerPlacement(c, T, P, n);
  RunThreads(n, [&](int rank, int, attnComm_t& comm) {
    const RankRun bad = RunRingAttentionRank(c, pl, rank, comm,
                                             rank == 1 ? attnModePassKV : attnModeHeadParallel, true);
    EXPECT_EQ(bad.rc, attnInvalidUsage) << bad.error;
    EXPECT_NE(bad.error.find("mode"), std::string::npos) << bad.error;
    ExpectRingAttentionExact(c, pl, rank, comm, attnModeHeadParallel, true, "after the mismatch");
  }, AttnRunOptions());
}

}  // namespace
}  // namespace attn_test
