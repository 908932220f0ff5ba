// Measures the rates of the selector's cost model on a live communicator:
// link bandwidth and latency between ring neighbours, the attention
// kernel's rate for a (dtype, head_dim), and how much an exchange running
// beside the kernel slows it (comm_interference). Collective; every rank ends with
// the same figures (slowest link, slowest kernel), so AUTO agrees everywhere.
#pragma once

#include "attncomm.h"

struct attnComm;

namespace attn {

// This rank's rates: calibrated (agreed by all ranks), then local overrides.
attnResult_t costModelOf(attnComm* comm, const attnAttnConfig_t& cfg, attnCostModel_t* model);
// Rates positive, latency and interference in range (NaN fails).
bool costModelValid(const attnCostModel_t& m);
// Whether this rank overrides the calibrated rates (attnCommSetCostModel or
// ATTN_MODEL_* variables): then callers must agree on the final figures.
bool costModelOverridden(attnComm* comm);

}  // namespace attn
