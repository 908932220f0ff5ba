// Measures the rates of the selector's cost model on a live communicator:
// link bandwidth and latency between ring neighbours, and the attention
// kernel's rate for a (dtype, head_dim). Collective; every rank ends with
// the same figures (slowest link, slowest kernel), so AUTO agrees everywhere.
#pragma once

#include "attncomm.h"

struct attnComm;

namespace attn {

attnResult_t costModelOf(attnComm* comm, const attnAttnConfig_t& cfg, attnCostModel_t* model);

}  // namespace attn
