#include "perf/datatypes.h"

#include <cmath>

namespace attnperf {

namespace {
struct TypeInfo {
  const char* name;  // nccl-tests spelling, printed in the table
  size_t size;
  bool isFloat;
};
constexpr TypeInfo kTypes[attnNumTypes] = {
    {"int8", 1, false},  {"uint8", 1, false}, {"int32", 4, false},
    {"int64", 8, false}, {"half", 2, true},   {"float", 4, true},
    {"double", 8, true}, {"bfloat16", 2, true}};
constexpr const char* kOps[attnNumOps] = {"sum", "prod", "max", "min", "avg"};

bool validType(attnDataType_t t) { return t >= 0 && t < attnNumTypes; }

uint32_t floatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float bitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace

size_t typeSize(attnDataType_t t) { return validType(t) ? kTypes[t].size : 0; }
const char* typeName(attnDataType_t t) { return validType(t) ? kTypes[t].name : "?"; }
bool isFloatType(attnDataType_t t) { return validType(t) && kTypes[t].isFloat; }
const char* opName(attnRedOp_t op) {
  return (op >= 0 && op < attnNumOps) ? kOps[op] : "?";
}

bool parseType(const std::string& s, attnDataType_t* t) {
  // Aliases people type out of habit (torch / numpy names).
  static const struct { const char* alias; attnDataType_t t; } kAliases[] = {
      {"char", attnInt8},      {"fp16", attnFloat16},  {"float16", attnFloat16},
      {"fp32", attnFloat32},   {"float32", attnFloat32}, {"fp64", attnFloat64},
      {"float64", attnFloat64}, {"bf16", attnBfloat16}, {"int", attnInt32}};
  for (int i = 0; i < attnNumTypes; i++)
    if (s == kTypes[i].name) return *t = attnDataType_t(i), true;
  for (const auto& a : kAliases)
    if (s == a.alias) return *t = a.t, true;
  return false;
}

bool parseOp(const std::string& s, attnRedOp_t* op) {
  for (int i = 0; i < attnNumOps; i++)
    if (s == kOps[i]) return *op = attnRedOp_t(i), true;
  return false;
}

uint16_t floatToHalf(float f) {
  const uint32_t x = floatBits(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u)  // inf or nan
    return sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u);
  if (absx >= 0x477ff000u) return sign | 0x7c00u;  // rounds past 65504
  if (absx < 0x38800000u) {
    // Subnormal half: scale so the integer part holds the mantissa bits and
    // let the FPU round to nearest even.
    const float a = bitsFloat(absx) * 16777216.0f;  // 2^24
    return sign | uint16_t(std::nearbyint(a));
  }
  // Normal: rebias exponent, round the 13 dropped bits to nearest even.
  uint32_t m = absx + 0xc8000fffu + ((absx >> 13) & 1u);
  return sign | uint16_t(m >> 13);
}

float halfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0) {  // zero or subnormal: m * 2^-24
    const float v = float(m) / 16777216.0f;
    return sign ? -v : v;
  }
  if (e == 31) return bitsFloat(sign | 0x7f800000u | (m << 13));
  return bitsFloat(sign | ((e + 112u) << 23) | (m << 13));
}

uint16_t floatToBf16(float f) {
  const uint32_t x = floatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // nan
  return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

float bf16ToFloat(uint16_t b) { return bitsFloat(uint32_t(b) << 16); }

}  // namespace attnperf
