// Command line of the attention perf binaries (nccl-tests-style where the
// flags overlap: -t/-p ranks, -n iterations, -w warm-up, -c check, -J JSON).
#pragma once

#include <array>
#include <string>
#include <vector>

#include "attncomm.h"

namespace attnperf {

struct AttnOptions {
  int threads = 0, procs = 0;  // -t N / -p N (default: -t 4)
  int iters = 3, warmup = 1;   // -n / -w
  int check = 1;               // -c
  std::string json;            // -J FILE
  int64_t length = 2048;       // -L total tokens per sequence (T+P) / context (decode)
  std::vector<double> miss = {1.0, 0.5, 0.25, 0.125, 0.0625, 0.03125};  // -m (ring)
  std::vector<int> batches = {1, 4, 16};  // -b (decode)
  int seqs = 1;                // -B sequences per batch (ring)
  attnAttnConfig_t cfg{8, 2, 64, attnFloat32, 0.0f, 1};  // -H -K -D -d -C
  std::vector<int> modes;      // -M kv,q,ship,auto,seq
  int device = ATTN_DEVICE_HOST;  // -G DEV: tensors on a CUDA device
  // -k (level_attn_perf): keep fractions by tier, "host:rack:cluster" each
  // (the device tier takes the host's); one value is all three.
  std::vector<std::array<float, 3>> keeps = {{1, 1, 1}, {1, 0.5f, 0.25f}, {0.5f, 0.25f, 0.125f}};
};

// How the ranks run, for the header: "threads", "processes, cuda:0", ...
std::string rankMode(const AttnOptions& o);

// Parses flags; prints usage and returns false on error or -h.
bool parseAttnOptions(int argc, char** argv, bool decode, AttnOptions* o, int* exitCode);

}  // namespace attnperf
