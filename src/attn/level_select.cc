#include "src/attn/level_select.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace attn {

int64_t keptCount(int64_t n, float keep) {
  if (n <= 0 || !(keep > 0)) return 0;
  if (keep >= 1) return n;
  // Round to nearest rather than up: 0.1f is a hair above 0.1, and 10 keys
  // at 0.1 should keep 1, not 2.
  const int64_t k = static_cast<int64_t>(std::floor(static_cast<double>(keep) * n + 0.5));
  return std::clamp<int64_t>(k, 1, n);
}

int64_t keptBound(int64_t rows, int numSeqs, float keep) {
  if (!(keep < 1)) return rows;
  // Each sequence rounds up by at most one row (the at-least-one rule).
  const double b = std::ceil(std::max(0.0f, keep) * static_cast<double>(rows)) + numSeqs;
  return std::min<int64_t>(rows, static_cast<int64_t>(b));
}

KeptRows selectKept(int numSeqs, const int32_t* offsets, const float* importance, float keep) {
  KeptRows out;
  out.offsets.assign(1, 0);
  std::vector<int32_t> order;
  for (int s = 0; s < numSeqs; ++s) {
    const int32_t lo = offsets[s], hi = offsets[s + 1];
    const int64_t k = keptCount(hi - lo, keep);
    if (k == hi - lo || !importance) {
      for (int32_t r = lo; r < hi; ++r) out.rows.push_back(r);
    } else if (k > 0) {
      auto score = [&](int32_t r) {
        const float x = importance[r];
        return std::isnan(x) ? -std::numeric_limits<float>::infinity() : x;
      };
      // A strict total order (score down, row up), so the kept set is the
      // same whatever the selection algorithm does with equal scores.
      auto before = [&](int32_t a, int32_t b) {
        const float sa = score(a), sb = score(b);
        return sa != sb ? sa > sb : a < b;
      };
      order.resize(hi - lo);
      for (int32_t r = lo; r < hi; ++r) order[r - lo] = r;
      std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), before);
      std::sort(order.begin(), order.begin() + k);
      out.rows.insert(out.rows.end(), order.begin(), order.begin() + k);
    }
    out.offsets.push_back(static_cast<int32_t>(out.rows.size()));
  }
  return out;
}

}  // namespace attn
