// Command-line options of the perf binaries (nccl-tests flag names) and of
// the baseline programs, which share the parser so every program agrees on
// sizes, iteration counts and output.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "attncomm.h"

namespace attnperf {

struct Options {
  size_t minBytes = size_t(32) << 20;  // -b
  size_t maxBytes = size_t(32) << 20;  // -e
  size_t stepBytes = 0;                // -i (additive step; 0: use -f)
  double stepFactor = 2.0;             // -f
  int iters = 20;                      // -n
  int warmup = 5;                      // -w
  int check = 1;                       // -c
  bool inPlace = true;                 // -I: also run the in-place variant
  attnDataType_t dtype = attnFloat32;  // -d
  attnRedOp_t op = attnSum;            // -o
  int root = 0;                        // -r
  int threads = 0;                     // -t N: ranks as threads
  int procs = 0;                       // -p N: ranks as forked processes
  std::string algo;                    // -A -> ATTN_ALGO
  std::string transports;              // -T -> ATTN_TRANSPORT
  std::string jsonPath;                // -J
  std::string coll;                    // -C (baselines: which collective)
  int registered = 0;                  // -R 1: buffers from attnMemAlloc
  int device = ATTN_DEVICE_HOST;       // -G DEV: buffers on a CUDA device
  bool cudaGraph = false;              // -g 1: each call launched as a captured CUDA graph
};

// Parses argv. On a bad or help flag prints usage to stderr and returns
// false (*exitCode is 0 for --help, 2 otherwise).
bool parseOptions(int argc, char** argv, Options* o, int* exitCode);

// "64", "4K", "1M", "2G" (powers of 1024, as nccl-tests). 0 on error.
size_t parseSize(const char* s);

// The sizes from -b to -e stepped by -i or -f.
std::vector<size_t> sizeList(const Options& o);

}  // namespace attnperf
