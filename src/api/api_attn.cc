// C API of the attention collectives: attnRingAttention and its selector,
// cost model and kernel hooks.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/convert.h"
#include "src/attn/attn_algorithms.h"
#include "src/attn/attn_config.h"
#include "src/attn/attn_call.h"
#include "src/attn/calibrate.h"
#include "src/attn/plan_call.h"
#include "src/attn/selector.h"
#include "src/coll/coll.h"
#include "src/core/api_call.h"
#include "src/device/device_route.h"
#include "src/core/datatype.h"
#include "src/core/log.h"

using namespace attn;

namespace {

attnResult_t ringAttention(attnComm* comm, const void* q, const void* k, const void* v, void* out,
                           float* lse, const attnSeqLayout_t& layout, const attnAttnConfig_t& cfg,
                           attnAttnMode_t mode) {
  auto t0 = Clock::now();
  AttnCall c;
  ATTN_CHECK(planCall(comm, q, k, v, layout, cfg, &mode, &c));
  const AttnAlgorithm* algo = findAttnAlgorithm(mode);
  if (!algo) return setError(attnInternalError, "no algorithm for mode %d", (int)mode);
  ATTN_CHECK(runHostCall(c, algo->host, out, lse));
  recordStats(c, mode, t0);
  return attnSuccess;
}

// Device communicator: the layout (host memory) is copied now; the call
// runs on the communicator's proxy thread when its turn comes on the
// stream. Every mode runs the CUDA kernels on the device while its blocks
// move (its device run in src/attn/attn_algorithms.cc's table).
attnResult_t enqueueOnDevice(const void* q, const void* k, const void* v, void* out, float* lse,
                             const attnSeqLayout_t& lay, const attnAttnConfig_t& cfg, attnAttnMode_t mode,
                             attnComm* comm, attnStream_t stream, int64_t qRows, int64_t kvRows) {
#if ATTN_HAVE_CUDA
  const std::shared_ptr<const LayoutCopy> lc = copyLayout(lay, qRows, kvRows);
  return deviceEnqueueWork(comm, stream, [=]() -> attnResult_t {
    // Not an ApiCall: attnCommAbort must not wait for the proxy's work (it
    // breaks the engine that work may be blocked on).
    ErrorContext ctx(comm->prefix);
    ATTN_CHECK(checkCommUsable(comm));
    auto t0 = Clock::now();
    AttnCall c;
    attnAttnMode_t m = mode;
    ATTN_CHECK(planCall(comm, q, k, v, lc->layout, cfg, &m, &c));
    const AttnAlgorithm* algo = findAttnAlgorithm(m);
    if (!algo || !algo->device) return setError(attnInternalError, "no device algorithm for mode %d", (int)m);
    ATTN_CHECK(algo->device(c, DeviceAttnBuffers{out, lse}));
    recordStats(c, m, t0);
    return attnSuccess;
  });
#else
  (void)q, (void)k, (void)v, (void)out, (void)lse, (void)lay, (void)cfg, (void)mode, (void)stream;
  (void)qRows, (void)kvRows;
  return setError(attnInternalError, "rank %d: a device communicator in a build without CUDA", comm->rank);
#endif
}

}  // namespace

