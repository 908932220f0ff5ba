// The values each rank puts in its buffers, and what every receiver must
// find, as functions of (rank, element index). All are small non-negative
// integers, exact in every data type, so results are checked bit for bit;
// a rank that sends the wrong block or reduces the wrong index shows up.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attncomm.h"

namespace attnperf {

// Keeps data-movement values inside the type's exact integer range.
inline uint64_t copyModulus(attnDataType_t t) {
  switch (t) {
    case attnInt8: return 127;
    case attnUint8: return 251;
    case attnFloat16: return 2039;   // half: integers <= 2048 are exact
    case attnBfloat16: return 251;   // bf16: integers <= 256 are exact
    case attnInt32: case attnFloat32: return 16777213;  // < 2^24
    default: return 2147483647;
  }
}

// Element i of the block rank `src` sends to rank `dst` (data movement:
// all-gather, all-to-all, broadcast, send/recv). Never negative, so -1 can
// mark a slot nobody wrote.
inline double copyValue(attnDataType_t t, int src, int dst, size_t i) {
  const uint64_t v = uint64_t(src) * 131u + uint64_t(dst) * 17u + uint64_t(i) * 7u + 1u;
  return double(v % copyModulus(t));
}

// Element j of rank r's input to a reduction with `op` over n ranks.
inline double reduceInput(attnRedOp_t op, int r, size_t j) {
  switch (op) {
    case attnProd: return ((size_t(r) + j) % 5 == 0) ? 2.0 : 1.0;  // stays finite longer
    case attnMax: case attnMin: return double((size_t(r) * 3 + j) % 7);
    case attnAvg: return double(j % 4) + 2.0 * r;  // sum divisible by n
    default: return double((size_t(r) + j) % 4);
  }
}

// What element j of the reduction must be: op over r in [0, n).
inline double reduceExpected(attnRedOp_t op, int n, size_t j) {
  double acc = reduceInput(op, 0, j);
  for (int r = 1; r < n; r++) {
    const double v = reduceInput(op, r, j);
    switch (op) {
      case attnProd: acc *= v; break;
      case attnMax: acc = v > acc ? v : acc; break;
      case attnMin: acc = v < acc ? v : acc; break;
      default: acc += v; break;
    }
  }
  return op == attnAvg ? acc / n : acc;
}

// Slack for avg on floating types: dividing by n (or multiplying by 1/n)
// may round one way or the other. Everything else must match exactly.
inline double reduceTolerance(attnDataType_t t, attnRedOp_t op) {
  if (op != attnAvg) return 0.0;
  switch (t) {
    case attnFloat16: return 2e-3;
    case attnBfloat16: return 1.6e-2;
    case attnFloat32: return 5e-7;
    case attnFloat64: return 1e-15;
    default: return 0.0;
  }
}

}  // namespace attnperf
