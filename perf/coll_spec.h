// What one perf binary measures: a table of small functions describing a
// collective's buffer sizes, data pattern and call. The runner (runner.cc)
// does everything else, so each <coll>_perf.cc stays a page long.
#pragma once

#include <cstddef>

#include "attncomm.h"

namespace attnperf {

// Per-rank, per-size arguments handed to a CollSpec's functions.
struct Bench {
  attnComm_t comm = nullptr;
  int rank = 0;
  int nranks = 1;
  attnDataType_t dtype = attnFloat32;
  attnRedOp_t op = attnSum;
  int root = 0;
  size_t count = 0;  // the count argument of the call (NCCL meaning)
  attnStream_t stream = nullptr;  // the rank's CUDA stream with -G, else NULL
};

struct CollSpec {
  const char* name;  // e.g. "all_gather": table header and JSON
  bool usesOp;       // prints the redop column
  bool usesRoot;     // prints the root column
  bool hasInPlace;   // the API allows sendbuff/recvbuff to overlap
  double (*busFactor)(int nranks);
  // The call's count for a requested size in bytes (0: skip this size).
  size_t (*countFor)(size_t bytes, int nranks, size_t eltSize);
  // Buffer lengths in elements; sizeElems is the nccl-tests "size".
  size_t (*sendElems)(const Bench&);
  size_t (*recvElems)(const Bench&);
  size_t (*sizeElems)(const Bench&);
  // In place, both pointers lie in one buffer at these element offsets.
  size_t (*inPlaceSendOffset)(const Bench&);
  size_t (*inPlaceRecvOffset)(const Bench&);
  // Element i of this rank's send buffer, and what recv element i must be.
  double (*sendValue)(const Bench&, size_t i);
  double (*recvValue)(const Bench&, size_t i);
  // Slack allowed by the check (0: exact).
  double (*tolerance)(const Bench&);
  attnResult_t (*run)(const Bench&, const void* send, void* recv);
};

// Shared helpers for the common shapes.
inline double busFactorOne(int) { return 1.0; }
inline double busFactorGather(int n) { return double(n - 1) / double(n); }
inline size_t zeroOffset(const Bench&) { return 0; }
inline double exact(const Bench&) { return 0.0; }
inline size_t countElems(const Bench& b) { return b.count; }
inline size_t countTimesRanks(const Bench& b) { return b.count * size_t(b.nranks); }
inline size_t perRankCount(size_t bytes, int n, size_t elt) { return bytes / elt / size_t(n); }
inline size_t wholeCount(size_t bytes, int, size_t elt) { return bytes / elt; }

// Entry point of every perf binary: parses flags, launches the ranks,
// returns the process exit code.
int perfMain(int argc, char** argv, const CollSpec& spec);

}  // namespace attnperf