extern "C" {

attnResult_t attnRingAttention(const void* q, const void* k, const void* v, void* out, float* lse,
                               const attnSeqLayout_t* layout, const attnAttnConfig_t* cfg,
                               attnAttnMode_t mode, attnComm_t comm, attnStream_t stream) {
  return guardedEntry([&]() -> attnResult_t {
    ApiCall call(comm);
    ATTN_CHECK(call.finish(call.check()));
    int64_t qRows = 0, kvRows = 0;
    attnResult_t bad = attnSuccess;
    if (stream != nullptr && !deviceRoute(comm))
      bad = setError(attnInvalidArgument, "a host-memory communicator takes a NULL stream");
    else if (mode != attnModeAuto && !findAttnAlgorithm(mode))
      bad = setError(attnInvalidArgument, "unknown attention mode %d", (int)mode);
    else
      bad = checkCallArgs(q, k, v, out, layout, cfg, &qRows, &kvRows);
    if (bad == attnSuccess && deviceRoute(comm) && !lseIsNatural(attnConfigOf(cfg)))
      bad = setError(attnNotSupported, "device communicators write the natural, token-major LSE only (cfg.lse_base "
                                       "and cfg.lse_layout at their defaults)");
    // The peers fail the call too (plan_call.h).
    if (bad != attnSuccess) return call.finish(refuseCall(comm, stream, bad, int32_t(attnModeAuto)));
    attnSeqLayout_t lay = *layout;
    const attnAttnConfig_t c = attnConfigOf(cfg);
    if (deviceRoute(comm))
      return call.finish(enqueueOnDevice(q, k, v, out, lse, lay, c, mode, comm, stream, qRows, kvRows));
    return call.finish(dispatch(comm, "RingAttention", [=] {
      return ringAttention(comm, q, k, v, out, lse, lay, c, mode);
    }));
  });
}

attnResult_t attnSelectMode(const attnSeqLayout_t* layout, const attnAttnConfig_t* cfg,
                            attnComm_t comm, attnModeEstimate_t* estimate) {
  return guardedEntry([&]() -> attnResult_t {
    ApiCall call(comm);
    ATTN_CHECK(call.finish(call.check()));
    int64_t qRows = 0, kvRows = 0;
    attnResult_t bad = checkConfig(cfg);
    if (bad == attnSuccess && (!layout || !estimate))
      bad = setError(attnInvalidArgument, "layout and estimate must not be NULL");
    if (bad == attnSuccess) bad = checkOffsets("q_offsets", layout->num_seqs, layout->q_offsets, &qRows);
    if (bad == attnSuccess) bad = checkOffsets("kv_offsets", layout->num_seqs, layout->kv_offsets, &kvRows);
    // The peers fail the call too (plan_call.h); it runs on the calling thread.
    if (bad != attnSuccess) return call.finish(refuseCallHere(comm, bad, int32_t(attnModeAuto)));
    const attnAttnConfig_t c = attnConfigOf(cfg);
    const AttnCard mine = cardOf(comm, qRows, kvRows, layout->num_seqs, attnModeAuto, c, nullptr);
    std::vector<AttnCard> cards;
    ATTN_CHECK(call.finish(exchangeCards(comm, mine, &cards)));
    attnCostModel_t model;
    ATTN_CHECK(call.finish(agreedModel(comm, c, cards, &model)));
    const ModelInput in = modelInputOf(cards, layout->num_seqs);
    estimateModes(model, c, in, estimate);
    return attnSuccess;
  });
}

attnResult_t attnEstimateModes(const attnCostModel_t* model, const attnAttnConfig_t* cfg, int nranks,
                               int64_t newTokens, int64_t cachedTokens, attnModeEstimate_t* estimate) {
  return guardedEntry([&]() -> attnResult_t {
    ErrorContext ctx("-");
    clearThreadLastError();
    ATTN_CHECK(checkConfig(cfg));
    ATTN_REQUIRE(model && estimate, "model and estimate must not be NULL");
    ATTN_REQUIRE(nranks >= 1, "nranks must be >= 1");
    ATTN_REQUIRE(newTokens >= 0 && cachedTokens >= 0, "token counts must be >= 0");
    ATTN_REQUIRE(costModelValid(*model),
                 "cost model rates must be positive and comm_interference within [0, 1]");
    ModelInput in;
    in.nranks = nranks;
    in.numSeqs = 1;
    in.newTokens = newTokens;
    in.cachedTokens = cachedTokens;
    in.maxQRows = (newTokens + nranks - 1) / nranks;
    in.maxKvRows = (newTokens + cachedTokens + nranks - 1) / nranks;
    estimateModes(*model, attnConfigOf(cfg), in, estimate);
    return attnSuccess;
  });
}

attnResult_t attnCommGetCostModel(attnComm_t comm, attnCostModel_t* model) {
  return guardedEntry([&]() -> attnResult_t {
    ApiCall call(comm);
    ATTN_CHECK(call.finish(call.check()));
    if (!model) return call.finish(setError(attnInvalidArgument, "model is NULL"));
    attnAttnConfig_t cfg = ATTN_ATTN_CONFIG(8, 8, 128, attnFloat32, 0.0f, 1);
    return call.finish(costModelOf(comm, cfg, model));
  });
}

attnResult_t attnCommSetCostModel(attnComm_t comm, const attnCostModel_t* model) {
  return guardedEntry([&]() -> attnResult_t {
    ApiCall call(comm);
    ATTN_CHECK(call.finish(call.check()));
    AttnState& st = attnStateOf(comm);
    if (model == nullptr) {
      st.modelOverridden = false;
      return attnSuccess;
    }
    if (!costModelValid(*model))
      return call.finish(setError(attnInvalidArgument,
                                  "cost model rates must be positive and comm_interference within [0, 1]"));
    st.override = *model;
    st.modelOverridden = true;
    return attnSuccess;
  });
}

attnResult_t attnCommSetAttnKernel(attnComm_t comm, attnAttnKernelFn fn, void* userData) {
  return guardedEntry([&]() -> attnResult_t {
    ApiCall call(comm);
    ATTN_CHECK(call.finish(call.check()));
    AttnState& st = attnStateOf(comm);
    st.userKernel = fn;
    st.userData = userData;
    st.kernelTflops.clear();  // the new kernel has its own rate
    return attnSuccess;
  });
}

}  // extern "C"
