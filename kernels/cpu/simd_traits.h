// The few vector operations the attention kernel needs, once per instruction
// set. Included by the isa_*.cc units after their `#pragma GCC target`; a
// traits struct is only defined where the unit enables its instruction set
// (ATTN_KERNEL_AVX512 / ATTN_KERNEL_AVX2).
//
// Tile shapes per ISA: kRows stacked query rows per tile; the score kernel
// keeps kSJ keys x kSC vectors of accumulators, the P.V kernel kPR rows x kPC
// vectors, sized to the register file (32 zmm / 16 ymm / 16 xmm).
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <cstdint>
#include <cstring>
#include <limits>

namespace {

// 2^f on [-0.5, 0.5]: least-squares fit, relative error 2.7e-9.
constexpr float kExp2C1 = 0.6931472056005104f, kExp2C2 = 0.240226466087139f,
                kExp2C3 = 0.055503289975177984f, kExp2C4 = 0.00961851953435526f,
                kExp2C5 = 0.0013399860363060092f, kExp2C6 = 0.00015337576831145398f;

#if defined(ATTN_KERNEL_AVX2) || defined(ATTN_KERNEL_AVX512)
// out[0..3] = the lane sums of four 8-lane vectors: two rounds of pairwise
// adds leave each 128-bit half holding the four partial sums.
inline void hsum4of8(__m256 a, __m256 b, __m256 c, __m256 d, float* out) {
  const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
}
#endif

#if defined(ATTN_KERNEL_AVX512)
struct SimdAvx512 {
  static constexpr int W = 16;
  static constexpr int kRows = 256, kSJ = 4, kSC = 4, kPR = 4, kPC = 4;
  using V = __m512;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  // -inf where the key is in the future of the query.
  static V maskCausal(V s, int32_t kpos, const int32_t* qpos) {
    const __mmask16 visible = _mm512_cmple_epi32_mask(
        _mm512_set1_epi32(kpos), _mm512_loadu_si512(qpos));
    return _mm512_mask_blend_ps(visible, set1(-std::numeric_limits<float>::infinity()), s);
  }
  // -inf where the key lies outside [qlo, qhi] (sliding window): one
  // compare pair, the second under the first's mask.
  static V maskSpan(V s, int32_t kpos, const int32_t* qlo, const int32_t* qhi) {
    const __m512i k = _mm512_set1_epi32(kpos);
    const __mmask16 below_hi = _mm512_cmple_epi32_mask(k, _mm512_loadu_si512(qhi));
    const __mmask16 visible = _mm512_mask_cmpge_epi32_mask(below_hi, k, _mm512_loadu_si512(qlo));
    return _mm512_mask_blend_ps(visible, set1(-std::numeric_limits<float>::infinity()), s);
  }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static V abs(V x) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff)));
  }
  // |mag| with the sign of `sign` (mag is not negative).
  static V copySign(V mag, V sign) {
    return _mm512_castsi512_ps(_mm512_or_si512(
        _mm512_castps_si512(mag),
        _mm512_and_si512(_mm512_castps_si512(sign), _mm512_set1_epi32(int32_t(0x80000000u)))));
  }
  // x < t ? a : b lane by lane (false for NaN).
  static V selectLess(V x, V t, V a, V b) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, t, _CMP_LT_OQ), b, a);
  }
  // x where finite-or-NaN, 0 where -inf (a running max with nothing seen yet).
  static V zeroIfNegInf(V x) {
    const __mmask16 ninf = _mm512_cmp_ps_mask(
        x, set1(-std::numeric_limits<float>::infinity()), _CMP_EQ_OQ);
    return _mm512_mask_blend_ps(ninf, x, zero());
  }
  // 2^x; 0 for -inf, NaN stays NaN (max_ps returns its second operand on NaN).
  static V exp2(V x) {
    x = _mm512_max_ps(set1(-150.0f), x);
    const V n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const V f = sub(x, n);
    V p = set1(kExp2C6);
    p = fma(p, f, set1(kExp2C5));
    p = fma(p, f, set1(kExp2C4));
    p = fma(p, f, set1(kExp2C3));
    p = fma(p, f, set1(kExp2C2));
    p = fma(p, f, set1(kExp2C1));
    p = fma(p, f, set1(1.0f));
    return _mm512_scalef_ps(p, n);
  }
  // out[0..3] = the lane sums of a, b, c, d.
  static __m256 foldHalves(V x) {
    return _mm256_add_ps(_mm512_castps512_ps256(x),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
  }
  static void hsum4(V a, V b, V c, V d, float* out) {
    hsum4of8(foldHalves(a), foldHalves(b), foldHalves(c), foldHalves(d), out);
  }
};
#endif

