// The sharding planner (CP paper §3.5.1) and the decode placement (§3.6).
// Each sequence's tokens are cut into 2N contiguous chunks; rank r takes
// chunks r and 2N-1-r, one early and one late, so causal work evens out.
// Nothing is padded: chunks hold floor(T / 2N) tokens and the T mod 2N
// leftover tokens go one per rank in turn, continuing across the sequences
// of a batch, so no rank ever holds more than one token above another.
// Cached tokens sit where an earlier load-balanced prefill put them.
#include <vector>

#include "src/core/api_call.h"

using namespace attn;

struct attnPlan {
  // Behind the handle table's check (handle_registry.h): cleared when freed.
  static constexpr uint64_t kMagic = 0xA77B1A4E5EED0001ull;
  uint64_t magic = kMagic;
  struct Shard {
    std::vector<int32_t> qOffsets, qPos, kvOffsets, kvPos;
    std::vector<int64_t> qIndex, kvIndex;
  };
  std::vector<Shard> shards;
};

namespace {

// Chunk boundaries of a length-len sequence. Leftover tokens go to ranks
// *cursor, *cursor+1, ... (mod N): a rank's first extra lands in its early
// chunk, a second in its late one. Advances *cursor past them.
std::vector<int64_t> chunkBounds(int64_t len, int nranks, int64_t* cursor) {
  const int64_t parts = 2LL * nranks, base = len / parts, extra = len % parts;
  std::vector<int64_t> size(parts, base);
  for (int64_t i = 0; i < extra; ++i) {
    const int64_t r = (*cursor + i) % nranks;
    size[i < nranks ? r : parts - 1 - r] += 1;
  }
  *cursor = (*cursor + extra) % nranks;
  std::vector<int64_t> bounds(parts + 1, 0);
  for (int64_t j = 0; j < parts; ++j) bounds[j + 1] = bounds[j] + size[j];
  return bounds;
}

// Positions [lo, hi) of the two chunks rank r owns.
void ownedRanges(const std::vector<int64_t>& bounds, int nranks, int r, int64_t out[2][2]) {
  const int64_t a = r, b = 2LL * nranks - 1 - r;
  out[0][0] = bounds[a];
  out[0][1] = bounds[a + 1];
  out[1][0] = bounds[b];
  out[1][1] = bounds[b + 1];
}

}  // namespace

