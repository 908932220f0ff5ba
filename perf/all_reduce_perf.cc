// all_reduce_perf: attnAllReduce. size = count elements; busbw = algbw *
// 2(n-1)/n (a reduce-scatter then an all-gather of the same bytes).
#include "perf/coll_spec.h"
#include "perf/patterns.h"

namespace {
using namespace attnperf;

double busFactor(int n) { return 2.0 * double(n - 1) / double(n); }
double sendValue(const Bench& b, size_t j) { return reduceInput(b.op, b.rank, j); }
double recvValue(const Bench& b, size_t j) { return reduceExpected(b.op, b.nranks, j); }
double tolerance(const Bench& b) { return reduceTolerance(b.dtype, b.op); }
attnResult_t run(const Bench& b, const void* s, void* r) {
  return attnAllReduce(s, r, b.count, b.dtype, b.op, b.comm, b.stream);
}

const CollSpec kSpec = {
    .name = "all_reduce",
    .usesOp = true,
    .usesRoot = false,
    .hasInPlace = true,
    .busFactor = busFactor,
    .countFor = wholeCount,
    .sendElems = countElems,
    .recvElems = countElems,
    .sizeElems = countElems,
    .inPlaceSendOffset = zeroOffset,
    .inPlaceRecvOffset = zeroOffset,
    .sendValue = sendValue,
    .recvValue = recvValue,
    .tolerance = tolerance,
    .run = run,
};
}  // namespace

int main(int argc, char** argv) { return attnperf::perfMain(argc, argv, kSpec); }
