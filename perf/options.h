// Command-line options of the collective perf binaries and of the baseline
// programs, which share the parser so every program agrees on sizes,
// iteration counts and output. Every nccl-tests flag (v2.19) means what it
// means there; attncomm's own options are long options.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "attncomm.h"

namespace attnperf {

enum class MemKind { kHost, kShareable, kDevice };
enum class Timing { kAvg, kMedian };

struct Options {
  // --- nccl-tests flags, with nccl-tests' defaults ---
  int nthreads = 1;                    // -t: threads per process
  int ngpus = 1;                       // -g: ranks (communicators) per thread
  size_t minBytes = size_t(32) << 20;  // -b
  size_t maxBytes = size_t(32) << 20;  // -e
  size_t stepBytes = size_t(1) << 20;  // -i (used unless -f > 1)
  double stepFactor = 1.0;             // -f (1: disabled)
  int iters = 20;                      // -n
  int aggIters = 1;                    // -m: calls per iteration, one group
  int warmup = 1;                      // -w
  int runCycles = 1;                   // -N (0: until killed)
  int parallelInit = 0;                // -p: one attnCommInitRank per thread
  int perIterTiming = 0;               // -I
  int perIterSkip = 0;                 // -K
  int check = 1;                       // -c: checked iterations
  std::vector<attnRedOp_t> ops{attnSum};          // -o (all: every op)
  std::vector<attnDataType_t> dtypes{attnFloat32};  // -d (all: every type)
  std::vector<int> roots{0};           // -r (-1 in the list: all)
  bool allRoots = false;               // -r all
  int blocking = 0;                    // -z 0..3
  int streamNull = 0;                  // -y
  int timeoutSec = 0;                  // -T (0: none)
  int graphLaunches = 0;               // -G
  int reportCpuTime = 0;               // -C
  int timestamps = 0;                  // -S
  std::string jsonPath;                // -J
  int average = 1;                     // -a: 0 rank0, 1 avg, 2 min, 3 max
  int memoryReport = 0;                // -M
  int unalign = 0;                     // -u: elements
  // --- attncomm's own options ---
  int procs = 0;                       // --procs N: ranks as forked processes
  std::string algo;                    // --algo / -A -> ATTN_ALGO
  std::string transports;              // --transport -> ATTN_TRANSPORT
  MemKind mem = MemKind::kHost;        // --mem
  int device = ATTN_DEVICE_HOST;       // --device DEV (set with --mem device)
  bool inPlace = true;                 // --inplace: also time in place
  Timing timing = Timing::kAvg;        // --timing
  std::string coll;                    // --coll (baselines)
  std::string plotPath;                // --plot FILE.png
  std::vector<std::string> args;       // argv, for the JSON "args"

  bool onDevice() const { return mem == MemKind::kDevice; }
  int ranksPerProcess() const { return nthreads * ngpus; }
};

// Parses argv. On a bad or help flag prints a one-line reason (and for
// --help the usage) and returns false; *exitCode is 0 for --help, 2 else.
bool parseOptions(int argc, char** argv, Options* o, int* exitCode);

// "64", "4K", "1M", "2G" (powers of 1024, as nccl-tests). 0 on error.
size_t parseSize(const char* s);

// The sizes from -b to -e stepped by -f (when > 1) or else -i.
std::vector<size_t> sizeList(const Options& o);

// How times are combined, for the table header and JSON ("avg of ...").
std::string timingText(const Options& o);

void printUsage(const char* prog);

}  // namespace attnperf
