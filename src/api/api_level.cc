// C API of level-aware sparse attention: attnLevelAttention (CSPS §3.2.4).
// Checks its arguments, plans the call like attnRingAttention (the keep
// fractions ride on the card every rank all-gathers, so ranks that disagree
// fail together) and runs the level all-to-all on host memory, or on a
// device communicator's proxy with the CUDA kernels
// (src/attn/device/level_alltoall_device.cc).
#include <cmath>

#include "src/api/attn_args.h"
#include "src/attn/attn_config.h"
#include "src/attn/device/device_lse.h"
#include "src/attn/level_alltoall.h"
#include "src/attn/plan_call.h"
#include "src/core/api_call.h"
#include "src/device/device_route.h"
#include "src/attn/device/ring_attn_device.h"

using namespace attn;

namespace {

attnResult_t checkDrop(const attnLevelDrop_t& d, int64_t kvRows) {
  bool all = true;
  for (int t = 0; t < 4; ++t) {
    ATTN_REQUIRE(std::isfinite(d.keep[t]) && d.keep[t] >= 0 && d.keep[t] <= 1,
                 "drop->keep[%d] = %g is outside [0, 1]", t, d.keep[t]);
    all = all && d.keep[t] == 1;
  }
  ATTN_REQUIRE(all || kvRows == 0 || d.importance != nullptr,
               "drop->importance is NULL but keep (%g, %g, %g, %g) drops keys: say which to keep",
               d.keep[0], d.keep[1], d.keep[2], d.keep[3]);
  return attnSuccess;
}

attnResult_t levelAttention(attnComm* comm, const void* q, const void* k, const void* v, void* out,
                            float* lse, const attnSeqLayout_t& layout, const attnAttnConfig_t& cfg,
                            const LevelDrop& drop) {
  auto t0 = Clock::now();
  AttnCall c;
  attnAttnMode_t mode = attnModeAuto;  // not a ring mode: the stats say so
  ATTN_CHECK(planCall(comm, q, k, v, layout, cfg, &mode, &c, drop.keep));
  ATTN_CHECK(runHostCall(c, [&](AttnCall& call) { return runLevelAllToAll(call, drop); }, out, lse));
  recordStats(c, mode, t0);
  return attnSuccess;
}

#if ATTN_HAVE_CUDA
// Device communicator: the call runs on the proxy when its turn comes on
// the stream, with the layout captured at the call (device_layout.h).
attnResult_t enqueueLevelOnDevice(attnComm* comm, attnStream_t stream, const void* q, const void* k,
                                  const void* v, void* out, float* lse, const DeviceCallLayout& dl,
                                  const attnAttnConfig_t& cfg, const LevelDrop& drop) {
  return deviceEnqueueWork(comm, stream, [=]() -> attnResult_t {
    ErrorContext ctx(comm->prefix);  // not an ApiCall: see attnRingAttention's
    ATTN_CHECK(checkCommUsable(comm));
    auto t0 = Clock::now();
    const attnSeqLayout_t* lay = nullptr;
    int64_t qRows = 0, kvRows = 0;
    // A bad layout read now fails on every rank, as one refused at the call.
    if (attnResult_t bad = dl.resolve(comm, &lay, &qRows, &kvRows); bad != attnSuccess)
      return refuseCallHere(comm, bad, kLevelCallMode);
    AttnCall c;
    attnAttnMode_t mode = attnModeAuto;  // not a ring mode: the stats say so
    ATTN_CHECK(planCall(comm, q, k, v, *lay, cfg, &mode, &c, drop.keep));
    DeviceLseOut lseOut;
    float* natural = nullptr;
    ATTN_CHECK(lseOut.begin(comm, cfg, lse, c.q.rows, &natural));
    ATTN_CHECK(runLevelAllToAllDevice(c, drop, DeviceAttnBuffers{out, natural}));
    ATTN_CHECK(lseOut.finish());
    recordStats(c, mode, t0);
    return attnSuccess;
  });
}
#endif

}  // namespace

extern "C" attnResult_t attnLevelAttention(const void* q, const void* k, const void* v, void* out,
                                           float* lse, const attnSeqLayout_t* layout,
                                           const attnAttnConfig_t* cfg, const attnLevelDrop_t* drop,
                                           attnComm_t comm, attnStream_t stream) {
  return guardedEntry([&]() -> attnResult_t {
    ApiCall call(comm);
    ATTN_CHECK(call.finish(call.check()));
    int64_t qRows = 0, kvRows = 0;
    attnResult_t bad = attnSuccess;
    DeviceCallLayout dl;
    if (stream != nullptr && !deviceRoute(comm))
      bad = setError(attnInvalidArgument, "a host-memory communicator takes a NULL stream");
    else
      bad = checkAttnArgs(comm, q, k, v, out, layout, cfg, &qRows, &kvRows, &dl);
    // kvRows is -1 for a layout read when the call runs: importance is
    // needed whenever keys are dropped.
    if (bad == attnSuccess && drop) bad = checkDrop(*drop, kvRows);
    // The peers fail the call too (plan_call.h).
    if (bad != attnSuccess) return call.finish(refuseCall(comm, stream, bad, kLevelCallMode));
    LevelDrop d;
    if (drop) {
      for (int t = 0; t < 4; ++t) d.keep[t] = drop->keep[t];
      d.importance = drop->importance;
    }
    const attnSeqLayout_t lay = *layout;
    const attnAttnConfig_t c = attnConfigOf(cfg);
#if ATTN_HAVE_CUDA
    if (deviceRoute(comm)) return call.finish(enqueueLevelOnDevice(comm, stream, q, k, v, out, lse, dl, c, d));
#endif
    return call.finish(dispatch(comm, "LevelAttention", [=] {
      return levelAttention(comm, q, k, v, out, lse, lay, c, d);
    }));
  });
}
