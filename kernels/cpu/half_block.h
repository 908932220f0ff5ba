// Block conversions between fp16/bf16 storage and fp32, for the per-ISA
// translation units (isa_*.cc): each includes this after its
// `#pragma GCC target` and defines ATTN_KERNEL_AVX512 or ATTN_KERNEL_AVX2
// (GCC does not set __AVX512F__ etc. for a pragma target in C++).
// Internal linkage: every unit gets its own copy, no ODR clash across ISAs.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/half.h"

namespace {

struct Fp16Tag {};
struct Bf16Tag {};

// n is any size; full vectors first, then a scalar tail.
inline void widenRow(float* __restrict d, const uint16_t* __restrict s, size_t n, Fp16Tag) {
  size_t i = 0;
#if defined(ATTN_KERNEL_AVX512)
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256(
                                reinterpret_cast<const __m256i*>(s + i))));
#elif defined(ATTN_KERNEL_AVX2)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(
                                reinterpret_cast<const __m128i*>(s + i))));
#endif
  for (; i < n; ++i) d[i] = attn::cpu::halfToFloat(s[i]);
}

inline void narrowRow(uint16_t* __restrict d, const float* __restrict s, size_t n, Fp16Tag) {
  size_t i = 0;
#if defined(ATTN_KERNEL_AVX512)
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(s + i),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(ATTN_KERNEL_AVX2)
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(s + i),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  for (; i < n; ++i) d[i] = attn::cpu::floatToHalf(s[i]);
}

// bf16 is plain bit arithmetic, which GCC vectorises at every level (in
// fixed blocks, so that -O2's cost model accepts it too).
inline void widenRow(float* __restrict d, const uint16_t* __restrict s, size_t n, Bf16Tag) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (size_t j = i; j < i + 16; ++j) d[j] = attn::cpu::bf16ToFloat(s[j]);
  for (; i < n; ++i) d[i] = attn::cpu::bf16ToFloat(s[i]);
}

inline void narrowRow(uint16_t* __restrict d, const float* __restrict s, size_t n, Bf16Tag) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (size_t j = i; j < i + 16; ++j) d[j] = attn::cpu::floatToBf16(s[j]);
  for (; i < n; ++i) d[i] = attn::cpu::floatToBf16(s[i]);
}

}  // namespace
