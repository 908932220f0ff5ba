// Gloo as a baseline Backend: the TCP transport, unbound-buffer collectives
// (gloo::allgather, gloo::alltoall) and Gloo's only reduce-scatter,
// ReduceScatterHalvingDoubling (in place, old Algorithm API).
//
// Pitfall (see /work/shared/baselines/README.md): the old Algorithm API sets
// SO_SNDBUF to its first message size, which can cripple later unbound-buffer
// calls on the same context. So the helpers here (barrier, max, sum) use the
// unbound API, and each process set runs a single collective (-C).
#pragma once

#include <memory>
#include <string>

#include "gloo/context.h"
#include "perf/baselines/baseline.h"

namespace attnperf {

class GlooBackend : public Backend {
 public:
  explicit GlooBackend(std::shared_ptr<gloo::Context> ctx) : ctx_(std::move(ctx)) {}
  int rank() const override { return ctx_->rank; }
  int nranks() const override { return ctx_->size; }
  std::string library() const override;
  void barrier() override;
  void maxInPlace(double* v, size_t n) override;
  int64_t sum(int64_t v) override;
  std::vector<RankInfo> gatherRankInfo(const RankInfo& mine) override;
  BaselineOp prepare(const std::string& coll, float* send, float* recv, size_t count) override;

 private:
  std::shared_ptr<gloo::Context> ctx_;
  uint32_t nextTag_ = 1;  // one tag per prepared collective
};

}  // namespace attnperf
