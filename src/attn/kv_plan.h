// Infinite-LLM's cluster-level DistAttention scheduler (Alg. 1) and the
// performance model it maximises (Eq. 5-7). Pure: no communicator, no I/O.
#pragma once

#include <cstdint>
#include <vector>

#include "attncomm.h"

namespace attn {

// Throughput b / (num_layers * T) of one instance with batch b reading
// `blocks_read` blocks, T = base + per_req * b + attn_us_per_block * a; 0
// when b == 0. Requires the model to pass checkKvPlanInput (T > 0 for b > 0).
double kvModelTps(const attnKvModel_t& model, int64_t batch, double blocks_read);

// Waiting requests a debtor admits after lending `lent` blocks in total:
// min(pending_requests, (capacity - used + lent) / pending_blocks), 0 when
// nothing waits or pending_blocks <= 0.
int64_t kvJoiners(const attnKvInstance_t& debtor, int64_t lent);

// Modelled throughput of a debtor that lent `lent` blocks (joiners admitted)
// and of a creditor that took `borrowed` blocks.
double kvDebtorTps(const attnKvInstance_t& debtor, const attnKvModel_t& model, int64_t lent);
double kvCreditorTps(const attnKvInstance_t& creditor, const attnKvModel_t& model,
                     int64_t borrowed);

// The k in [0, hi] maximising kvDebtorTps(d, lent + k) + kvCreditorTps(c,
// borrowed + k), the smallest on ties. Evaluates only the candidates where
// the debtor's joiner count changes plus the ends (see kv_plan.cc).
int64_t kvBestBlocks(const attnKvInstance_t& debtor, int64_t lent,
                     const attnKvInstance_t& creditor, int64_t borrowed, int64_t hi,
                     const attnKvModel_t& model);

// Validates instances and model (setError naming the instance; pointers are
// the caller's job).
attnResult_t checkKvPlanInput(const attnKvInstance_t* inst, int n, const attnKvModel_t& model);

// Alg. 1 over n instances: appends the moves (src = owner = debtor, dst =
// creditor) to *moves in the order they are decided. Validates its input.
attnResult_t planKvMoves(const attnKvInstance_t* inst, int n, const attnKvModel_t& model,
                         std::vector<attnKvMove_t>* moves);

}  // namespace attn
