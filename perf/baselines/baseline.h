// The measuring loop of the baselines (MPI, Gloo). A library plugs in as a
// Backend; sizes, fill/check patterns, timing and the table come from the
// same code our perf binaries use, so rows compare one to one.
// Baselines measure float32 sum only: all_gather, reduce_scatter, alltoall,
// reduce (to rank 0), all_reduce, broadcast (from rank 0).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "perf/options.h"
#include "perf/report.h"

namespace attnperf {

// One collective bound to its buffers, ready to be called repeatedly.
struct BaselineOp {
  std::function<void()> call;
  const float* result = nullptr;  // where the output is after call()
  // In-place algorithms overwrite their input; the loop zeroes it after the
  // check so repeated timed calls keep finite values.
  float* clobbered = nullptr;
  size_t clobberedElems = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual int rank() const = 0;
  virtual int nranks() const = 0;
  virtual std::string library() const = 0;
  virtual void barrier() = 0;
  virtual void maxInPlace(double* v, size_t n) = 0;
  virtual int64_t sum(int64_t v) = 0;
  virtual std::vector<RankInfo> gatherRankInfo(const RankInfo& mine) = 0;
  // coll: all_gather | reduce_scatter | alltoall | reduce | all_reduce |
  // broadcast; count as in NCCL (per-rank block; reduce, all_reduce,
  // broadcast: the whole buffer). send/recv are sized n*count (the
  // whole-buffer ones: count). broadcast: the result lands in recv.
  virtual BaselineOp prepare(const std::string& coll, float* send, float* recv,
                             size_t count) = 0;
};

// Which collectives a baseline knows; false with a message for others.
bool baselineCollKnown(const std::string& coll);

// Checks options a baseline cannot honour (types, ops). false: message printed.
bool baselineOptionsOk(const Options& o);

// Runs o.coll over the size list; returns the total #wrong over all ranks.
// Library errors surface as exceptions from the backend.
int64_t runBaseline(Backend& be, const Options& o, const std::string& program,
                    const std::string& mode, const std::string& transport);

}  // namespace attnperf
