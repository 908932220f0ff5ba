// C API of level-aware sparse attention: attnLevelAttention (CSPS §3.2.4).
// Checks its arguments, plans the call like attnRingAttention (the keep
// fractions ride on the card every rank all-gathers, so ranks that disagree
// fail together) and runs the level all-to-all on host memory.
#include <cmath>

#include "src/attn/level_alltoall.h"
#include "src/attn/plan_call.h"
#include "src/core/api_call.h"
#include "src/device/device_route.h"

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

}  // namespace

extern "C" attnResult_t attnLevelAttention(const void* q, const void* k, const void* v, void* out,
                                           float* lse, const attnSeqLayout_t* layout,
                                           const attnAttnConfig_t* cfg, const attnLevelDrop_t* drop,
                                           attnComm_t comm, attnStream_t stream) {
  ApiCall call(comm);
  ATTN_CHECK(call.finish(checkCommUsable(comm)));
  if (deviceRoute(comm))
    return call.finish(setError(attnInvalidUsage,
                                "attnLevelAttention runs on host communicators; this one is on "
                                "device %d (use attnRingAttention there)", comm->config.device));
  if (stream != nullptr)
    return call.finish(setError(attnInvalidArgument, "a host-memory communicator takes a NULL stream"));
  int64_t qRows, kvRows;
  ATTN_CHECK(call.finish(checkCallArgs(q, k, v, out, layout, cfg, &qRows, &kvRows)));
  LevelDrop d;
  if (drop) {
    ATTN_CHECK(call.finish(checkDrop(*drop, kvRows)));
    for (int t = 0; t < 4; ++t) d.keep[t] = drop->keep[t];
    d.importance = drop->importance;
  }
  const attnSeqLayout_t lay = *layout;
  const attnAttnConfig_t c = *cfg;
  return call.finish(dispatch(comm, "LevelAttention", [=] {
    return levelAttention(comm, q, k, v, out, lse, lay, c, d);
  }));
}
