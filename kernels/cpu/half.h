// Scalar IEEE half and bfloat16 <-> fp32 conversions, portable and exact.
// Narrowing rounds to nearest even; NaN stays NaN (quiet, sign and top
// payload bits kept), matching what F16C hardware does, so the scalar and
// SIMD paths give the same bits.
#pragma once

#include <bit>
#include <cstdint>

namespace attn::cpu {

inline float halfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0x1f) {  // inf or NaN; a NaN comes out quiet
    return std::bit_cast<float>(sign | 0x7f800000u | (m << 13) | (m ? 0x00400000u : 0u));
  }
  if (e == 0) {  // zero or subnormal: m * 2^-24, exact in fp32
    const float mag = float(m) * 0x1p-24f;
    return sign ? -mag : mag;
  }
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
}

inline uint16_t floatToHalf(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) {  // inf or NaN
    return a == 0x7f800000u ? uint16_t(sign | 0x7c00u)
                            : uint16_t(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  }
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (a >= 0x38800000u) {  // normal half: rebias the exponent, round 13 bits off
    const uint32_t r = a - 0x38000000u;
    return uint16_t(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
  }
  // Subnormal half (or zero): the result counts units of 2^-24.
  const uint32_t e = a >> 23;
  if (e < 102) return sign;  // below half the smallest subnormal
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;  // 14..24
  uint32_t r = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
  return uint16_t(sign | r);
}

inline float bf16ToFloat(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }

inline uint16_t floatToBf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  // Rounding a NaN could carry into the exponent; keep it a quiet NaN.
  return (f != f) ? uint16_t((u >> 16) | 0x40u) : uint16_t(rounded);
}

}  // namespace attn::cpu