#if defined(ATTN_KERNEL_AVX512_BF16)
// AVX-512 plus AVX512_BF16 (Zen 4, Cooper Lake, Sapphire Rapids): the same
// kernel, except that bf16 decode scores multiply bf16 K and Q as they are,
// two products per fp32 lane per instruction (the products of two bf16 are
// exact in fp32; inputs below 2^-126 count as 0).
struct SimdAvx512Bf16 : SimdAvx512 {
  static constexpr int kBf16PerVector = 32;
  using VB = __m512bh;
  static VB loadBf16(const uint16_t* p) { return (VB)_mm512_loadu_si512(p); }
  // acc + a[2i] * b[2i] + a[2i+1] * b[2i+1] in lane i.
  static V dotBf16(V acc, VB a, VB b) { return _mm512_dpbf16_ps(acc, a, b); }
  // P·V two keys per instruction: P of keys j, j+1 rounded to bf16 and
  // paired per lane (dword i = p0[i] | p1[i] << 16).
  static __m512i pairBf16(V p0, V p1) {
    alignas(64) static constexpr uint16_t kInterleave[32] = {
        0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
        8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(p1, p0);  // words 0-15: p0, 16-31: p1
    return _mm512_permutexvar_epi16(_mm512_load_si512(kInterleave), both);
  }
  // Two V rows' 32 bf16 columns [d, d + 32) paired per lane, as
  // _mm512_unpack{lo,hi}_epi16 leave them: `lo` lane 4L + m holds column
  // 8L + m, `hi` lane 4L + m column 8L + 4 + m (L = 0..3, m = 0..3).
  static void pairRows(const uint16_t* v0, const uint16_t* v1, VB* lo, VB* hi) {
    const __m512i x = _mm512_loadu_si512(v0), y = _mm512_loadu_si512(v1);
    *lo = (VB)_mm512_unpacklo_epi16(x, y);
    *hi = (VB)_mm512_unpackhi_epi16(x, y);
  }
  // Columns [d, d + 16) and [d + 16, d + 32) (n0, n1) into pairRows' lane
  // order (lo, hi), and back.
  static void toPairOrder(V n0, V n1, V* lo, V* hi) {
    alignas(64) static constexpr int32_t kLo[16] = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
    alignas(64) static constexpr int32_t kHi[16] = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
    *lo = _mm512_permutex2var_ps(n0, _mm512_load_si512(kLo), n1);
    *hi = _mm512_permutex2var_ps(n0, _mm512_load_si512(kHi), n1);
  }
  static void fromPairOrder(V lo, V hi, V* n0, V* n1) {
    alignas(64) static constexpr int32_t k0[16] = {0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23};
    alignas(64) static constexpr int32_t k1[16] = {8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31};
    *n0 = _mm512_permutex2var_ps(lo, _mm512_load_si512(k0), hi);
    *n1 = _mm512_permutex2var_ps(lo, _mm512_load_si512(k1), hi);
  }
  static VB broadcastPair(const float* p) {
    uint32_t bits;
    std::memcpy(&bits, p, 4);
    return (VB)_mm512_set1_epi32(int32_t(bits));
  }
  // out[0..3] = scale * the lane sums of a, b, c, d.
  static void hsum4Scaled(V a, V b, V c, V d, float scale, float* out) {
    const __m256 ab = _mm256_hadd_ps(foldHalves(a), foldHalves(b));
    const __m256 abcd = _mm256_hadd_ps(ab, _mm256_hadd_ps(foldHalves(c), foldHalves(d)));
    const __m128 sums =
        _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
    _mm_storeu_ps(out, _mm_mul_ps(sums, _mm_set1_ps(scale)));
  }
};
#endif

#if defined(ATTN_KERNEL_AVX2) || defined(ATTN_KERNEL_AVX512)
struct SimdAvx2 {
  static constexpr int W = 8;
  static constexpr int kRows = 192, kSJ = 4, kSC = 3, kPR = 4, kPC = 3;
  using V = __m256;
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static V maskCausal(V s, int32_t kpos, const int32_t* qpos) {
    const __m256i future = _mm256_cmpgt_epi32(
        _mm256_set1_epi32(kpos), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qpos)));
    return _mm256_blendv_ps(s, set1(-std::numeric_limits<float>::infinity()),
                            _mm256_castsi256_ps(future));
  }
  static V maskSpan(V s, int32_t kpos, const int32_t* qlo, const int32_t* qhi) {
    const __m256i k = _mm256_set1_epi32(kpos);
    const __m256i out = _mm256_or_si256(
        _mm256_cmpgt_epi32(k, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qhi))),
        _mm256_cmpgt_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qlo)), k));
    return _mm256_blendv_ps(s, set1(-std::numeric_limits<float>::infinity()), _mm256_castsi256_ps(out));
  }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V abs(V x) { return _mm256_andnot_ps(set1(-0.0f), x); }
  static V copySign(V mag, V sign) { return _mm256_or_ps(mag, _mm256_and_ps(sign, set1(-0.0f))); }
  static V selectLess(V x, V t, V a, V b) { return _mm256_blendv_ps(b, a, _mm256_cmp_ps(x, t, _CMP_LT_OQ)); }
  static V zeroIfNegInf(V x) {
    const V ninf = _mm256_cmp_ps(x, set1(-std::numeric_limits<float>::infinity()), _CMP_EQ_OQ);
    return _mm256_andnot_ps(ninf, x);
  }
  // 2^x with the exponent built in integer lanes; results below 2^-126 flush
  // to 0 (they cannot matter next to the row maximum's 1).
  static V exp2(V x) {
    x = _mm256_max_ps(set1(-127.0f), x);
    const V n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const V f = sub(x, n);
    V p = set1(kExp2C6);
    p = fma(p, f, set1(kExp2C5));
    p = fma(p, f, set1(kExp2C4));
    p = fma(p, f, set1(kExp2C3));
    p = fma(p, f, set1(kExp2C2));
    p = fma(p, f, set1(kExp2C1));
    p = fma(p, f, set1(1.0f));
    const __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return mul(p, _mm256_castsi256_ps(e));
  }
  static void hsum4(V a, V b, V c, V d, float* out) { hsum4of8(a, b, c, d, out); }
};
#endif

