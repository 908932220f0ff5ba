// What moves an attention call's messages (ATTN_ATTN_PROGRESS): a progress
// thread, or the calling thread in its waits. Every ring mode gives the
// reference's answer either way, on thread and process ranks, small calls
// (decode rows, which auto leaves to the caller) and large ones (prefill
// blocks past 64 KiB, which auto gives a thread) alike.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attncomm.h"
#include "support/attn_fixtures.h"
#include "support/multirank.h"

namespace {

using attn_test::AttnCase;
using attn_test::Placement;

struct Shape {
  const char* name;
  std::vector<int32_t> new_lens, cached_lens;
};

void RunEveryMode(const char* progress, const Shape& shape, bool processes) {
  SCOPED_TRACE(std::string("ATTN_ATTN_PROGRESS=") + progress + ", " + shape.name +
               (processes ? ", processes" : ", threads"));
  const int n = 3;
  const attnAttnConfig_t cfg = attn_test::AttnCfg(8, 2, 64, attnFloat32, true);
  const AttnCase c = attn_test::MakeCase(shape.name, attn_test::PrefillSpec(cfg, shape.new_lens, shape.cached_lens), 11);
  const Placement pl = attn_test::PlannerPlacement(c, shape.new_lens, shape.cached_lens, n);
  attn_test::RunOptions o = attn_test::AttnRunOptions();
  o.env.push_back({"ATTN_ATTN_PROGRESS", progress});
  auto body = [&](int rank, int, attnComm_t& comm) {
    for (attnAttnMode_t m :
         {attnModePassKV, attnModePassQ, attnModeShipQ, attnModeHeadParallel, attnModeAllGatherKV}) {
      const attn_test::RankRun run = attn_test::RunRingAttentionRank(c, pl, rank, comm, m, true);
      ASSERT_EQ(run.rc, attnSuccess) << attn_test::ModeName(m) << ": " << run.error;
      EXPECT_EQ(run.stats.rows, int64_t(pl.q_rows[size_t(rank)].size()) * cfg.num_q_heads)  // (row, head) pairs
          << attn_test::ModeName(m);
      EXPECT_TRUE(attn_test::WithinBounds(run.stats, cfg.dtype, attn_test::ModeName(m)));
    }
  };
  if (processes)
    attn_test::RunProcesses(n, body, o);
  else
    attn_test::RunThreads(n, body, o);
}

const Shape kDecode{"decode", {1, 1}, {700, 300}};       // one new token per sequence
const Shape kPrefill{"prefill", {900, 500}, {0, 200}};  // blocks of ~100+ KiB

TEST(AttnProgress, CallerDrivenThreads) {
  RunEveryMode("caller", kDecode, false);
  RunEveryMode("caller", kPrefill, false);
}
TEST(AttnProgress, ThreadDrivenThreads) {
  RunEveryMode("thread", kDecode, false);
  RunEveryMode("thread", kPrefill, false);
}
TEST(AttnProgress, AutoProcesses) {
  RunEveryMode("auto", kDecode, true);
  RunEveryMode("auto", kPrefill, true);
}
TEST(AttnProgress, CallerDrivenProcesses) { RunEveryMode("caller", kPrefill, true); }

}  // namespace
