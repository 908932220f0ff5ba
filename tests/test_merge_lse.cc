// attnMergeAttnStatesLse on host memory: n partials in each LSE convention
// (natural / base 2, token-major / head-major) x fp32 / fp16 / bf16, in place
// and not, against a double-precision merge of the same inputs; its
// attnLseNatural, attnLseTokenMajor case is attnMergeAttnStates bit for bit;
// bad conventions are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attncomm.h"
#include "kernels/cpu/convert.h"
#include "tests/support/lse_conventions.h"

namespace attn_test {
namespace {

constexpr int64_t kRows = 7;
constexpr int kHeads = 5, kD = 12, kParts = 3;
constexpr size_t kCells = size_t(kRows) * kHeads;
constexpr float kNinf = -std::numeric_limits<float>::infinity();

// n partials: O in dtype (and its exact fp32 values), natural token-major
// LSE with -inf here and there, and cell 3 -inf in every partial.
struct Partials {
  std::vector<std::vector<uint8_t>> o;  // [rows, heads, D] in dtype
  std::vector<std::vector<float>> oF;   // the same values in fp32
  std::vector<std::vector<float>> lse;  // natural [rows, heads]
};

Partials MakePartials(attnDataType_t t, int seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-2.f, 2.f), l(-6.f, 6.f);
  const size_t esz = t == attnFloat32 ? 4 : 2;
  Partials p;
  for (int j = 0; j < kParts; ++j) {
    std::vector<float> o(kCells * kD), lse(kCells);
    for (float& x : o) x = u(g);
    for (size_t c = 0; c < kCells; ++c) lse[c] = c == 3 || (c + j) % 4 == 0 ? kNinf : l(g);
    std::vector<uint8_t> bytes(o.size() * esz);
    EXPECT_EQ(attn::cpu::convertFromFloat(bytes.data(), t, o.data(), o.size()), attnSuccess);
    EXPECT_EQ(attn::cpu::convertToFloat(o.data(), bytes.data(), t, o.size()), attnSuccess);
    p.o.push_back(bytes);
    p.oF.push_back(o);
    p.lse.push_back(lse);
  }
  return p;
}

// The merge in double: O [cells, D], natural LSE [cells].
void ReferenceMerge(const Partials& p, std::vector<double>* o, std::vector<double>* lse) {
  o->assign(kCells * kD, 0.0);
  lse->assign(kCells, -std::numeric_limits<double>::infinity());
  for (size_t c = 0; c < kCells; ++c) {
    double mx = -std::numeric_limits<double>::infinity();
    for (int j = 0; j < kParts; ++j) mx = std::max(mx, double(p.lse[j][c]));
    if (std::isinf(mx)) continue;
    double sum = 0;
    for (int j = 0; j < kParts; ++j) sum += p.lse[j][c] == kNinf ? 0.0 : std::exp(double(p.lse[j][c]) - mx);
    for (int j = 0; j < kParts; ++j) {
      if (p.lse[j][c] == kNinf) continue;
      const double w = std::exp(double(p.lse[j][c]) - mx) / sum;
      for (int d = 0; d < kD; ++d) (*o)[c * kD + d] += w * p.oF[j][c * kD + d];
    }
    (*lse)[c] = mx + std::log(sum);
  }
}

double OutTolerance(attnDataType_t t) { return t == attnFloat32 ? 1e-5 : t == attnFloat16 ? 4e-3 : 3e-2; }

void ExpectMerged(const std::vector<float>& o, const std::vector<float>& lseNatural, const std::vector<double>& refO,
                  const std::vector<double>& refLse, attnDataType_t t, const std::string& what) {
  for (size_t c = 0; c < kCells; ++c) {
    if (std::isinf(refLse[c])) {
      EXPECT_EQ(lseNatural[c], kNinf) << what << ", cell " << c;
      for (int d = 0; d < kD; ++d) EXPECT_EQ(o[c * kD + d], 0.0f) << what << ", cell " << c;
      continue;
    }
    EXPECT_NEAR(lseNatural[c], refLse[c], 1e-4) << what << ", cell " << c;
    for (int d = 0; d < kD; ++d)
      ASSERT_NEAR(o[c * kD + d], refO[c * kD + d], OutTolerance(t)) << what << ", cell " << c << ", d " << d;
  }
}

TEST(MergeLse, EveryConventionAndDtypeEqualsTheDoubleMerge) {
  for (attnDataType_t t : {attnFloat32, attnFloat16, attnBfloat16}) {
    const Partials p = MakePartials(t, 11 + int(t));
    std::vector<double> refO, refLse;
    ReferenceMerge(p, &refO, &refLse);
    for (attnLseBase_t base : kLseBases) {
      for (attnLseLayout_t layout : kLseLayouts) {
        for (bool inPlace : {false, true}) {
          const std::string what = std::string(t == attnFloat32 ? "fp32" : t == attnFloat16 ? "fp16" : "bf16") +
                                   ", " + LseConventionName(base, layout) + (inPlace ? ", in place" : "");
          std::vector<std::vector<uint8_t>> o = p.o;
          std::vector<std::vector<float>> lse(kParts, std::vector<float>(kCells));
          std::vector<const void*> outs;
          std::vector<const float*> lses;
          for (int j = 0; j < kParts; ++j) {
            ToLseConvention(p.lse[j].data(), lse[j].data(), kRows, kHeads, base, layout);
            outs.push_back(o[j].data());
            lses.push_back(lse[j].data());
          }
          std::vector<uint8_t> outBytes(o[0].size());
          std::vector<float> outLse(kCells);
          void* out = inPlace ? o[0].data() : outBytes.data();
          float* outL = inPlace ? lse[0].data() : outLse.data();
          ASSERT_EQ(attnMergeAttnStatesLse(kParts, outs.data(), lses.data(), out, outL, kRows, kHeads, kD, t, base,
                                           layout, nullptr),
                    attnSuccess)
              << what << ": " << attnGetLastError(nullptr);
          std::vector<float> of(kCells * kD);
          ASSERT_EQ(attn::cpu::convertToFloat(of.data(), out, t, of.size()), attnSuccess);
          ExpectMerged(of, FromLseConvention(outL, kRows, kHeads, base, layout), refO, refLse, t, what);
        }
      }
    }
  }
}

TEST(MergeLse, NullLseAndOnePartial) {
  const Partials p = MakePartials(attnBfloat16, 5);
  std::vector<float> lse(kCells);
  ToLseConvention(p.lse[1].data(), lse.data(), kRows, kHeads, attnLseBase2, attnLseHeadMajor);
  const void* outs[] = {p.o[1].data()};
  const float* lses[] = {lse.data()};
  std::vector<uint8_t> out(p.o[1].size());
  ASSERT_EQ(attnMergeAttnStatesLse(1, outs, lses, out.data(), nullptr, kRows, kHeads, kD, attnBfloat16,
                                   attnLseBase2, attnLseHeadMajor, nullptr),
            attnSuccess);
  // One partial merges to itself (rows that saw no key become 0).
  std::vector<float> of(kCells * kD);
  ASSERT_EQ(attn::cpu::convertToFloat(of.data(), out.data(), attnBfloat16, of.size()), attnSuccess);
  for (size_t c = 0; c < kCells; ++c)
    for (int d = 0; d < kD; ++d)
      EXPECT_EQ(of[c * kD + d], p.lse[1][c] == kNinf ? 0.0f : p.oF[1][c * kD + d]) << "cell " << c;
}

TEST(MergeLse, NaturalTokenMajorIsAttnMergeAttnStatesBitForBit) {
  const Partials p = MakePartials(attnFloat16, 7);
  std::vector<const void*> outs;
  std::vector<const float*> lses;
  for (int j = 0; j < kParts; ++j) {
    outs.push_back(p.o[j].data());
    lses.push_back(p.lse[j].data());
  }
  std::vector<uint8_t> a(p.o[0].size()), b(p.o[0].size());
  std::vector<float> la(kCells), lb(kCells);
  ASSERT_EQ(attnMergeAttnStates(kParts, outs.data(), lses.data(), a.data(), la.data(), kRows, kHeads, kD,
                                attnFloat16, nullptr),
            attnSuccess);
  ASSERT_EQ(attnMergeAttnStatesLse(kParts, outs.data(), lses.data(), b.data(), lb.data(), kRows, kHeads, kD,
                                   attnFloat16, attnLseNatural, attnLseTokenMajor, nullptr),
            attnSuccess);
  EXPECT_EQ(a, b);
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), kCells * sizeof(float)), 0);
}

