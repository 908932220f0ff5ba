#include "kernels/cpu/convert.h"

#include <cstring>

#include "kernels/cpu/kernel_table.h"

namespace attn::cpu {

attnResult_t convertToFloat(float* dst, const void* src, attnDataType_t type, size_t count) {
  const auto& k = activeKernels();
  switch (type) {
    case attnFloat32:
      if (count && dst != src) std::memmove(dst, src, count * sizeof(float));
      return attnSuccess;
    case attnFloat16: k.widen_fp16(dst, src, count); return attnSuccess;
    case attnBfloat16: k.widen_bf16(dst, src, count); return attnSuccess;
    default: return attnInvalidArgument;
  }
}

attnResult_t convertFromFloat(void* dst, attnDataType_t type, const float* src, size_t count) {
  const auto& k = activeKernels();
  switch (type) {
    case attnFloat32:
      if (count && dst != src) std::memmove(dst, src, count * sizeof(float));
      return attnSuccess;
    case attnFloat16: k.narrow_fp16(dst, src, count); return attnSuccess;
    case attnBfloat16: k.narrow_bf16(dst, src, count); return attnSuccess;
    default: return attnInvalidArgument;
  }
}

}  // namespace attn::cpu
