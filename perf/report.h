// The nccl-tests-style table (header, one line per size, closing lines) and
// the JSON file (nccl-tests' schema, version 3). Shared by our perf binaries
// and the baselines so their outputs line up column for column. Only rank 0
// owns a Reporter.
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
  int32_t device = -1;  // CUDA device, -1: host memory
  int32_t group = 0;    // the thread (nccl-tests' group column)
  char host[48] = {};
};
RankInfo localRankInfo(int rank, int device = -1, int group = 0);

struct RunInfo {
  std::string program;     // e.g. "all_gather_perf", "mpi_coll_bench"
  std::string library;     // e.g. "attncomm 0.1.0", "Open MPI v4.1.4"
  int versionCode = 0;     // the library's version code (JSON nccl_version)
  std::string coll;        // e.g. "all_gather"
  std::string mode;        // threads | processes | external (+ device)
  std::string transport;   // what was asked for ("" = library default)
  std::string algo;
  int nranks = 0;
  double busFactor = 1.0;  // busbw = algbw * busFactor
  bool hasInPlace = true;  // false: in-place columns print N/A
  std::string startTime;   // when the run began (JSON start_time)
};

// -I 1: per-iteration times of one variant (already max over ranks), and
// with several processes each process's own row.
struct IterSeries {
  std::vector<double> timesUs;
  std::vector<std::vector<double>> perProcessUs;
};

// One timed variant (out-of-place or in-place) of one size.
struct Measure {
  bool ran = false;
  double timeUs = 0;   // what the table reports (time or CPU time)
  int64_t wrong = -1;  // -1: not checked
  IterSeries iter;     // empty without -I 1
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
  // nccl-tests' -M line: the bytes of the buffers one rank holds.
  void memoryLine(size_t sendBytes, size_t recvBytes);
  // Writes everything reported so far as JSON. Never overwrites: an
  // existing `path` makes it try path.0, path.1, ... *written gets the
  // name used. false (with a message) on an I/O error.
  bool writeJson(const std::string& path, std::string* written) const;

 private:
  double algbw(const Row& r, const Measure& m) const;
  double avgBusBw() const;
  RunInfo info_;
  Options opts_;
  FILE* out_;
  std::vector<Row> rows_;
  std::vector<RankInfo> ranks_;
};

// "YYYY-MM-DD HH:MM:SS", local time (timestamps column and JSON).
std::string nowString();

}  // namespace attnperf
