// One rank's whole benchmark: for each size, check once, warm up, time
// every iteration, and (rank 0) print the row. Independent of how the rank
// was launched.
#pragma once

#include <string>

#include "attncomm.h"
#include "perf/coll_spec.h"
#include "perf/options.h"

namespace attnperf {

enum RankStatus { kRankOk = 0, kRankWrong = 1, kRankFailed = 2 };

// Runs the benchmark on `comm` and then destroys it (or aborts it after a
// failed call, so that peers blocked on this rank fail too instead of
// hanging). `mode` is printed in the header: threads | processes | external.
RankStatus runRank(const Options& opts, const CollSpec& spec, attnComm_t comm,
                   const std::string& program, const std::string& mode);

}  // namespace attnperf
