#include "perf/baselines/gloo_backend.h"

#include <algorithm>
#include <cstdio>

#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/alltoall.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/config.h"
#include "gloo/math.h"
#include "gloo/reduce.h"
#include "gloo/reduce_scatter.h"

namespace attnperf {

namespace {
// Helper tags sit far above the collectives' tags.
constexpr uint32_t kBarrierTag = 0x7fff0000u;
constexpr uint32_t kReduceTag = 0x7fff0001u;
constexpr uint32_t kGatherTag = 0x7fff0002u;
}  // namespace

std::string GlooBackend::library() const {
  char v[64];
  snprintf(v, sizeof v, "Gloo %d.%d.%d", GLOO_VERSION_MAJOR, GLOO_VERSION_MINOR,
           GLOO_VERSION_PATCH);
  return v;
}

void GlooBackend::barrier() {
  gloo::BarrierOptions o(ctx_);
  o.setTag(kBarrierTag);
  gloo::barrier(o);
}

void GlooBackend::maxInPlace(double* v, size_t n) {
  gloo::AllreduceOptions o(ctx_);
  o.setOutput(v, n);
  o.setTag(kReduceTag);
  o.setReduceFunction([](void* c, const void* a, const void* b, size_t k) {
    auto* C = static_cast<double*>(c);
    auto* A = static_cast<const double*>(a);
    auto* B = static_cast<const double*>(b);
    for (size_t i = 0; i < k; i++) C[i] = std::max(A[i], B[i]);
  });
  gloo::allreduce(o);
}

int64_t GlooBackend::sum(int64_t v) {
  gloo::AllreduceOptions o(ctx_);
  o.setOutput(&v, 1);
  o.setTag(kReduceTag);
  o.setReduceFunction([](void* c, const void* a, const void* b, size_t k) {
    auto* C = static_cast<int64_t*>(c);
    auto* A = static_cast<const int64_t*>(a);
    auto* B = static_cast<const int64_t*>(b);
    for (size_t i = 0; i < k; i++) C[i] = A[i] + B[i];
  });
  gloo::allreduce(o);
  return v;
}

std::vector<RankInfo> GlooBackend::gatherRankInfo(const RankInfo& mine) {
  std::vector<RankInfo> all(size_t(ctx_->size));
  RankInfo in = mine;
  gloo::AllgatherOptions o(ctx_);
  o.setInput(reinterpret_cast<uint8_t*>(&in), sizeof in);
  o.setOutput(reinterpret_cast<uint8_t*>(all.data()), sizeof in * all.size());
  o.setTag(kGatherTag);
  gloo::allgather(o);
  return all;
}

BaselineOp GlooBackend::prepare(const std::string& coll, float* s, float* r, size_t count) {
  const uint32_t tag = nextTag_++;
  const size_t all = count * size_t(ctx_->size);
  auto ctx = ctx_;
  BaselineOp op;
  op.result = r;
  if (coll == "all_gather") {
    op.call = [=] {
      gloo::AllgatherOptions o(ctx);
      o.setInput(s, count);
      o.setOutput(r, all);
      o.setTag(tag);
      gloo::allgather(o);
    };
  } else if (coll == "reduce") {
    // Gloo's ring reduce-scatter, then a gather to the root; every rank's
    // output buffer is its scratch.
    op.call = [=] {
      gloo::ReduceOptions o(ctx);
      o.setInput(s, count);
      o.setOutput(r, count);
      o.setRoot(0);
      o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      o.setTag(tag);
      gloo::reduce(o);
    };
  } else if (coll == "all_reduce") {
    op.call = [=] {
      gloo::AllreduceOptions o(ctx);
      o.setInput(s, count);
      o.setOutput(r, count);
      o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      o.setTag(tag);
      gloo::allreduce(o);
    };
  } else if (coll == "broadcast") {
    // One buffer, as in MPI_Bcast: the root's input, every rank's output.
    op.result = s;
    op.call = [=] {
      gloo::BroadcastOptions o(ctx);
      o.setOutput(s, count);
      o.setRoot(0);
      o.setTag(tag);
      gloo::broadcast(o);
    };
  } else if (coll == "alltoall") {
    op.call = [=] {
      gloo::AlltoallOptions o(ctx);
      o.setInput(s, all);
      o.setOutput(r, all);
      o.setTag(tag);
      gloo::alltoall(o);
    };
  } else {
    // In place on the send buffer; this rank's reduced block ends at its
    // start. Buffers are registered once here, not per call.
    std::vector<int> recvElems(size_t(ctx_->size), int(count));
    auto rs = std::make_shared<gloo::ReduceScatterHalvingDoubling<float>>(
        ctx, std::vector<float*>{s}, int(all), recvElems);
    op.call = [rs] { rs->run(); };
    op.result = s;
    op.clobbered = s;
    op.clobberedElems = all;
  }
  return op;
}

}  // namespace attnperf
