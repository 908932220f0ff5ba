// Fixtures of the attention-collective tests: random problems over whole
// (unsharded) sequences, the double-precision reference over them
// (cpu::referenceAttention, one segment per sequence), placements of the
// rows on ranks (the planner's, attnDecodePlacement's, or arbitrary), the
// shard of one rank gathered by row index, and the comparison of a rank's
// result with the reference rows it holds.
//
// A problem is a batch of sequences. Sequence s has key rows (positions
// kv_pos) and query rows (positions q_pos); the rows of all sequences are
// packed back to back ("THD"), sequence by sequence. The reference is
// computed once, before any rank runs, so thread ranks share it read-only
// and forked ranks inherit it.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "attncomm.h"
#include "kernels/cpu/attention.h"
#include "src/attn/attn_config.h"
#include "tests/support/multirank.h"

namespace attn_test {

// ---------------------------------------------------------------------------
// Problems

struct AttnProblemSpec {
  attnAttnConfig_t cfg = ATTN_ATTN_CONFIG_INITIALIZER;
  // Per sequence: positions of its query rows and of its key rows.
  std::vector<std::vector<int32_t>> q_pos, kv_pos;
  // Range of the random values of q (k and v use [-1, 1)). Larger values
  // make the softmax peakier.
  float q_scale = 1.0f;
  // Attention sinks ([num_q_heads]), or empty; cfg.sinks is ignored (the
  // case keeps its own copy and points the config at it when run).
  std::vector<float> sinks;
};

// A batch of prefill sequences: sequence i has cached_lens[i] cached tokens
// (keys only, positions 0..P-1) and new_lens[i] new tokens (queries and
// keys, positions P..P+T-1), in the order the planner packs them (query rows
// = new tokens, key rows = cached then new).
AttnProblemSpec PrefillSpec(const attnAttnConfig_t& cfg, const std::vector<int32_t>& new_lens,
                            const std::vector<int32_t>& cached_lens);

struct AttnCase {
  std::string name;
  attnAttnConfig_t cfg = ATTN_ATTN_CONFIG_INITIALIZER;
  int num_seqs = 0;
  std::vector<int32_t> q_off, kv_off;  // [num_seqs + 1]
  std::vector<int32_t> q_pos, kv_pos;  // per global row
  std::vector<int32_t> q_seq, kv_seq;  // sequence of each global row
  std::vector<uint8_t> q, k, v;        // [rows, heads, D] in cfg.dtype (v: Dv)
  std::vector<double> ref_o;           // [q rows, Hq, Dv]
  std::vector<double> ref_lse;         // [q rows, Hq]
  std::vector<float> sinks;            // [Hq] or empty
  // cfg with cfg.sinks pointing at this case's sinks (or NULL).
  attnAttnConfig_t runCfg() const {
    attnAttnConfig_t r = cfg;
    r.sinks = sinks.empty() ? nullptr : sinks.data();
    return r;
  }
  int64_t q_rows() const { return static_cast<int64_t>(q_pos.size()); }
  int64_t kv_rows() const { return static_cast<int64_t>(kv_pos.size()); }
};

// The head dim of V and the outputs (head_dim_v, or head_dim when 0).
inline int ValueDim(const attnAttnConfig_t& cfg) { return attn::attnValueDim(cfg); }

// An attention config (softmax_scale 0: 1/sqrt(head_dim)).
attnAttnConfig_t AttnCfg(int hq, int hkv, int d, attnDataType_t t, bool causal, float scale = 0.0f);
// Runner options of the attention tests: communicators that fail a stuck
// operation (timeout_ms 60 s) instead of hanging, and a deadline.
RunOptions AttnRunOptions(int deadline_ms = 180000);

size_t AttnElemSize(attnDataType_t t);
const char* AttnDtypeName(attnDataType_t t);
std::string CfgName(const attnAttnConfig_t& cfg);

// Random data (seeded, reproducible), then the reference. Fails the test
// (ADD_FAILURE) if the reference rejects the problem.
AttnCase MakeCase(const std::string& name, const AttnProblemSpec& spec, uint64_t seed);

// ---------------------------------------------------------------------------
// Placements: the global rows each rank holds, in the order it holds them
// (grouped by sequence, in sequence order; within a sequence any order).

struct Placement {
  int nranks = 0;
  std::vector<std::vector<int64_t>> q_rows, kv_rows;  // [rank] -> global rows
};

// Straight from attnPlanPrefill (q_index / kv_index of each shard). The
// case must come from PrefillSpec with the same lengths. Also checks that the
// plan's layout (offsets, positions) is the one the indices describe.
Placement PlannerPlacement(const AttnCase& c, const std::vector<int32_t>& new_lens,
                           const std::vector<int32_t>& cached_lens, int nranks);

// Every query row and every key row goes to a random rank (independently),
// never to `empty_rank` (-1: no rank kept empty), and each rank holds its
// rows of a sequence in a random order.
Placement RandomPlacement(const AttnCase& c, int nranks, uint64_t seed, int empty_rank);

// Round robin by row (q row i -> rank i % N, kv row j -> (j + shift) % N).
Placement RoundRobinPlacement(const AttnCase& c, int nranks, int shift);

// ---------------------------------------------------------------------------
// Shards and results

struct RankShard {
  attnSeqLayout_t layout{};
  std::vector<int32_t> q_off, kv_off, q_pos, kv_pos;
  std::vector<uint8_t> q, k, v;
  std::vector<int64_t> q_global;  // global query row of each local row
};

// Gathers rank `rank`'s rows of the case (by index) into packed buffers.
RankShard GatherShard(const AttnCase& c, const Placement& pl, int rank);

struct AttnErrorStats {
  double max_o_rel = 0;    // max over (row, head) of max|o - ref| / max|ref row|
  double max_lse_abs = 0;  // over rows the reference saw a key
  double max_o_abs = 0;    // max |o - ref| (inputs are in [-1, 1))
  int64_t nan_rows = 0;
  int64_t empty_mismatch = 0;  // ref saw no key but out != 0 or lse != -inf, or vice versa
  int64_t rows = 0;
  double sum_o_rel = 0;   // sum of the per-row relative errors (rows that saw a key)
  int64_t compared = 0;   // rows that saw a key
  double mean_o_rel() const { return compared ? sum_o_rel / compared : 0.0; }
  void Merge(const AttnErrorStats& o);
  std::string Describe() const;
};

// Compares out (cfg.dtype) and lse (may be NULL) of the shard's rows with
// the reference.
AttnErrorStats CompareShard(const AttnCase& c, const RankShard& sh, const void* out,
                            const float* lse);

// Bounds of DESIGN.md §4 by dtype.
double OutBound(attnDataType_t t);  // relative to the largest |O| of the row
double LseBound(attnDataType_t t);  // absolute (relative error of the denominator)

// Checks the error stats against the bounds; a failure names `what`.
::testing::AssertionResult WithinBounds(const AttnErrorStats& e, attnDataType_t t,
                                        const std::string& what);

// Runs attnRingAttention on this rank for the case and placement, compares,
// and returns the result code (the error text in *err when not success).
struct RankRun {
  attnResult_t rc = attnSuccess;
  std::string error;
  AttnErrorStats stats;
};
RankRun RunRingAttentionRank(const AttnCase& c, const Placement& pl, int rank, attnComm_t comm,
                             attnAttnMode_t mode, bool with_lse);

// As RunRingAttentionRank and expects success within the bounds.
void ExpectRingAttentionExact(const AttnCase& c, const Placement& pl, int rank, attnComm_t comm,
                              attnAttnMode_t mode, bool with_lse, const std::string& what,
                              AttnErrorStats* stats_out = nullptr);

const char* ModeName(attnAttnMode_t m);
constexpr attnAttnMode_t kAllModes[] = {attnModePassKV, attnModePassQ,        attnModeShipQ,
                                        attnModeAuto,   attnModeHeadParallel, attnModeAllGatherKV};

// A plain loop attention kernel for attnCommSetAttnKernel, fp32 math,
// any dtype. user_data: an AttnKernelCounter (may be NULL).
struct AttnKernelCounter {
  std::atomic<int64_t>* calls = nullptr;
  std::atomic<int64_t>* q_rows = nullptr;
};
attnResult_t LoopAttentionKernel(const attnAttnKernelArgs_t* args, void* user_data,
                                 attnStream_t stream);

// The kernel problem for rows laid out like AttnCase / RankShard (fields q,
// k, v, q_off, kv_off, q_pos, kv_pos): one segment per sequence, filled
// into `segs`, which must outlive the problem.
template <typename Rows>
attn::cpu::AttnProblem ProblemFor(const Rows& r, int num_seqs, const attnAttnConfig_t& cfg,
                                  std::vector<attn::cpu::AttnSegment>* segs) {
  segs->clear();
  for (int s = 0; s < num_seqs; ++s)
    segs->push_back({r.q_off[s], r.q_off[s + 1], r.kv_off[s], r.kv_off[s + 1]});
  attn::cpu::AttnProblem p;
  p.q = r.q.data();
  p.k = r.k.data();
  p.v = r.v.data();
  p.dtype = cfg.dtype;
  p.nq = static_cast<int32_t>(r.q_pos.size());
  p.nk = static_cast<int32_t>(r.kv_pos.size());
  p.num_q_heads = cfg.num_q_heads;
  p.num_kv_heads = cfg.num_kv_heads;
  p.head_dim = cfg.head_dim;
  p.head_dim_v = cfg.head_dim_v;
  p.scale = cfg.softmax_scale;
  p.causal = cfg.causal != 0;
  p.window_left = cfg.window_left;
  p.window_right = cfg.window_right;
  p.softcap = cfg.softcap;
  p.q_pos = r.q_pos.data();
  p.k_pos = r.kv_pos.data();
  p.segments = segs->data();
  p.num_segments = static_cast<int32_t>(segs->size());
  return p;
}

}  // namespace attn_test
