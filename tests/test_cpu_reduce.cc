// Reductions of kernels/cpu/reduce.h against a scalar reference, on every
// instruction set the CPU has, every type x op, odd counts, all aliasing
// forms; and the fp16/bf16 rounding against an independent definition.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/convert.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/reduce.h"
#include "src/core/datatype.h"

namespace attn::cpu {
namespace {

std::vector<Isa> supportedIsas() {
  std::vector<Isa> v{Isa::kGeneric};
  if (detectedIsa() >= Isa::kAvx2) v.push_back(Isa::kAvx2);
  if (detectedIsa() >= Isa::kAvx512) v.push_back(Isa::kAvx512);
  if (detectedIsa() >= Isa::kAvx512Bf16) v.push_back(Isa::kAvx512Bf16);
  return v;
}

// Restores the detected ISA when a test ends.
struct IsaGuard {
  explicit IsaGuard(Isa isa) { forceIsa(isa); }
  ~IsaGuard() { forceIsa(detectedIsa()); }
};

// ---- scalar reference -------------------------------------------------------

template <class T>
T refCombine(T a, T b, attnRedOp_t op) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    switch (op) {
      case attnProd: return T(U(a) * U(b));
      case attnMax: return a > b ? a : b;
      case attnMin: return a < b ? a : b;
      default: return T(U(a) + U(b));
    }
  } else {
    if (std::isnan(a) && (op == attnMax || op == attnMin)) return a;
    if (std::isnan(b) && (op == attnMax || op == attnMin)) return b;
    switch (op) {
      case attnProd: return a * b;
      case attnMax: return a > b ? a : b;
      case attnMin: return a < b ? a : b;
      default: return a + b;
    }
  }
}

// Combines element i in the reference way for `type`; returns raw bits.
uint64_t refElem(attnDataType_t type, const void* a, const void* b, size_t i, attnRedOp_t op) {
  auto bits = [](auto v) {
    uint64_t u = 0;
    std::memcpy(&u, &v, sizeof v);
    return u;
  };
  switch (type) {
    case attnInt8: return bits(refCombine(((const int8_t*)a)[i], ((const int8_t*)b)[i], op));
    case attnUint8: return bits(refCombine(((const uint8_t*)a)[i], ((const uint8_t*)b)[i], op));
    case attnInt32: return bits(refCombine(((const int32_t*)a)[i], ((const int32_t*)b)[i], op));
    case attnInt64: return bits(refCombine(((const int64_t*)a)[i], ((const int64_t*)b)[i], op));
    case attnFloat32: return bits(refCombine(((const float*)a)[i], ((const float*)b)[i], op));
    case attnFloat64: return bits(refCombine(((const double*)a)[i], ((const double*)b)[i], op));
    case attnFloat16:
      return floatToHalf(refCombine(halfToFloat(((const uint16_t*)a)[i]),
                                    halfToFloat(((const uint16_t*)b)[i]), op));
    case attnBfloat16:
      return floatToBf16(refCombine(bf16ToFloat(((const uint16_t*)a)[i]),
                                    bf16ToFloat(((const uint16_t*)b)[i]), op));
    default: return 0;
  }
}

uint64_t refDivide(attnDataType_t type, const void* a, size_t i, int n) {
  auto bits = [](auto v) {
    uint64_t u = 0;
    std::memcpy(&u, &v, sizeof v);
    return u;
  };
  switch (type) {
    case attnInt8: return bits(int8_t(((const int8_t*)a)[i] / n));
    case attnUint8: return bits(uint8_t(((const uint8_t*)a)[i] / n));
    case attnInt32: return bits(int32_t(((const int32_t*)a)[i] / n));
    case attnInt64: return bits(int64_t(((const int64_t*)a)[i] / n));
    case attnFloat32: return bits(((const float*)a)[i] / float(n));
    case attnFloat64: return bits(((const double*)a)[i] / double(n));
    case attnFloat16: return floatToHalf(halfToFloat(((const uint16_t*)a)[i]) / float(n));
    case attnBfloat16: return floatToBf16(bf16ToFloat(((const uint16_t*)a)[i]) / float(n));
    default: return 0;
  }
}

