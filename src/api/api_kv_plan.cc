// attnKvPlan: the C entry point of the DistAttention scheduler (kv_plan.cc).
// No communicator: the error text stays with the calling thread
// (attnGetLastError(NULL)).
#include <algorithm>
#include <vector>

#include "src/attn/kv_plan.h"
#include "src/core/api_call.h"

using namespace attn;

static attnResult_t kvPlan(const attnKvInstance_t* instances, int num_instances,
                           const attnKvModel_t* model, attnKvMove_t* moves, int* num_moves) {
  clearThreadLastError();
  ATTN_REQUIRE(num_moves != nullptr, "num_moves is NULL");
  ATTN_REQUIRE(*num_moves >= 0, "*num_moves (the capacity of moves) %d < 0", *num_moves);
  ATTN_REQUIRE(moves != nullptr || *num_moves == 0, "moves is NULL but *num_moves is %d",
               *num_moves);
  ATTN_REQUIRE(num_instances >= 1, "num_instances must be >= 1, got %d", num_instances);
  ATTN_REQUIRE(instances != nullptr, "instances is NULL");
  ATTN_REQUIRE(model != nullptr, "model is NULL");
  std::vector<attnKvMove_t> plan;
  ATTN_CHECK(planKvMoves(instances, num_instances, *model, &plan));
  const int needed = static_cast<int>(plan.size());
  if (moves == nullptr) {  // the count query
    *num_moves = needed;
    return attnSuccess;
  }
  if (needed > *num_moves) {
    const int capacity = *num_moves;
    *num_moves = needed;
    return setError(attnInvalidArgument,
                    "the plan has %d moves but moves holds only %d (*num_moves is now %d)", needed,
                    capacity, needed);
  }
  std::copy(plan.begin(), plan.end(), moves);
  *num_moves = needed;
  return attnSuccess;
}

extern "C" attnResult_t attnKvPlan(const attnKvInstance_t* instances, int num_instances,
                                   const attnKvModel_t* model, attnKvMove_t* moves,
                                   int* num_moves) {
  return guardedEntry([&] {
    ErrorContext ctx("-");
    return kvPlan(instances, num_instances, model, moves, num_moves);
  });
}
