// Names of data types / reduction ops (nccl-tests spelling), and typed
// element access so fill and check loops stay generic but fast: every value
// the harness writes is a small integer, exactly representable in its type.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "attncomm.h"

namespace attnperf {

size_t typeSize(attnDataType_t t);
const char* typeName(attnDataType_t t);
const char* opName(attnRedOp_t op);
bool parseType(const std::string& s, attnDataType_t* t);
bool parseOp(const std::string& s, attnRedOp_t* op);
bool isFloatType(attnDataType_t t);

// IEEE half and bfloat16 (round to nearest even).
uint16_t floatToHalf(float f);
float halfToFloat(uint16_t h);
uint16_t floatToBf16(float f);
float bf16ToFloat(uint16_t b);

// Stores v (a double) into element i of a buffer of type t, with the
// conversion the type's arithmetic would do (integers wrap modulo 2^bits).
inline void storeElem(attnDataType_t t, void* buf, size_t i, double v) {
  switch (t) {
    case attnInt8: static_cast<int8_t*>(buf)[i] = int8_t(int64_t(v)); break;
    case attnUint8: static_cast<uint8_t*>(buf)[i] = uint8_t(int64_t(v)); break;
    case attnInt32: static_cast<int32_t*>(buf)[i] = int32_t(int64_t(v)); break;
    case attnInt64: static_cast<int64_t*>(buf)[i] = int64_t(v); break;
    case attnFloat16: static_cast<uint16_t*>(buf)[i] = floatToHalf(float(v)); break;
    case attnFloat32: static_cast<float*>(buf)[i] = float(v); break;
    case attnFloat64: static_cast<double*>(buf)[i] = v; break;
    case attnBfloat16: static_cast<uint16_t*>(buf)[i] = floatToBf16(float(v)); break;
    default: break;
  }
}

inline double loadElem(attnDataType_t t, const void* buf, size_t i) {
  switch (t) {
    case attnInt8: return static_cast<const int8_t*>(buf)[i];
    case attnUint8: return static_cast<const uint8_t*>(buf)[i];
    case attnInt32: return static_cast<const int32_t*>(buf)[i];
    case attnInt64: return double(static_cast<const int64_t*>(buf)[i]);
    case attnFloat16: return halfToFloat(static_cast<const uint16_t*>(buf)[i]);
    case attnFloat32: return static_cast<const float*>(buf)[i];
    case attnFloat64: return static_cast<const double*>(buf)[i];
    case attnBfloat16: return bf16ToFloat(static_cast<const uint16_t*>(buf)[i]);
    default: return 0;
  }
}

// Writes gen(i) for i in [0, n) into buf.
template <class Gen>
void fillBuffer(attnDataType_t t, void* buf, size_t n, Gen&& gen) {
  for (size_t i = 0; i < n; i++) storeElem(t, buf, i, gen(i));
}

// Counts elements of buf that differ from want(i) rounded to type t.
// relTol > 0 accepts a relative error (used for avg on floating types,
// whose division by nranks may round differently from ours).
template <class Want>
size_t countWrong(attnDataType_t t, const void* buf, size_t n, Want&& want,
                  double relTol = 0.0) {
  size_t wrong = 0;
  double one = 0;
  for (size_t i = 0; i < n; i++) {
    storeElem(t, &one, 0, want(i));  // round the expectation like the type
    const double w = loadElem(t, &one, 0);
    const double got = loadElem(t, buf, i);
    if (got == w) continue;
    const double d = got > w ? got - w : w - got;
    if (relTol > 0 && d <= relTol * (w < 0 ? -w : w)) continue;
    wrong++;
  }
  return wrong;
}

}  // namespace attnperf
