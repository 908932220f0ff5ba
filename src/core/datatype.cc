#include "src/core/datatype.h"

namespace attn {

const char* dataTypeName(attnDataType_t t) {
  static const char* names[] = {"int8", "uint8", "int32", "int64", "half", "float", "double", "bfloat16"};
  return validDataType(t) ? names[t] : "invalid";
}

const char* redOpName(attnRedOp_t op) {
  static const char* names[] = {"sum", "prod", "max", "min", "avg"};
  return validRedOp(op) ? names[op] : "invalid";
}

}  // namespace attn
