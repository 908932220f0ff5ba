#include "perf/attn/attn_report.h"

#include <algorithm>
#include <cstdio>

namespace attnperf {

void AttnReport::add(int64_t T, int64_t P, int B, const std::vector<ModeResult>& rows) {
  double best = 0, autoTime = 0;
  bool haveAuto = false;
  for (const auto& r : rows) {
    printRow(T, P, B, r);
    json_.push_back(jsonRow(T, P, B, nranks_, r));
    worstErr_ = std::max(worstErr_, r.maxErr);
    if (r.mode == "auto") {
      haveAuto = true;
      autoTime = r.timeUs;
    } else if (r.mode != "sequential") {
      best = best == 0 ? r.timeUs : std::min(best, r.timeUs);
    }
  }
  // AUTO is right when it ran within 5% of the fastest explicit mode.
  if (haveAuto && best > 0) {
    ++autoPoints_;
    if (autoTime <= 1.05 * best) ++autoRight_;
  }
}

int AttnReport::finish(const std::string& jsonPath) {
  const double bound = dtype_ == attnFloat32 ? 1e-4 : 2e-2;
  const bool good = worstErr_ <= bound;
  printf("# max error vs exact (double) attention: %.2e (bound %.0e): %s\n", worstErr_, bound,
         good ? "OK" : "FAILED");
  if (autoPoints_)
    printf("# auto within 5%% of the fastest mode: %d of %d configurations\n", autoRight_, autoPoints_);
  if (!jsonPath.empty()) {
    if (FILE* f = fopen(jsonPath.c_str(), "w")) {
      fprintf(f, "{\"results\": [\n");
      for (size_t i = 0; i < json_.size(); ++i)
        fprintf(f, "  %s%s\n", json_[i].c_str(), i + 1 < json_.size() ? "," : "");
      fprintf(f, "], \"auto_right\": %d, \"auto_points\": %d, \"max_err\": %.3e}\n", autoRight_,
              autoPoints_, worstErr_);
      fclose(f);
    }
  }
  return good ? 0 : 1;
}

}  // namespace attnperf
