// Element-wise reduction loops, instantiated once per instruction set by the
// isa_*.cc units (see half_block.h for why this is in an unnamed namespace).
// Loops run in fixed blocks of kBlk elements so that GCC vectorises them even
// under -O2's "very cheap" cost model (trip count known, no runtime checks);
// __restrict is honest because reduce.cc routes aliasing calls to the in-place
// forms.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/half_block.h"

namespace {

constexpr size_t kBlk = 64;

// Integer arithmetic wraps (done unsigned: signed overflow would be UB).
template <class T, bool = std::is_integral_v<T>>
struct WideOf { using type = T; };
template <class T>
struct WideOf<T, true> { using type = std::make_unsigned_t<T>; };
template <class T>
using Wide = typename WideOf<T>::type;

struct SumOp {
  template <class T> static T apply(T a, T b) { return T(Wide<T>(a) + Wide<T>(b)); }
};
struct ProdOp {
  template <class T> static T apply(T a, T b) { return T(Wide<T>(a) * Wide<T>(b)); }
};
// Floating max/min propagate NaN from either side (a != a only for NaN).
struct MaxOp {
  template <class T> static T apply(T a, T b) { return (a > b) | (a != a) ? a : b; }
};
struct MinOp {
  template <class T> static T apply(T a, T b) { return (a < b) | (a != a) ? a : b; }
};

// Forms: how the two operands and the destination relate.
enum Form : int {
  kInto = 0,  // d = d op y
  kRev = 1,   // d = y op d
  kOut = 2,   // d = x op y, no aliasing
};

// Three loop nests rather than one with a lambda: GCC drops __restrict on
// captured pointers (and on restrict locals), and then the vectoriser needs
// runtime alias checks, which -O2's cost model refuses.
template <class T, class Op, int F>
void loopNative(T* __restrict d, const T* __restrict x, const T* __restrict y, size_t n) {
  size_t i = 0;
  if constexpr (F == kInto) {
    for (; i + kBlk <= n; i += kBlk)
      for (size_t j = i; j < i + kBlk; ++j) d[j] = Op::apply(d[j], y[j]);
    for (; i < n; ++i) d[i] = Op::apply(d[i], y[i]);
  } else if constexpr (F == kRev) {
    for (; i + kBlk <= n; i += kBlk)
      for (size_t j = i; j < i + kBlk; ++j) d[j] = Op::apply(y[j], d[j]);
    for (; i < n; ++i) d[i] = Op::apply(y[i], d[i]);
  } else {
    for (; i + kBlk <= n; i += kBlk)
      for (size_t j = i; j < i + kBlk; ++j) d[j] = Op::apply(x[j], y[j]);
    for (; i < n; ++i) d[i] = Op::apply(x[i], y[i]);
  }
}

template <class T, class Op, int F>
void reduceNative(void* d, const void* x, const void* y, size_t n) {
  loopNative<T, Op, F>(static_cast<T*>(d), static_cast<const T*>(x), static_cast<const T*>(y), n);
}

// fp16/bf16: widen to fp32, combine, round back (nearest even). Whole
// vectors in registers where the ISA has the conversions, then blocks
// through fp32 scratch (the portable path, and tails).
template <class Tag, class Op, int F>
void reduceHalf(void* dv, const void* xv, const void* yv, size_t n) {
  uint16_t* d = static_cast<uint16_t*>(dv);
  const uint16_t* x = static_cast<const uint16_t*>(F == kOut ? xv : dv);
  const uint16_t* y = static_cast<const uint16_t*>(yv);
  size_t i = 0;
#if defined(ATTN_KERNEL_AVX512) || defined(ATTN_KERNEL_AVX2)
  for (; i + kHalfLanes <= n; i += kHalfLanes) {
    const HalfVec a = loadHalfVec(x + i, Tag{}), b = loadHalfVec(y + i, Tag{});
    storeHalfVec(d + i, F == kRev ? Op::apply(b, a) : Op::apply(a, b), Tag{});
  }
#endif
  alignas(64) float fx[kBlk] = {}, fy[kBlk] = {};  // tail lanes stay finite
  for (; i < n; i += kBlk) {
    const size_t m = n - i < kBlk ? n - i : kBlk;
    widenRow(fx, x + i, m, Tag{});
    widenRow(fy, y + i, m, Tag{});
    for (size_t j = 0; j < kBlk; ++j)
      fx[j] = F == kRev ? Op::apply(fy[j], fx[j]) : Op::apply(fx[j], fy[j]);
    narrowRow(d + i, fx, m, Tag{});
  }
}

template <class T>
void divideNative(void* dv, size_t n, int by) {
  T* __restrict d = static_cast<T*>(dv);
  if constexpr (std::is_integral_v<T>) {
    const int64_t b = by;  // one scalar path; integer divide does not vectorise
    for (size_t i = 0; i < n; ++i) d[i] = T(int64_t(d[i]) / b);
  } else {
    const T b = T(by);
    size_t i = 0;
    for (; i + kBlk <= n; i += kBlk)
      for (size_t j = 0; j < kBlk; ++j) d[i + j] = d[i + j] / b;
    for (; i < n; ++i) d[i] = d[i] / b;
  }
}

template <class Tag>
void divideHalf(void* dv, size_t n, int by) {
  uint16_t* d = static_cast<uint16_t*>(dv);
  const float b = float(by);
  size_t i = 0;
#if defined(ATTN_KERNEL_AVX512) || defined(ATTN_KERNEL_AVX2)
  for (; i + kHalfLanes <= n; i += kHalfLanes)  // vector / scalar: b in every lane
    storeHalfVec(d + i, loadHalfVec(d + i, Tag{}) / b, Tag{});
#endif
  alignas(64) float f[kBlk] = {};
  for (; i < n; i += kBlk) {
    const size_t m = n - i < kBlk ? n - i : kBlk;
    widenRow(f, d + i, m, Tag{});
    for (size_t j = 0; j < kBlk; ++j) f[j] = f[j] / b;
    narrowRow(d + i, f, m, Tag{});
  }
}

}  // namespace
