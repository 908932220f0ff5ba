// Choosing pass-KV, pass-Q, ship-Q, head-parallel or all-gather KV (CP
// paper Alg. 1 and App. C; CSPS §3.2.2; Llama 3's CP) with a cost model on
// this communicator's measured rates.
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
  bool allGatherKv = true;  // a candidate (not on device communicators yet)
  // Under a sliding window (RankVisibility): the most ring moves of
  // pass-KV / pass-Q and the most peers ship-Q / all-gather KV send to;
  // -1: N - 1.
  int kvMoves = -1, qMoves = -1, peersSeen = -1;
};

// AUTO weighs all-gather KV (which holds every rank's keys and values at
// once) and, beyond decode, ship-Q (every peer's queries and partials) only
// while what they hold fits in this many bytes.
constexpr double kAutoMaxHeldBytes = double(256 << 20);

void estimateModes(const attnCostModel_t& m, const attnAttnConfig_t& cfg, const ModelInput& in,
                   attnModeEstimate_t* out);

}  // namespace attn
