// The nccl-tests-style table (header, one line per size, closing lines) and
// the JSON file. Shared by our perf binaries and the baselines so their
// outputs line up column for column. Only rank 0 owns a Reporter.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "perf/options.h"
#include "perf/timing.h"

namespace attnperf {

// Who a rank is; gathered to rank 0 for the "# Rank" lines.
struct RankInfo {
  int32_t rank = 0;
  int32_t pid = 0;
  char host[56] = {};
};
RankInfo localRankInfo(int rank);

struct RunInfo {
  std::string program;     // e.g. "all_gather_perf", "mpi_coll_bench"
  std::string library;     // e.g. "attncomm 0.1.0", "Open MPI v4.1.4"
  std::string coll;        // e.g. "all_gather"
  std::string mode;        // threads | processes | external
  std::string transport;   // what was asked for ("" = library default)
  std::string algo;
  int nranks = 0;
  double busFactor = 1.0;  // busbw = algbw * busFactor
  bool hasInPlace = true;  // false: in-place columns print N/A
};

// One timed variant (out-of-place or in-place) of one size.
struct Measure {
  bool ran = false;
  TimeStats t;
  int64_t wrong = -1;  // -1: not checked
};

struct Row {
  size_t bytes = 0;   // nccl-tests "size": the whole buffer, see each coll
  size_t count = 0;   // elements in that buffer
  const char* type = "";
  const char* op = "none";
  int root = -1;
  Measure outOfPlace, inPlace;
};

class Reporter {
 public:
  Reporter(RunInfo info, const Options& opts, FILE* out = stdout);
  void header(const std::vector<RankInfo>& ranks);
  void row(const Row& r);
  // Prints the closing lines; returns the total of #wrong over all rows.
  int64_t footer();
  // Writes everything reported so far as JSON; false (with a message) on
  // an I/O error.
  bool writeJson(const std::string& path) const;

 private:
  double algbw(const Row& r, const Measure& m) const;
  RunInfo info_;
  Options opts_;
  FILE* out_;
  std::vector<Row> rows_;
};

}  // namespace attnperf
