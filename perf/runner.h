// One thread's whole benchmark: for each type, op, root and size, check,
// warm up, time the loop, and (on rank 0) print the row. Independent of how
// the ranks were launched.
#pragma once

#include <string>
#include <vector>

#include "attncomm.h"
#include "perf/coll_spec.h"
#include "perf/options.h"

namespace attnperf {

enum RankStatus { kRankOk = 0, kRankWrong = 1, kRankFailed = 2 };

// Runs the benchmark on the thread's communicators (one per -g slot) and
// then destroys them (or aborts them after a failed call, so that peers
// blocked on them fail too instead of hanging). `mode` is printed in the
// header: threads | processes | external.
RankStatus runThread(const Options& opts, const CollSpec& spec, const std::vector<attnComm_t>& comms,
                     int thread, const std::string& program, const std::string& mode);

inline RankStatus runRank(const Options& opts, const CollSpec& spec, attnComm_t comm,
                          const std::string& program, const std::string& mode) {
  return runThread(opts, spec, {comm}, 0, program, mode);
}

}  // namespace attnperf
