// Sizes and names of the public data types and reduction ops.
#pragma once

#include <cstddef>

#include "attncomm.h"

namespace attn {

inline size_t dataTypeSize(attnDataType_t t) {
  switch (t) {
    case attnInt8: case attnUint8: return 1;
    case attnFloat16: case attnBfloat16: return 2;
    case attnInt32: case attnFloat32: return 4;
    case attnInt64: case attnFloat64: return 8;
    default: return 0;
  }
}
inline bool validDataType(attnDataType_t t) { return t >= 0 && t < attnNumTypes; }
inline bool validRedOp(attnRedOp_t op) { return op >= 0 && op < attnNumOps; }
const char* dataTypeName(attnDataType_t t);
const char* redOpName(attnRedOp_t op);

}  // namespace attn
