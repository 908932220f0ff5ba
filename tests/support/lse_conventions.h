// LSE conventions for the tests of attnMergeAttnStatesLse and of kernels
// registered with attnCommSetAttnKernelEx: natural token-major LSEs moved to
// and from base 2 and / or head-major [heads, rows], in double precision.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attncomm.h"

namespace attn_test {

inline size_t LseIndex(attnLseLayout_t layout, int64_t rows, int heads, int64_t t, int h) {
  return layout == attnLseHeadMajor ? size_t(h) * size_t(rows) + size_t(t) : size_t(t) * heads + h;
}

// natural [rows, heads] -> the convention (dst may not alias src).
inline void ToLseConvention(const float* natural, float* dst, int64_t rows, int heads, attnLseBase_t base,
                            attnLseLayout_t layout) {
  const double scale = base == attnLseBase2 ? 1.4426950408889634 : 1.0;  // log2(e)
  for (int64_t t = 0; t < rows; ++t)
    for (int h = 0; h < heads; ++h)
      dst[LseIndex(layout, rows, heads, t, h)] = float(double(natural[size_t(t) * heads + h]) * scale);
}

// The convention -> natural [rows, heads].
inline std::vector<float> FromLseConvention(const float* lse, int64_t rows, int heads, attnLseBase_t base,
                                            attnLseLayout_t layout) {
  const double scale = base == attnLseBase2 ? 0.69314718055994531 : 1.0;  // ln 2
  std::vector<float> out(size_t(rows) * heads);
  for (int64_t t = 0; t < rows; ++t)
    for (int h = 0; h < heads; ++h)
      out[size_t(t) * heads + h] = float(double(lse[LseIndex(layout, rows, heads, t, h)]) * scale);
  return out;
}

inline std::string LseConventionName(attnLseBase_t base, attnLseLayout_t layout) {
  return std::string(base == attnLseBase2 ? "base-2 " : "natural ") +
         (layout == attnLseHeadMajor ? "head-major" : "token-major");
}

constexpr attnLseBase_t kLseBases[] = {attnLseNatural, attnLseBase2};
constexpr attnLseLayout_t kLseLayouts[] = {attnLseTokenMajor, attnLseHeadMajor};

}  // namespace attn_test
