// Sizes formed from counts a peer may choose: a product or sum that would
// overflow saturates at UINT64_MAX, so comparing it with a bound refuses it
// instead of letting it wrap to something small.
#pragma once

#include <cstdint>

namespace attn {

inline uint64_t satMul(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

inline uint64_t satAdd(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

}  // namespace attn
