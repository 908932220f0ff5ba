// Element sizes and validity of the public data types and reduction ops, as
// the kernels need them (include/attncomm.h's enums; no library headers).
#pragma once

#include <cstddef>

#include "attncomm.h"

namespace attn::kernels {

inline size_t elementSize(attnDataType_t t) {
  switch (t) {
    case attnInt8: case attnUint8: return 1;
    case attnFloat16: case attnBfloat16: return 2;
    case attnInt32: case attnFloat32: return 4;
    case attnInt64: case attnFloat64: return 8;
    default: return 0;
  }
}
inline bool validType(attnDataType_t t) { return t >= 0 && t < attnNumTypes; }
inline bool validOp(attnRedOp_t op) { return op >= 0 && op < attnNumOps; }

}  // namespace attn::kernels
