// Converting rows between fp32 (the accumulator form) and fp16 / bf16 / fp32
// storage, e.g. to write an attention output in the model's dtype.
// Narrowing rounds to nearest even; NaN stays NaN.
#pragma once

#include <cstddef>

#include "attncomm.h"

namespace attn::cpu {

inline bool isAttnFloatType(attnDataType_t t) {
  return t == attnFloat32 || t == attnFloat16 || t == attnBfloat16;
}

// dst and src must not overlap (for fp32 they may be equal).
// dst[i] = float(src[i]); attnInvalidArgument unless type is fp32/fp16/bf16.
[[nodiscard]] attnResult_t convertToFloat(float* dst, const void* src, attnDataType_t type,
                                          size_t count);
// dst[i] = type(src[i]).
[[nodiscard]] attnResult_t convertFromFloat(void* dst, attnDataType_t type, const float* src,
                                            size_t count);

}  // namespace attn::cpu
