// reduce_scatter_perf: attnReduceScatter. size = the input (n * recvcount
// elements), as nccl-tests; busbw = algbw * (n-1)/n.
#include "perf/coll_spec.h"
#include "perf/patterns.h"

namespace {
using namespace attnperf;

size_t recvOffset(const Bench& b) { return size_t(b.rank) * b.count; }
double sendValue(const Bench& b, size_t j) { return reduceInput(b.op, b.rank, j); }
double recvValue(const Bench& b, size_t i) {
  return reduceExpected(b.op, b.nranks, size_t(b.rank) * b.count + i);
}
double tolerance(const Bench& b) { return reduceTolerance(b.dtype, b.op); }
attnResult_t run(const Bench& b, const void* s, void* r) {
  return attnReduceScatter(s, r, b.count, b.dtype, b.op, b.comm, b.stream);
}

const CollSpec kSpec = {
    .name = "reduce_scatter",
    .usesOp = true,
    .usesRoot = false,
    .hasInPlace = true,
    .busFactor = busFactorGather,
    .countFor = perRankCount,
    .sendElems = countTimesRanks,
    .recvElems = countElems,
    .sizeElems = countTimesRanks,
    .inPlaceSendOffset = zeroOffset,
    .inPlaceRecvOffset = recvOffset,
    .sendValue = sendValue,
    .recvValue = recvValue,
    .tolerance = tolerance,
    .run = run,
};
}  // namespace

int main(int argc, char** argv) { return attnperf::perfMain(argc, argv, kSpec); }
