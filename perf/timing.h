// Clock and per-iteration statistics shared by our perf binaries and the
// baselines, so every program reports time the same way.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
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

// -I 1 summary of per-iteration times, as nccl-tests computes it: p50 is
// the upper middle, p95/p99 nearest-rank, stdev over the population.
struct IterStats {
  double minUs = 0, maxUs = 0, avgUs = 0, p50Us = 0, p95Us = 0, p99Us = 0, stdevUs = 0;
  double cvPct() const { return avgUs > 0 ? stdevUs / avgUs * 100.0 : 0.0; }
};

inline IterStats iterStats(std::vector<double> t) {
  IterStats s;
  if (t.empty()) return s;
  std::sort(t.begin(), t.end());
  const size_t n = t.size();
  auto pct = [n](size_t p) { return std::min(n - 1, (n * p + 99) / 100 - 1); };
  s.minUs = t.front();
  s.maxUs = t.back();
  s.p50Us = t[n / 2];
  s.p95Us = t[pct(95)];
  s.p99Us = t[pct(99)];
  double sum = 0, var = 0;
  for (double v : t) sum += v;
  s.avgUs = sum / double(n);
  for (double v : t) var += (v - s.avgUs) * (v - s.avgUs);
  s.stdevUs = std::sqrt(var / double(n));
  return s;
}

}  // namespace attnperf
