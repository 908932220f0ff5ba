// Collects the rows of an attention perf run on rank 0, prints the closing
// summary (largest error against its bound, how often AUTO was right) and
// writes JSON.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attncomm.h"
#include "perf/attn/attn_bench.h"

namespace attnperf {

class AttnReport {
 public:
  // `program` heads the JSON, so perf/plot_perf.py knows what it reads.
  AttnReport(const char* program, attnDataType_t dtype, int nranks)
      : program_(program), dtype_(dtype), nranks_(nranks) {}
  // One grid point: all modes measured at (T, P, B).
  void add(int64_t T, int64_t P, int B, const std::vector<ModeResult>& rows);
  // Prints the summary; returns the exit code (non-zero if an error bound failed).
  int finish(const std::string& jsonPath);

 private:
  const char* program_;
  attnDataType_t dtype_;
  int nranks_;
  std::vector<std::string> json_;
  double worstErr_ = 0;
  bool checked_ = false;  // some row was compared with exact attention (-c 1)
  int autoPoints_ = 0, autoRight_ = 0;        // AUTO's pick, judged by that mode's row
  int autoRunPoints_ = 0, autoRunRight_ = 0;  // AUTO's own timed run
};

}  // namespace attnperf
