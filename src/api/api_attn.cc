// C API of the attention collectives: attnRingAttention and its selector
// and cost model (the kernel hook is in api_kernel_hook.cc).
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
#include "src/api/attn_args.h"
#include "src/attn/device/device_layout.h"
#include "src/attn/device/device_lse.h"
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

#if ATTN_HAVE_CUDA
// Device communicator: the call runs on the communicator's proxy thread
// when its turn comes on the stream, with the layout captured at the call
// (device_layout.h: host arrays copied then, device ones read now). Every
// mode runs the CUDA kernels on the device while its blocks move (its
// device run in src/attn/attn_algorithms.cc's table).
attnResult_t enqueueOnDevice(const void* q, const void* k, const void* v, void* out, float* lse,
                             const DeviceCallLayout& dl, const attnAttnConfig_t& cfg, attnAttnMode_t mode,
                             attnComm* comm, attnStream_t stream) {
  return deviceEnqueueWork(comm, stream, [=]() -> attnResult_t {
    // Not an ApiCall: attnCommAbort must not wait for the proxy's work (it
    // breaks the engine that work may be blocked on).
    ErrorContext ctx(comm->prefix);
    ATTN_CHECK(checkCommUsable(comm));
    auto t0 = Clock::now();
    const attnSeqLayout_t* lay = nullptr;
    int64_t qRows = 0, kvRows = 0;
    // A bad layout read now fails on every rank, as one refused at the call.
    if (attnResult_t bad = dl.resolve(comm, &lay, &qRows, &kvRows); bad != attnSuccess)
      return refuseCallHere(comm, bad, int32_t(attnModeAuto));
    AttnCall c;
    attnAttnMode_t m = mode;
    ATTN_CHECK(planCall(comm, q, k, v, *lay, cfg, &m, &c));
    const AttnAlgorithm* algo = findAttnAlgorithm(m);
    if (!algo || !algo->device) return setError(attnInternalError, "no device algorithm for mode %d", (int)m);
    DeviceLseOut lseOut;
    float* natural = nullptr;
    ATTN_CHECK(lseOut.begin(comm, cfg, lse, c.q.rows, &natural));
    ATTN_CHECK(algo->device(c, DeviceAttnBuffers{out, natural}));
    ATTN_CHECK(lseOut.finish());
    recordStats(c, m, t0);
    return attnSuccess;
  });
}
#endif

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
    DeviceCallLayout dl;
    if (stream != nullptr && !deviceRoute(comm))
      bad = setError(attnInvalidArgument, "a host-memory communicator takes a NULL stream");
    else if (mode != attnModeAuto && !findAttnAlgorithm(mode))
      bad = setError(attnInvalidArgument, "unknown attention mode %d", (int)mode);
    else if (mode != attnModeAuto && deviceRoute(comm) && !findAttnAlgorithm(mode)->device)
      bad = setError(attnNotSupported, "attention mode %s has no device implementation yet: use it on a "
                     "host communicator, or another mode here", findAttnAlgorithm(mode)->name);
    else
      bad = checkAttnArgs(comm, q, k, v, out, layout, cfg, &qRows, &kvRows, &dl);
    // The peers fail the call too (plan_call.h).
    if (bad != attnSuccess) return call.finish(refuseCall(comm, stream, bad, int32_t(attnModeAuto)));
    attnSeqLayout_t lay = *layout;
    const attnAttnConfig_t c = attnConfigOf(cfg);
#if ATTN_HAVE_CUDA
    if (deviceRoute(comm)) return call.finish(enqueueOnDevice(q, k, v, out, lse, dl, c, mode, comm, stream));
#endif
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
    const ModelInput in = modelInputOf(comm, cards, layout->num_seqs);
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
    cfg.head_dim_v = 128;  // as readAttnConfig leaves a config: the probes size V with it
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

}  // extern "C"
