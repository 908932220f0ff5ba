// Command line of the attention perf binaries. A letter nccl-tests has means
// what it means there (-t -n -w -c -d -J -T -a -h); the benchmarks' own
// options are long ones, a short letter kept only where nccl-tests has none
// (-L -H -B -k); nccl-tests' other letters are refused with the reason.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "attncomm.h"

namespace attnperf {

// Which binary parses: decides the defaults, the usage text and which of
// the program-specific options apply.
enum class AttnProgram { Ring, Decode, Level, Kv };

const char* programName(AttnProgram p);

// --modes one (decode_attn_perf): the whole step on one rank.
constexpr int kOneRankMode = -2;

struct AttnOptions {
  int threads = 0, procs = 0;  // -t N / --procs N (default: -t 4, kv_attn_perf -t 2)
  int iters = 3, warmup = 1;   // -n / -w
  int check = 1;               // -c
  int timeoutS = 0;            // -T: watchdog, 0 off
  int average = 3;             // -a: 0 rank 0, 1 mean, 2 min, 3 max over ranks (kv: 0 only)
  std::string json;            // -J FILE
  std::string plot;            // --plot FILE.png
  int64_t length = 2048;       // -L/--tokens: T+P per sequence / context (decode) / request (kv)
  std::vector<double> miss = {1.0, 0.5, 0.25, 0.125, 0.0625, 0.03125};  // --miss (ring)
  std::vector<int> batches = {1, 4, 16};  // --batches (decode)
  int seqs = 1;                // -B/--seqs sequences per batch (ring, level)
  // -H --kv-heads --head-dim --head-dim-v -d --causal; cfg.head_dim_v 0: V and the output have head_dim.
  attnAttnConfig_t cfg = ATTN_ATTN_CONFIG(8, 2, 64, attnFloat32, 0.0f, 1);
  std::vector<int> modes;      // --modes kv,q,ship,heads,auto,seq
  int device = ATTN_DEVICE_HOST;  // --device DEV: tensors on a CUDA device
  // -k (level_attn_perf): keep fractions by tier, "host:rack:cluster" each
  // (the device tier takes the host's); one value is all three.
  std::vector<std::array<float, 3>> keeps = {{1, 1, 1}, {1, 0.5f, 0.25f}, {0.5f, 0.25f, 0.125f}};
  // kv_attn_perf: tokens per block, shares of the blocks lent, requests
  // filling rank 0's pool together.
  int blockTokens = 16;                       // --block-tokens
  std::vector<double> lend{0, 0.25, 0.5, 0.75};  // --lend
  int requests = 1;                           // --requests
  bool breakdown = false;                     // --breakdown (ring, decode)
  int layers = 1;                             // --layers (ring, decode): calls per timed step
  std::vector<int> windows = {-1};            // --windows (ring): window_left of each table block
  bool contiguous = false;                    // --placement contiguous (ring)
};

// The binary's defaults (kv_attn_perf's differ: longer request, larger heads).
AttnOptions defaultOptions(AttnProgram p);

// How the ranks run, for the header: "threads", "processes, cuda:0", ...
std::string rankMode(const AttnOptions& o);

// The head dims for headers: "head_dim 64", or "head_dim 192/128" where V
// and the output have another (--head-dim-v).
std::string headDimText(const attnAttnConfig_t& cfg);

// How -a combines the ranks' times, for headers: "the slowest rank", ...
const char* averageName(int average);

// Parses flags into *o (start from defaultOptions). On error prints one
// line naming the flag, or the usage on -h, and returns false with
// *exitCode 2 (error) or 0 (-h).
bool parseAttnOptions(int argc, char** argv, AttnProgram p, AttnOptions* o, int* exitCode);

}  // namespace attnperf
