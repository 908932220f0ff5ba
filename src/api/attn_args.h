// The argument checks attnRingAttention and attnLevelAttention share.
#pragma once

#include <cstdint>

#include "attncomm.h"
#include "src/attn/device/device_layout.h"

struct attnComm;

namespace attn {

// checkCallArgs (plan_call.h), and that the engine's kernel (if any) writes
// a dtype this call can fold; on a device communicator the layout is
// captured in *dl too, and its arrays are checked now only when they are
// host memory (else when the call runs: *qRows = *kvRows = -1).
attnResult_t checkAttnArgs(attnComm* comm, const void* q, const void* k, const void* v, const void* out,
                           const attnSeqLayout_t* layout, const attnAttnConfig_t* cfg, int64_t* qRows,
                           int64_t* kvRows, DeviceCallLayout* dl);

}  // namespace attn
