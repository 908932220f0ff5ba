// kernels/cpu/sinks.h: attention sinks folded into a finished result, in
// place, against the definition in double, lse' = log(exp(lse) + exp(sink)),
// O' = O exp(lse - lse'): ordinary rows, rows that saw no key (LSE -inf,
// garbage O that must become 0), heads without a sink (-inf), and values
// whose exponentials overflow fp32 (the maximum is subtracted).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/sinks.h"

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The definition in double (exp(x) of double overflows only past ~709).
void sinksInDouble(const std::vector<float>& o, const std::vector<float>& lse, int heads, int d,
                   const std::vector<float>& sinks, std::vector<double>& want_o, std::vector<double>& want_l) {
  want_o.assign(o.size(), 0.0);
  want_l.assign(lse.size(), 0.0);
  for (size_t i = 0; i < lse.size(); ++i) {
    const double l = lse[i], s = sinks[i % size_t(heads)];
    const double el = std::isinf(l) ? 0.0 : std::exp(l), es = std::isinf(s) ? 0.0 : std::exp(s);
    want_l[i] = std::log(el + es);  // -inf when both are -inf
    const double f = std::isinf(l) ? 0.0 : el / (el + es);
    for (int c = 0; c < d; ++c) want_o[i * d + c] = f == 0.0 ? 0.0 : o[i * d + c] * f;
  }
}

void check(const std::vector<float>& o, const std::vector<float>& lse, int heads, int d,
           const std::vector<float>& sinks) {
  const int64_t rows = int64_t(lse.size()) / heads;
  std::vector<float> got_o = o, got_l = lse;
  attn::cpu::applySinks(got_o.data(), got_l.data(), rows, heads, d, sinks.data());
  std::vector<double> want_o, want_l;
  sinksInDouble(o, lse, heads, d, sinks, want_o, want_l);
  for (size_t i = 0; i < lse.size(); ++i) {
    if (std::isinf(want_l[i])) EXPECT_TRUE(std::isinf(got_l[i]) && got_l[i] < 0) << i;
    else EXPECT_NEAR(got_l[i], want_l[i], 2e-6 * std::max(1.0, std::fabs(want_l[i]))) << i;
    // The factor exp(lse - lse') inherits lse' rounded to fp32: a relative
    // error of up to an ulp of |lse'|.
    const double rel = 2e-6 + (std::isinf(want_l[i]) ? 0.0 : 2.4e-7 * std::fabs(want_l[i]));
    for (int c = 0; c < d; ++c)
      ASSERT_NEAR(got_o[i * d + c], want_o[i * d + c], rel * std::fabs(want_o[i * d + c]) + 1e-37)
          << i << "," << c;
  }
}

TEST(CpuSinks, MatchTheDefinition) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 4.f);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  const int heads = 6, d = 33, rows = 50;
  const std::vector<float> sinks = {0.f, kNegInf, 3.5f, -12.f, 25.f, -1.f};
  std::vector<float> o(size_t(rows) * heads * d), lse(size_t(rows) * heads);
  for (auto& x : o) x = u(rng);
  for (size_t i = 0; i < lse.size(); ++i) {
    lse[i] = nd(rng);
    if (i % 9 == 2) {  // saw no key: O is garbage
      lse[i] = kNegInf;
      for (int c = 0; c < d; ++c) o[i * d + c] = std::numeric_limits<float>::quiet_NaN();
    }
  }
  check(o, lse, heads, d, sinks);
}

TEST(CpuSinks, LargeValuesDoNotOverflow) {
  // exp(100) and exp(200) overflow fp32; the results are well within it.
  const std::vector<float> sinks = {100.f, 200.f, -300.f, 88.f};
  const std::vector<float> lse = {100.f, 150.f, -290.f, 89.f, 300.f, kNegInf, kNegInf, -500.f};
  std::vector<float> o(lse.size() * 4);
  for (size_t i = 0; i < o.size(); ++i) o[i] = 0.25f * float(i % 7) - 0.5f;
  for (size_t i = 5 * 4; i < 7 * 4; ++i) o[i] = 0.0f;  // rows that saw no key
  check(o, lse, 4, 4, sinks);
  std::vector<float> got_o = o, got_l = lse;
  attn::cpu::applySinks(got_o.data(), got_l.data(), 2, 4, 4, sinks.data());
  EXPECT_NEAR(got_l[0], 100.f + std::log(2.f), 1e-4);  // equal LSE and sink: half the weight each
  EXPECT_NEAR(got_o[1], o[1] * 0.5f, 1e-5);  // lse' = 100.69 rounds to an fp32 ulp of 8e-6
  EXPECT_FLOAT_EQ(got_l[5], 200.f);  // no key: the sink alone, O = 0
  EXPECT_EQ(got_o[5 * 4], 0.0f);
}

// Without sinks (-inf) a row is left as it is, except that a row that saw
// no key gets O = 0 for whatever garbage it held; no rows: nothing is read.
TEST(CpuSinks, NoSinkAndEmptyCalls) {
  const std::vector<float> sinks = {kNegInf, kNegInf};
  std::vector<float> o = {1.f, 2.f, 3.f, 4.f}, lse = {0.5f, kNegInf};
  attn::cpu::applySinks(o.data(), lse.data(), 1, 2, 2, sinks.data());
  EXPECT_EQ(o, (std::vector<float>{1.f, 2.f, 0.f, 0.f}));
  EXPECT_EQ(lse[0], 0.5f);
  EXPECT_TRUE(std::isinf(lse[1]) && lse[1] < 0);
  const std::vector<float> o0 = o;
  attn::cpu::applySinks(o.data(), lse.data(), 0, 2, 2, nullptr);
  EXPECT_EQ(o, o0);
}

}  // namespace
