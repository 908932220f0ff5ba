// The merge collectives (attnMergeAttnReduceScatter, attnMergeAttnAllGather)
// on host communicators: every rank's partial (O, LSE) for the same rows
// merges to exactly what attnMergeAttnStates gives over all the partials,
// each rank's share of the heads (reduce-scatter) or all of them
// (all-gather, in place too); fully masked rows stay 0 / -inf; bad
// arguments fail on every rank.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attncomm.h"
#include "support/multirank.h"

namespace {

struct Partial {
  std::vector<char> o;      // [rows, heads, D] in dtype
  std::vector<float> lse;   // [rows, heads]
};

size_t Esz(attnDataType_t t) { return t == attnFloat32 ? 4 : 2; }

// Rank r's partial, the same wherever it is made. Row 0 is fully masked on
// every rank (lse -inf, O 0); row 1 only on even ranks.
Partial MakePartial(int r, int64_t rows, int heads, int D, attnDataType_t t) {
  std::mt19937 g(1000 + r);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  Partial p;
  const size_t cells = size_t(rows) * heads;
  p.o.resize(cells * D * Esz(t));
  p.lse.resize(cells);
  for (size_t c = 0; c < cells; ++c) {
    const int64_t row = int64_t(c / heads);
    const bool masked = row == 0 || (row == 1 && r % 2 == 0);
    p.lse[c] = masked ? -std::numeric_limits<float>::infinity() : u(g) * 3;
    for (int d = 0; d < D; ++d) {
      const float x = masked ? 0.f : u(g);
      if (t == attnFloat32)
        std::memcpy(&p.o[(c * D + d) * 4], &x, 4);
      else {
        const uint16_t h = attn_test::FloatToBf16(x);
        std::memcpy(&p.o[(c * D + d) * 2], &h, 2);
      }
    }
  }
  return p;
}

float ToFloat(const char* p, attnDataType_t t) {
  if (t == attnFloat32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return attn_test::Bf16ToFloat(h);
}

// attnMergeAttnStates over every rank's partial.
Partial Expected(int n, int64_t rows, int heads, int D, attnDataType_t t) {
  std::vector<Partial> parts;
  for (int r = 0; r < n; ++r) parts.push_back(MakePartial(r, rows, heads, D, t));
  std::vector<const void*> outs;
  std::vector<const float*> lses;
  for (const Partial& p : parts) {
    outs.push_back(p.o.data());
    lses.push_back(p.lse.data());
  }
  Partial e;
  e.o.resize(parts[0].o.size());
  e.lse.resize(parts[0].lse.size());
  EXPECT_EQ(attnMergeAttnStates(n, outs.data(), lses.data(), e.o.data(), e.lse.data(), rows, heads, D, t, nullptr),
            attnSuccess);
  return e;
}

int HeadBegin(int r, int heads, int n) { return int(int64_t(r) * heads / n); }

// got [rows, h1 - h0, D] against the expectation's heads [h0, h1).
void ExpectHeads(const Partial& want, const char* gotO, const float* gotLse, int64_t rows, int heads, int D,
                 int h0, int h1, attnDataType_t t, const std::string& what) {
  const int h = h1 - h0;
  for (int64_t row = 0; row < rows; ++row)
    for (int k = 0; k < h; ++k) {
      const size_t w = size_t(row) * heads + h0 + k, g = size_t(row) * h + k;
      if (gotLse) {
        if (std::isinf(want.lse[w]))
          ASSERT_TRUE(std::isinf(gotLse[g]) && gotLse[g] < 0) << what << " row " << row << " head " << h0 + k;
        else
          ASSERT_NEAR(gotLse[g], want.lse[w], 1e-5f) << what << " row " << row << " head " << h0 + k;
      }
      for (int d = 0; d < D; ++d)
        ASSERT_NEAR(ToFloat(gotO + (g * D + d) * Esz(t), t), ToFloat(&want.o[(w * D + d) * Esz(t)], t),
                    t == attnFloat32 ? 1e-5f : 1e-2f)
            << what << " row " << row << " head " << h0 + k << " d " << d;
    }
}

struct Case {
  int n;
  int64_t rows;
  int heads, D;
  attnDataType_t t;
};

class MergeCollective : public ::testing::TestWithParam<Case> {};

TEST_P(MergeCollective, EqualsTheLocalMergeOfEveryPartial) {
  const Case c = GetParam();
  const Partial want = Expected(c.n, c.rows, c.heads, c.D, c.t);
  attn_test::RunThreads(c.n, [&](int rank, int n, attnComm_t& comm) {
    const Partial mine = MakePartial(rank, c.rows, c.heads, c.D, c.t);
    const int h0 = HeadBegin(rank, c.heads, n), h1 = HeadBegin(rank + 1, c.heads, n);
    // Reduce-scatter: this rank's heads.
    std::vector<char> o(size_t(c.rows) * (h1 - h0) * c.D * Esz(c.t) + 1);
    std::vector<float> l(size_t(c.rows) * (h1 - h0) + 1);
    ASSERT_EQ(attnMergeAttnReduceScatter(mine.o.data(), mine.lse.data(), o.data(), l.data(), c.rows, c.heads, c.D,
                                         c.t, comm, nullptr),
              attnSuccess)
        << attnGetLastError(comm);
    ExpectHeads(want, o.data(), l.data(), c.rows, c.heads, c.D, h0, h1, c.t, "reduce-scatter");
    // All-gather: every head, once into fresh buffers, once in place.
    std::vector<char> all(mine.o.size());
    std::vector<float> allLse(mine.lse.size());
    ASSERT_EQ(attnMergeAttnAllGather(mine.o.data(), mine.lse.data(), all.data(), allLse.data(), c.rows, c.heads,
                                     c.D, c.t, comm, nullptr),
              attnSuccess)
        << attnGetLastError(comm);
    ExpectHeads(want, all.data(), allLse.data(), c.rows, c.heads, c.D, 0, c.heads, c.t, "all-gather");
    Partial inPlace = mine;
    ASSERT_EQ(attnMergeAttnAllGather(inPlace.o.data(), inPlace.lse.data(), inPlace.o.data(), nullptr, c.rows,
                                     c.heads, c.D, c.t, comm, nullptr),
              attnSuccess)
        << attnGetLastError(comm);
    ExpectHeads(want, inPlace.o.data(), nullptr, c.rows, c.heads, c.D, 0, c.heads, c.t, "all-gather in place");
  });
}

INSTANTIATE_TEST_SUITE_P(Shapes, MergeCollective,
                         ::testing::Values(Case{1, 5, 4, 8, attnFloat32}, Case{2, 7, 8, 16, attnFloat32},
                                           Case{3, 9, 8, 32, attnFloat32},    // heads not a multiple of n
                                           Case{4, 6, 2, 8, attnFloat32},     // fewer heads than ranks
                                           Case{3, 0, 4, 8, attnFloat32},     // no rows
                                           Case{4, 11, 32, 64, attnBfloat16}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return "N" + std::to_string(i.param.n) + "_rows" + std::to_string(i.param.rows) +
                                  "_heads" + std::to_string(i.param.heads) +
                                  (i.param.t == attnFloat32 ? "_fp32" : "_bf16");
                         });

TEST(MergeCollectiveArgs, BadArgumentsFailOnTheRankThatGaveThem) {
  attn_test::RunThreads(2, [](int, int, attnComm_t& comm) {
    float o[16] = {}, l[4] = {};
    EXPECT_EQ(attnMergeAttnReduceScatter(o, l, o, l, 2, 0, 4, attnFloat32, comm, nullptr), attnInvalidArgument);
    EXPECT_EQ(attnMergeAttnAllGather(o, l, o, l, 2, 2, 4, attnInt32, comm, nullptr), attnInvalidArgument);
    EXPECT_EQ(attnMergeAttnAllGather(nullptr, l, o, l, 2, 2, 4, attnFloat32, comm, nullptr), attnInvalidArgument);
    int s = 0;
    EXPECT_EQ(attnMergeAttnAllGather(o, l, o, l, 2, 2, 4, attnFloat32, comm, reinterpret_cast<attnStream_t>(&s)),
              attnInvalidArgument);
    EXPECT_EQ(attnMergeAttnAllGather(o, l, o, l, int64_t(1) << 60, 1 << 20, 256, attnFloat32, comm, nullptr),
              attnInvalidArgument);
    // The communicator works after the refusals.
    EXPECT_EQ(attnMergeAttnAllGather(o, l, o, l, 2, 2, 4, attnFloat32, comm, nullptr), attnSuccess)
        << attnGetLastError(comm);
  });
}

// With ATTN_CHECK=1 a rank that refuses its arguments, or whose shape
// differs, fails the call on every rank instead of leaving them waiting.
TEST(MergeCollectiveArgs, WithChecksDisagreementFailsEveryRank) {
  attn_test::RunOptions o;
  o.env = {{"ATTN_CHECK", "1"}};
  attn_test::RunThreads(3, [](int rank, int, attnComm_t& comm) {
    std::vector<float> out(64, 0.f), lse(16, 0.f);
    const int heads = rank == 2 ? 0 : 4;  // rank 2 refuses
    EXPECT_NE(attnMergeAttnReduceScatter(out.data(), lse.data(), out.data(), lse.data(), 2, heads, 4, attnFloat32,
                                         comm, nullptr),
              attnSuccess);
    const int64_t rows = rank == 1 ? 3 : 2;  // rank 1's shape differs
    const attnResult_t r = attnMergeAttnAllGather(out.data(), lse.data(), out.data(), lse.data(), rows, 4, 2,
                                                  attnFloat32, comm, nullptr);
    EXPECT_EQ(r, attnInvalidUsage) << attnGetLastError(comm);
  }, o);
}

}  // namespace