// Portable: GCC vector extensions (SSE2 on x86-64, NEON elsewhere). No FMA
// contraction is assumed, so fma is a multiply and an add.
struct SimdGeneric {
  static constexpr int W = 4;
  static constexpr int kRows = 128, kSJ = 4, kSC = 2, kPR = 4, kPC = 2;
  using V = float __attribute__((vector_size(16)));
  using VI = int32_t __attribute__((vector_size(16)));
  static V zero() { return V{0, 0, 0, 0}; }
  static V set1(float x) { return V{x, x, x, x}; }
  static V load(const float* p) { V v; std::memcpy(&v, p, sizeof v); return v; }
  static void store(float* p, V v) { std::memcpy(p, &v, sizeof v); }
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  static V mul(V a, V b) { return a * b; }
  static V fma(V a, V b, V c) { return a * b + c; }
  static V max(V a, V b) { return a > b ? a : b; }
  static V maskCausal(V s, int32_t kpos, const int32_t* qpos) {
    VI q;
    std::memcpy(&q, qpos, sizeof q);
    const VI k = VI{kpos, kpos, kpos, kpos};
    return k > q ? set1(-std::numeric_limits<float>::infinity()) : s;
  }
  static V maskSpan(V s, int32_t kpos, const int32_t* qlo, const int32_t* qhi) {
    VI lo, hi;
    std::memcpy(&lo, qlo, sizeof lo);
    std::memcpy(&hi, qhi, sizeof hi);
    const VI k = VI{kpos, kpos, kpos, kpos};
    return (k > hi) | (k < lo) ? set1(-std::numeric_limits<float>::infinity()) : s;
  }
  static V div(V a, V b) { return a / b; }
  static V abs(V x) {
    VI b;
    std::memcpy(&b, &x, sizeof b);
    b &= 0x7fffffff;
    std::memcpy(&x, &b, sizeof b);
    return x;
  }
  static V copySign(V mag, V sign) {
    VI m, s;
    std::memcpy(&m, &mag, sizeof m);
    std::memcpy(&s, &sign, sizeof s);
    m |= s & VI{INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN};
    std::memcpy(&mag, &m, sizeof m);
    return mag;
  }
  static V selectLess(V x, V t, V a, V b) { return x < t ? a : b; }
  static V zeroIfNegInf(V x) {
    return x == set1(-std::numeric_limits<float>::infinity()) ? zero() : x;
  }
  static V exp2(V x) {
    x = x < set1(-127.0f) ? set1(-127.0f) : x;  // NaN compares false: stays NaN
    // Round to nearest via the 1.5 * 2^23 trick (|x| < 2^22 here).
    const V magic = set1(12582912.0f);
    const V n = (x + magic) - magic;
    const V f = x - n;
    V p = set1(kExp2C6);
    p = p * f + set1(kExp2C5);
    p = p * f + set1(kExp2C4);
    p = p * f + set1(kExp2C3);
    p = p * f + set1(kExp2C2);
    p = p * f + set1(kExp2C1);
    p = p * f + set1(1.0f);
    const VI e = (__builtin_convertvector(n, VI) + 127) << 23;
    V scale;
    std::memcpy(&scale, &e, sizeof scale);
    return p * scale;
  }
  static void hsum4(V a, V b, V c, V d, float* out) {
    out[0] = (a[0] + a[1]) + (a[2] + a[3]);
    out[1] = (b[0] + b[1]) + (b[2] + b[3]);
    out[2] = (c[0] + c[1]) + (c[2] + c[3]);
    out[3] = (d[0] + d[1]) + (d[2] + d[3]);
  }
};

}  // namespace
