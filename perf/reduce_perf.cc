// reduce_perf: attnReduce to -r root. size = count elements; busbw = algbw
// (every rank's whole buffer crosses one link on its way to the root).
// Only the root's receive buffer is checked: the others' is not written.
#include "perf/coll_spec.h"
#include "perf/patterns.h"

namespace {
using namespace attnperf;

double sendValue(const Bench& b, size_t j) { return reduceInput(b.op, b.rank, j); }
double recvValue(const Bench& b, size_t j) { return reduceExpected(b.op, b.nranks, j); }
double tolerance(const Bench& b) { return reduceTolerance(b.dtype, b.op); }
size_t rootElems(const Bench& b) { return b.rank == b.root ? b.count : 0; }
attnResult_t run(const Bench& b, const void* s, void* r) {
  return attnReduce(s, r, b.count, b.dtype, b.op, b.root, b.comm, b.stream);
}

const CollSpec kSpec = {
    .name = "reduce",
    .usesOp = true,
    .usesRoot = true,
    .hasInPlace = true,
    .busFactor = busFactorOne,
    .countFor = wholeCount,
    .sendElems = countElems,
    .recvElems = rootElems,
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