extern "C" {

static attnResult_t planPrefill(const attnBatchSpec_t* batch, int nranks, attnPlan_t* plan);

attnResult_t attnPlanPrefill(const attnBatchSpec_t* batch, int nranks, attnPlan_t* plan) {
  return guardedEntry([&] {
    ErrorContext ctx("-");
    return planPrefill(batch, nranks, plan);
  });
}

static attnResult_t planPrefill(const attnBatchSpec_t* batch, int nranks, attnPlan_t* plan) {
  clearThreadLastError();
  ATTN_REQUIRE(plan != nullptr, "plan is NULL");
  *plan = nullptr;
  ATTN_REQUIRE(batch != nullptr, "batch is NULL");
  ATTN_REQUIRE(nranks >= 1 && nranks <= ATTN_MAX_NRANKS, "nranks %d is outside [1, ATTN_MAX_NRANKS = %d]", nranks,
               ATTN_MAX_NRANKS);
  ATTN_REQUIRE(batch->num_seqs >= 0, "num_seqs %d < 0", batch->num_seqs);
  ATTN_REQUIRE(batch->num_seqs == 0 || batch->new_lens, "new_lens is NULL");
  const int S = batch->num_seqs;
  for (int i = 0; i < S; ++i) {
    ATTN_REQUIRE(batch->new_lens[i] >= 0, "new_lens[%d] = %d < 0", i, batch->new_lens[i]);
    ATTN_REQUIRE(!batch->cached_lens || batch->cached_lens[i] >= 0, "cached_lens[%d] < 0", i);
  }
  auto p = std::make_unique<attnPlan>();
  p->shards.resize(nranks);
  int64_t newBase = 0, fullBase = 0;
  for (auto& sh : p->shards) {
    sh.qOffsets.push_back(0);
    sh.kvOffsets.push_back(0);
  }
  int64_t newCursor = 0, cachedCursor = 0;
  for (int i = 0; i < S; ++i) {
    const int64_t T = batch->new_lens[i], P = batch->cached_lens ? batch->cached_lens[i] : 0;
    const std::vector<int64_t> cachedBounds = chunkBounds(P, nranks, &cachedCursor);
    const std::vector<int64_t> newBounds = chunkBounds(T, nranks, &newCursor);
    for (int r = 0; r < nranks; ++r) {
      attnPlan::Shard& sh = p->shards[r];
      int64_t cached[2][2], fresh[2][2];
      ownedRanges(cachedBounds, nranks, r, cached);
      ownedRanges(newBounds, nranks, r, fresh);
      for (auto& rg : cached)
        for (int64_t pos = rg[0]; pos < rg[1]; ++pos) {
          sh.kvPos.push_back(static_cast<int32_t>(pos));
          sh.kvIndex.push_back(fullBase + pos);
        }
      for (auto& rg : fresh)
        for (int64_t t = rg[0]; t < rg[1]; ++t) {
          const int64_t pos = P + t;
          sh.qPos.push_back(static_cast<int32_t>(pos));
          sh.qIndex.push_back(newBase + t);
          sh.kvPos.push_back(static_cast<int32_t>(pos));
          sh.kvIndex.push_back(fullBase + pos);
        }
      sh.qOffsets.push_back(static_cast<int32_t>(sh.qPos.size()));
      sh.kvOffsets.push_back(static_cast<int32_t>(sh.kvPos.size()));
    }
    newBase += T;
    fullBase += P + T;
  }
  if (!registerHandle(p.get(), HandleKind::kPlan)) return setError(attnSystemError, "out of memory for the plan's handle");
  *plan = p.release();
  return attnSuccess;
}

attnResult_t attnPlanGetShard(attnPlan_t plan, int rank, attnShard_t* shard) {
  return guardedEntry([&] {
    ErrorContext ctx("-");
    clearThreadLastError();
    ATTN_REQUIRE(plan != nullptr && shard != nullptr, "plan and shard must not be NULL");
    const HandleLookup l = lookupHandle(plan, HandleKind::kPlan);
    if (l.state != HandleState::kLive || plan->magic != attnPlan::kMagic)
      return badHandle("attnPlanGetShard", plan, HandleKind::kPlan, l);
    ATTN_REQUIRE(rank >= 0 && rank < (int)plan->shards.size(), "rank %d outside [0, %zu)", rank,
                 plan->shards.size());
    const attnPlan::Shard& sh = plan->shards[rank];
    shard->layout.num_seqs = static_cast<int>(sh.qOffsets.size()) - 1;
    shard->layout.q_offsets = sh.qOffsets.data();
    shard->layout.q_pos = sh.qPos.data();
    shard->layout.kv_offsets = sh.kvOffsets.data();
    shard->layout.kv_pos = sh.kvPos.data();
    shard->q_rows = static_cast<int64_t>(sh.qPos.size());
    shard->kv_rows = static_cast<int64_t>(sh.kvPos.size());
    shard->q_index = sh.qIndex.data();
    shard->kv_index = sh.kvIndex.data();
    return attnSuccess;
  });
}

attnResult_t attnPlanDestroy(attnPlan_t plan) {
  return guardedEntry([&] {
    ErrorContext ctx("-");
    clearThreadLastError();
    if (plan == nullptr) return attnSuccess;
    // Only the first destroy of a live plan goes on.
    const HandleLookup l = beginClose(plan, HandleKind::kPlan);
    if (l.state != HandleState::kLive) return badHandle("attnPlanDestroy", plan, HandleKind::kPlan, l);
    forgetHandle(plan);
    plan->magic = 0;
    delete plan;
    return attnSuccess;
  });
}

attnResult_t attnDecodePlacement(int num_seqs, int64_t step, int nranks, int32_t* kv_rank,
                                 int32_t* q_rank) {
  return guardedEntry([&] {
    ErrorContext ctx("-");
    clearThreadLastError();
    ATTN_REQUIRE(num_seqs >= 0 && nranks >= 1 && step >= 0,
                 "num_seqs (%d) and step (%lld) must be >= 0, nranks (%d) >= 1", num_seqs,
                 (long long)step, nranks);
    for (int s = 0; s < num_seqs; ++s) {
      if (kv_rank) kv_rank[s] = static_cast<int32_t>((s + step) % nranks);
      if (q_rank) q_rank[s] = s % nranks;
    }
    return attnSuccess;
  });
}

}  // extern "C"
