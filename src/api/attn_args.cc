#include "src/api/attn_args.h"

#include "src/attn/attn_config.h"
#include "src/attn/attn_state.h"
#include "src/attn/plan_call.h"
#include "src/core/error.h"
#include "src/device/device_route.h"

namespace attn {

attnResult_t checkAttnArgs(attnComm* comm, const void* q, const void* k, const void* v, const void* out,
                           const attnSeqLayout_t* layout, const attnAttnConfig_t* cfg, int64_t* qRows,
                           int64_t* kvRows, [[maybe_unused]] DeviceCallLayout* dl) {
  // The engine's kernel must write fp32 or this call's dtype: refused here,
  // on every rank, before anything moves.
  if (cfg) {
    attnAttnConfig_t c;
    if (readAttnConfig(cfg, &c) == attnSuccess) ATTN_CHECK(checkKernelOut(attnStateOf(comm), c));
  }
#if ATTN_HAVE_CUDA
  if (deviceRoute(comm)) {
    ATTN_CHECK(checkCallShape(layout, cfg));
    ATTN_CHECK(checkDeviceSinks(attnConfigOf(cfg)));
    return dl->capture(q, k, v, out, *layout, attnConfigOf(cfg), qRows, kvRows);
  }
#else
  (void)comm;
#endif
  ATTN_CHECK(checkCallArgs(q, k, v, out, layout, cfg, qRows, kvRows));
  return checkHostSinks(attnConfigOf(cfg));
}

}  // namespace attn
