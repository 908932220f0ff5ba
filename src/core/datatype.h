// Sizes and names of the public data types and reduction ops.
#pragma once

#include <cstddef>

#include "attncomm.h"
#include "kernels/kernel_types.h"

namespace attn {

// The facts live with the kernels (a leaf that may not include this file).
inline size_t dataTypeSize(attnDataType_t t) { return kernels::elementSize(t); }
inline bool validDataType(attnDataType_t t) { return kernels::validType(t); }
inline bool validRedOp(attnRedOp_t op) { return kernels::validOp(op); }
const char* dataTypeName(attnDataType_t t);
const char* redOpName(attnRedOp_t op);

}  // namespace attn