uint64_t elemBits(attnDataType_t type, const void* p, size_t i) {
  uint64_t u = 0;
  const size_t sz = dataTypeSize(type);
  std::memcpy(&u, static_cast<const char*>(p) + i * sz, sz);
  return u;
}

bool isNanBits(attnDataType_t type, uint64_t u) {
  switch (type) {
    case attnFloat16: return (u & 0x7c00) == 0x7c00 && (u & 0x3ff);
    case attnBfloat16: return (u & 0x7f80) == 0x7f80 && (u & 0x7f);
    case attnFloat32: { float f; uint32_t w = uint32_t(u); std::memcpy(&f, &w, 4); return std::isnan(f); }
    case attnFloat64: { double d; std::memcpy(&d, &u, 8); return std::isnan(d); }
    default: return false;
  }
}

// Random contents: full-range integers (so sums wrap), floats in [-4, 4)
// with a sprinkle of NaN, +-inf and -0 when `specials`.
std::vector<char> randomData(attnDataType_t type, size_t n, uint32_t seed, bool specials) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uf(-4.0f, 4.0f);
  const size_t sz = dataTypeSize(type);
  std::vector<char> buf(n * sz + 1);
  for (size_t i = 0; i < n; ++i) {
    char* at = buf.data() + i * sz;
    float f = uf(rng);
    if (specials) {
      const uint64_t r = rng() % 64;
      if (r == 0) f = std::numeric_limits<float>::quiet_NaN();
      if (r == 1) f = std::numeric_limits<float>::infinity();
      if (r == 2) f = -std::numeric_limits<float>::infinity();
      if (r == 3) f = -0.0f;
    }
    switch (type) {
      case attnFloat32: std::memcpy(at, &f, 4); break;
      case attnFloat64: { double d = double(f) * 1.000001; std::memcpy(at, &d, 8); break; }
      case attnFloat16: { uint16_t h = floatToHalf(f); std::memcpy(at, &h, 2); break; }
      case attnBfloat16: { uint16_t h = floatToBf16(f); std::memcpy(at, &h, 2); break; }
      default: { uint64_t r = rng(); std::memcpy(at, &r, sz); break; }
    }
  }
  return buf;
}

void expectSame(attnDataType_t type, const void* got, const std::vector<uint64_t>& want,
                const std::string& what) {
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const uint64_t g = elemBits(type, got, i);
    if (g == want[i] || (isNanBits(type, g) && isNanBits(type, want[i]))) continue;
    if (bad++ < 3)
      ADD_FAILURE() << what << " element " << i << ": got 0x" << std::hex << g << " want 0x"
                    << want[i];
  }
  EXPECT_EQ(bad, 0u) << what;
}

const attnRedOp_t kOps[] = {attnSum, attnProd, attnMax, attnMin, attnAvg};
const size_t kCounts[] = {0, 1, 17, 63, 64, 65, 1000003};

TEST(CpuReduce, EveryTypeOpCountAndForm) {
  for (int t = 0; t < attnNumTypes; ++t) {
    const auto type = attnDataType_t(t);
    for (size_t n : kCounts) {
      const auto a = randomData(type, n, 1 + t * 7 + n, true);
      const auto b = randomData(type, n, 2 + t * 11 + n, true);
      for (attnRedOp_t op : kOps) {
        std::vector<uint64_t> want(n);
        for (size_t i = 0; i < n; ++i) want[i] = refElem(type, a.data(), b.data(), i, op);
        for (Isa isa : supportedIsas()) {
          IsaGuard guard(isa);
          const std::string what = std::string(isaName(isa)) + " " + dataTypeName(type) + " " +
                                   redOpName(op) + " n=" + std::to_string(n);
          auto d = a;  // reduceInto
          reduceInto(d.data(), b.data(), n, type, op);
          expectSame(type, d.data(), want, what + " into");

          std::vector<char> out(a.size());  // out of place
          reduce2(out.data(), a.data(), b.data(), n, type, op);
          expectSame(type, out.data(), want, what + " out");

          d = a;  // dst == a
          reduce2(d.data(), d.data(), b.data(), n, type, op);
          expectSame(type, d.data(), want, what + " dst=a");

          auto e = b;  // dst == b keeps operand order (NaN payloads, -0)
          reduce2(e.data(), a.data(), e.data(), n, type, op);
          expectSame(type, e.data(), want, what + " dst=b");

          if (op == attnAvg) {  // sum, then divide by the rank count
            std::vector<uint64_t> div(n);
            for (int ranks : {3, 7}) {
              for (size_t i = 0; i < n; ++i) div[i] = refDivide(type, out.data(), i, ranks);
              auto f = out;
              divideInPlace(f.data(), n, type, ranks);
              expectSame(type, f.data(), div, what + " divide " + std::to_string(ranks));
            }
          }
        }
      }
    }
  }
}

