// Shared pieces of ring_attn_perf and decode_attn_perf: a synthetic batch
// that every rank can generate row by row (so shards need no distribution),
// one timed run of attnRingAttention per mode with its compute/communication
// split, the check against exact attention, and the result table.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "attncomm.h"
#include "src/attn/attn_config.h"

namespace attnperf {

// The head dim of V and of the output (cfg.head_dim_v, 0 meaning head_dim):
// Q and K rows are [heads, head_dim], V and O rows [heads, valueHeadDim].
inline int valueHeadDim(const attnAttnConfig_t& cfg) { return attn::attnValueDim(cfg); }

// Which rows of the batch this rank holds.
struct Shard {
  attnSeqLayout_t layout{};
  std::vector<int32_t> qOffsets, qPos, kvOffsets, kvPos;
  std::vector<int64_t> qGlobal;   // row in the packed new tokens of the batch
  std::vector<int64_t> kvGlobal;  // row in the packed full sequences
  void finish();                  // points layout at the vectors
};

// A batch: per sequence T_i new tokens after P_i cached ones.
struct Batch {
  attnAttnConfig_t cfg = ATTN_ATTN_CONFIG_INITIALIZER;
  std::vector<int32_t> newLens, cachedLens;
  uint64_t seed = 1;
  int64_t newRows() const;
  int64_t fullRows() const;
  // Fills rows (by global index) of Q (new tokens) or K / V (full rows);
  // Q and K rows of head_dim, V rows of valueHeadDim(cfg).
  void fillQ(const std::vector<int64_t>& rows, void* out) const;
  void fillKV(const std::vector<int64_t>& rows, void* k, void* v) const;
};

// One mode's measurement, medians over iterations of the ranks' times
// combined as -a says (the max over ranks by default).
struct ModeResult {
  std::string mode;        // "pass-kv", "pass-q", "ship-q", "auto", "sequential"
  std::string autoChose;   // for auto
  double timeUs = 0, computeUs = 0, commUs = 0;
  double overlap = 0;      // max(compute, comm) / time
  double maxErr = -1;      // relative to the row's largest |O|; -1 unchecked
  double lseErr = -1;
  double sentBytes = -1;   // the most any rank sent in one call (attnRingAttention modes)
  // --breakdown: rank 0's call by stage, (name, median us), in order.
  std::vector<std::pair<std::string, double>> stages;
};

struct RunOptions {
  int iters = 5, warmup = 1;
  bool check = true;
  int device = ATTN_DEVICE_HOST;  // --device: tensors on this CUDA device
  bool processes = false;         // ranks are processes (--procs, or launched externally)
  int average = 3;                // -a: 0 rank 0, 1 mean, 2 min, 3 max over ranks
  bool breakdown = false;         // --breakdown: ModeResult::stages
  int layers = 1;                 // --layers: calls per timed step, each layer with its own KV
};

// Runs every mode of `modes` (attnModeAuto.. or -1 for the
// all-gather-then-compute baseline) on this rank's
// shard, interleaved (iterations outer, modes inner); one result per mode.
// With a device, a call is timed from its enqueue until its stream is
// idle. Collective.
int runModes(attnComm_t comm, const Batch& b, const Shard& s, const std::vector<int>& modes,
             const RunOptions& o, std::vector<ModeResult>* results);

// Max over ranks of the error of (out, lse) (host copies) against exact
// attention in double precision over the whole batch. Collective.
class RankDevice;
bool checkAgainstReference(attnComm_t comm, RankDevice& dev, const Batch& b, const Shard& s, const void* q,
                           const void* out, const float* lse, double* oErr, double* lseErr);

// Max over ranks, element-wise (host vectors, on a device communicator
// too, ordered on dev's stream). Collective.
bool maxOverRanks(attnComm_t comm, RankDevice& dev, std::vector<double>* v);
// The same, combined as nccl-tests' -a: 0 rank 0's, 1 the mean, 2 the
// min, 3 the max. Collective.
bool combineOverRanks(attnComm_t comm, RankDevice& dev, std::vector<double>* v, int average);

const char* modeName(int mode);
// Fixed-width table row and header; JSON object.
void printHeader();
void printRow(int64_t T, int64_t P, int B, const ModeResult& r);
std::string jsonRow(int64_t T, int64_t P, int B, int nranks, const ModeResult& r);

}  // namespace attnperf
