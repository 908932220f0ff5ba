#include "perf/attn/attn_report.h"

#include <algorithm>
#include <cstdio>

namespace attnperf {

void AttnReport::add(int64_t T, int64_t P, int B, const std::vector<ModeResult>& rows) {
  double best = 0, autoTime = 0;
  const ModeResult* autoRow = nullptr;
  for (const auto& r : rows) {
    printRow(T, P, B, r);
    json_.push_back(jsonRow(T, P, B, nranks_, r));
    worstErr_ = std::max(worstErr_, r.maxErr);
    checked_ = checked_ || r.maxErr >= 0;
    if (r.mode == "auto") {
      autoRow = &r;
      autoTime = r.timeUs;
    } else if (r.mode != "sequential") {
      best = best == 0 ? r.timeUs : std::min(best, r.timeUs);
    }
  }
  if (!autoRow || best <= 0) return;
  // The pick is right when the mode AUTO chose, measured in its own row,
  // is within 5% of the fastest explicit mode. AUTO's own timing (the same
  // algorithm plus the choice) is reported beside it; on a shared machine
  // it also carries run-to-run noise.
  double pickTime = 0;
  for (const auto& r : rows)
    if (r.mode == autoRow->autoChose) pickTime = r.timeUs;
  if (pickTime > 0) {
    ++autoPoints_;
    if (pickTime <= 1.05 * best) ++autoRight_;
  }
  ++autoRunPoints_;
  if (autoTime <= 1.05 * best) ++autoRunRight_;
}

int AttnReport::finish(const std::string& jsonPath) {
  const double bound = dtype_ == attnFloat32 ? 1e-4 : 2e-2;
  const bool good = worstErr_ <= bound;
  if (checked_)
    printf("# max error vs exact (double) attention: %.2e (bound %.0e): %s\n", worstErr_, bound,
           good ? "OK" : "FAILED");
  else
    printf("# not checked against exact attention (-c 0)\n");
  if (autoPoints_)
    printf("# auto picked a mode within 5%% of the fastest: %d of %d configurations\n", autoRight_,
           autoPoints_);
  if (autoRunPoints_)
    printf("# auto's own run within 5%% of the fastest mode: %d of %d configurations\n",
           autoRunRight_, autoRunPoints_);
  if (!jsonPath.empty()) {
    if (FILE* f = fopen(jsonPath.c_str(), "w")) {
      fprintf(f, "{\"program\": \"%s\", \"results\": [\n", program_);
      for (size_t i = 0; i < json_.size(); ++i)
        fprintf(f, "  %s%s\n", json_[i].c_str(), i + 1 < json_.size() ? "," : "");
      fprintf(f, "], \"auto_right\": %d, \"auto_points\": %d, \"auto_run_right\": %d, "
                 "\"auto_run_points\": %d, \"max_err\": %.3e}\n",
              autoRight_, autoPoints_, autoRunRight_, autoRunPoints_, checked_ ? worstErr_ : -1.0);
      fclose(f);
    } else {
      fprintf(stderr, "%s: -J %s: cannot write the file\n", program_, jsonPath.c_str());
      return 1;
    }
  }
  return good ? 0 : 1;
}

}  // namespace attnperf
