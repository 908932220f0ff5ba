// Clock and per-iteration statistics shared by our perf binaries and the
// baselines, so every program reports time the same way.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace attnperf {

inline double nowUs() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch())
      .count();
}

// Summary of per-iteration times that are already the max over ranks.
struct TimeStats {
  double medianUs = 0, minUs = 0, meanUs = 0, maxUs = 0;
};

inline TimeStats summarize(std::vector<double> t) {
  TimeStats s;
  if (t.empty()) return s;
  std::sort(t.begin(), t.end());
  const size_t n = t.size();
  s.medianUs = (n % 2) ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
  s.minUs = t.front();
  s.maxUs = t.back();
  double sum = 0;
  for (double v : t) sum += v;
  s.meanUs = sum / double(n);
  return s;
}

}  // namespace attnperf