TEST(CpuReduce, IntegerWrapAndNanRules) {
  int8_t a8[2] = {127, -128}, b8[2] = {1, -1};
  reduceInto(a8, b8, 2, attnInt8, attnSum);
  EXPECT_EQ(a8[0], -128);
  EXPECT_EQ(a8[1], 127);
  int32_t a32 = std::numeric_limits<int32_t>::max(), b32 = 2;
  reduceInto(&a32, &b32, 1, attnInt32, attnProd);
  EXPECT_EQ(a32, -2);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (Isa isa : supportedIsas()) {
    IsaGuard guard(isa);
    float x[4] = {nan, 1.0f, nan, 2.0f}, y[4] = {1.0f, nan, nan, 3.0f};
    reduceInto(x, y, 4, attnFloat32, attnMax);
    EXPECT_TRUE(std::isnan(x[0]) && std::isnan(x[1]) && std::isnan(x[2])) << isaName(isa);
    EXPECT_EQ(x[3], 3.0f);
    uint16_t h[2] = {floatToBf16(nan), floatToBf16(1.0f)}, g[2] = {floatToBf16(5.0f), floatToBf16(nan)};
    reduceInto(h, g, 2, attnBfloat16, attnMin);
    EXPECT_TRUE(std::isnan(bf16ToFloat(h[0])) && std::isnan(bf16ToFloat(h[1])));
  }
}

// ---- fp16 / bf16 rounding -----------------------------------------------------

// Round to nearest even, by definition: the two neighbours in the target
// format and an exact comparison of distances (all values fit a double).
template <class ToF, class Next>
uint16_t rneByDefinition(float f, uint16_t lo_bits, ToF to_float, Next next_up) {
  const uint16_t hi_bits = next_up(lo_bits);
  const double lo = to_float(lo_bits), hi = to_float(hi_bits), x = std::fabs(double(f));
  const double twice = 2 * x - (lo + hi);  // exact: < 53 significant bits
  if (twice < 0) return lo_bits;
  if (twice > 0) return hi_bits;
  return (lo_bits & 1) ? hi_bits : lo_bits;
}

uint16_t halfRneRef(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double x = std::fabs(double(f));
  if (x >= 65520.0) return sign | 0x7c00;
  uint16_t lo = 0;  // largest half <= x, by binary search over the bit patterns
  for (uint16_t step = 0x4000; step; step >>= 1)
    if (lo + step < 0x7c00 && halfToFloat(uint16_t(lo + step)) <= x) lo = uint16_t(lo + step);
  return sign | rneByDefinition(f, lo, [](uint16_t h) { return double(halfToFloat(h)); },
                                [](uint16_t h) { return uint16_t(h + 1); });
}

uint16_t bf16RneRef(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000);
  const uint16_t lo = uint16_t((u & 0x7fffffff) >> 16);  // truncation = largest bf16 <= |f|
  // 0x7f80 is where rounding overflows: it stands for 2^128 here, not inf.
  return sign | rneByDefinition(f, lo,
                                [](uint16_t b) {
                                  return b == 0x7f80 ? std::ldexp(1.0, 128) : double(bf16ToFloat(b));
                                },
                                [](uint16_t b) { return uint16_t(b + 1); });
}