TEST(MergeLse, BadConventionsAreRefused) {
  std::vector<float> o(kCells * kD), l(kCells);
  const void* outs[] = {o.data()};
  const float* lses[] = {l.data()};
  EXPECT_EQ(attnMergeAttnStatesLse(1, outs, lses, o.data(), l.data(), kRows, kHeads, kD, attnFloat32,
                                   static_cast<attnLseBase_t>(2), attnLseTokenMajor, nullptr),
            attnInvalidArgument);
  EXPECT_NE(std::string(attnGetLastError(nullptr)).find("lse_base"), std::string::npos)
      << attnGetLastError(nullptr);
  EXPECT_EQ(attnMergeAttnStatesLse(1, outs, lses, o.data(), l.data(), kRows, kHeads, kD, attnFloat32,
                                   attnLseNatural, static_cast<attnLseLayout_t>(-1), nullptr),
            attnInvalidArgument);
  EXPECT_NE(std::string(attnGetLastError(nullptr)).find("lse_layout"), std::string::npos)
      << attnGetLastError(nullptr);
  EXPECT_EQ(attnMergeAttnStatesLse(0, outs, lses, o.data(), l.data(), kRows, kHeads, kD, attnFloat32,
                                   attnLseBase2, attnLseHeadMajor, nullptr),
            attnInvalidArgument);
}

}  // namespace
}  // namespace attn_test
