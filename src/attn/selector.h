// Choosing pass-KV, pass-Q, ship-Q or head-parallel (CP paper Alg. 1 and
// App. C; CSPS §3.2.2) with a cost model on this communicator's measured
// rates.
#pragma once

#include "attncomm.h"

namespace attn {

// Totals over the batch, as every rank sees them after exchanging counts.
struct ModelInput {
  int nranks = 1;
  int numSeqs = 0;
  int64_t newTokens = 0;     // T: query rows, all ranks
  int64_t cachedTokens = 0;  // P: key rows minus query rows, all ranks
  int64_t maxQRows = 0;      // the largest shard, which sets the pace
  int64_t maxKvRows = 0;
};

void estimateModes(const attnCostModel_t& m, const attnAttnConfig_t& cfg, const ModelInput& in,
                   attnModeEstimate_t* out);

}  // namespace attn