std::vector<float> roundingProbes() {
  std::vector<float> v;
  std::mt19937 rng(42);
  for (int i = 0; i < 200000; ++i) {  // random bit patterns, finite
    uint32_t u = rng();
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isfinite(f)) v.push_back(f);
  }
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // every half and its neighbourhood
    const float x = halfToFloat(uint16_t(h)), y = halfToFloat(uint16_t(h + 1));
    const float mid = float((double(x) + double(y)) / 2);
    for (float f : {x, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      v.push_back(f);
      v.push_back(-f);
    }
  }
  for (float f : {65504.0f, 65519.99f, 65520.0f, 1e-8f, 2.98e-8f, 2.9802322e-8f, 5.96e-8f,
                  6.1035156e-5f, 3.3895314e38f, 3.4028235e38f})
    v.push_back(f);
  return v;
}

TEST(CpuHalf, ScalarConversionsMatchTheDefinition) {
  for (float f : roundingProbes()) {
    ASSERT_EQ(floatToHalf(f), halfRneRef(f)) << "fp16 of " << f;
    ASSERT_EQ(floatToBf16(f), bf16RneRef(f)) << "bf16 of " << f;
  }
  for (uint32_t h = 0; h < 0x10000; ++h) {  // widening is exact: round trips
    const float f = halfToFloat(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16ToFloat(floatToBf16(f))));
      EXPECT_EQ(floatToHalf(f) & 0x7e00, 0x7e00);  // quiet NaN
      continue;
    }
    EXPECT_EQ(floatToHalf(f), h);
    EXPECT_EQ(floatToBf16(bf16ToFloat(uint16_t(h))), h);
  }
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(floatToHalf(inf), 0x7c00);
  EXPECT_EQ(floatToHalf(-inf), 0xfc00);
  EXPECT_EQ(floatToBf16(inf), 0x7f80);
  EXPECT_EQ(floatToBf16(-3.4028235e38f), 0xff80);  // RNE overflows to -inf
}

TEST(CpuHalf, VectorConversionsMatchScalar) {
  std::vector<float> probes = roundingProbes();
  probes.push_back(std::numeric_limits<float>::quiet_NaN());
  probes.push_back(-std::numeric_limits<float>::infinity());
  const size_t n = probes.size();
  for (Isa isa : supportedIsas()) {
    IsaGuard guard(isa);
    std::vector<uint16_t> h(n), b(n);
    ASSERT_EQ(convertFromFloat(h.data(), attnFloat16, probes.data(), n), attnSuccess);
    ASSERT_EQ(convertFromFloat(b.data(), attnBfloat16, probes.data(), n), attnSuccess);
    for (size_t i = 0; i < n; ++i) {
      if (std::isnan(probes[i])) {
        EXPECT_TRUE(std::isnan(halfToFloat(h[i])) && std::isnan(bf16ToFloat(b[i])));
        continue;
      }
      ASSERT_EQ(h[i], floatToHalf(probes[i])) << isaName(isa) << " fp16 of " << probes[i];
      ASSERT_EQ(b[i], floatToBf16(probes[i])) << isaName(isa) << " bf16 of " << probes[i];
    }
    std::vector<uint16_t> all(0x10000);
    for (uint32_t i = 0; i < 0x10000; ++i) all[i] = uint16_t(i);
    std::vector<float> wide(0x10000);
    ASSERT_EQ(convertToFloat(wide.data(), all.data(), attnFloat16, all.size()), attnSuccess);
    for (uint32_t i = 0; i < 0x10000; ++i) {
      const float want = halfToFloat(uint16_t(i));
      if (std::isnan(want)) EXPECT_TRUE(std::isnan(wide[i]));
      else ASSERT_EQ(std::memcmp(&wide[i], &want, 4), 0) << isaName(isa) << " half 0x" << std::hex << i;
    }
  }
}

}  // namespace
}  // namespace attn::cpu
