// Block conversions between fp16/bf16 storage and fp32, for the per-ISA
// translation units (isa_*.cc): each includes this after its
// `#pragma GCC target` and defines ATTN_KERNEL_AVX512 or ATTN_KERNEL_AVX2
// (GCC does not set __AVX512F__ etc. for a pragma target in C++).
// Internal linkage: every unit gets its own copy, no ODR clash across ISAs.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

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

// Whole vectors of fp16/bf16 as fp32 lanes, for the reduction main loops.
#if defined(ATTN_KERNEL_AVX512)
constexpr size_t kHalfLanes = 16;
using HalfVec = __m512;

inline __m512 loadHalfVec(const uint16_t* p, Fp16Tag) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline void storeHalfVec(uint16_t* p, __m512 v, Fp16Tag) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
inline __m512 loadHalfVec(const uint16_t* p, Bf16Tag) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
// Same rounding as floatToBf16: add 0x7fff + lsb, keep the top half; NaN
// becomes a quiet NaN instead.
inline void storeHalfVec(uint16_t* p, __m512 v, Bf16Tag) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan,
                            _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}
#elif defined(ATTN_KERNEL_AVX2)
constexpr size_t kHalfLanes = 8;
using HalfVec = __m256;

inline __m256 loadHalfVec(const uint16_t* p, Fp16Tag) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline void storeHalfVec(uint16_t* p, __m256 v, Fp16Tag) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
inline __m256 loadHalfVec(const uint16_t* p, Bf16Tag) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline void storeHalfVec(uint16_t* p, __m256 v, Bf16Tag) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  r = _mm256_blendv_epi8(r, quiet, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  // packus works per 128-bit lane: pack, then gather the two low quarters.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xd8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}
#endif

}  // namespace
