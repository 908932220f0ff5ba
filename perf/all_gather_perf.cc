// all_gather_perf: attnAllGather. size = the gathered output (n * sendcount
// elements), as nccl-tests; busbw = algbw * (n-1)/n.
#include "perf/coll_spec.h"
#include "perf/patterns.h"

namespace {
using namespace attnperf;

size_t sendOffset(const Bench& b) { return size_t(b.rank) * b.count; }
// Every rank sends the same block to everyone, so dst is fixed at 0.
double sendValue(const Bench& b, size_t i) { return copyValue(b.dtype, b.rank, 0, i); }
double recvValue(const Bench& b, size_t i) {
  return copyValue(b.dtype, int(i / b.count), 0, i % b.count);
}
attnResult_t run(const Bench& b, const void* s, void* r) {
  return attnAllGather(s, r, b.count, b.dtype, b.comm, b.stream);
}

const CollSpec kSpec = {
    .name = "all_gather",
    .usesOp = false,
    .usesRoot = false,
    .hasInPlace = true,
    .busFactor = busFactorGather,
    .countFor = perRankCount,
    .sendElems = countElems,
    .recvElems = countTimesRanks,
    .sizeElems = countTimesRanks,
    .inPlaceSendOffset = sendOffset,
    .inPlaceRecvOffset = zeroOffset,
    .sendValue = sendValue,
    .recvValue = recvValue,
    .tolerance = exact,
    .run = run,
};
}  // namespace

int main(int argc, char** argv) { return attnperf::perfMain(argc, argv, kSpec); }
