// alltoall_perf: attnAllToAll. size = the whole send buffer (n blocks of
// count elements), as nccl-tests; busbw = algbw * (n-1)/n. The API has no
// in-place all-to-all, so those columns print N/A.
#include "perf/coll_spec.h"
#include "perf/patterns.h"

namespace {
using namespace attnperf;

// Block p of the send buffer goes to rank p; block q of recv came from q.
double sendValue(const Bench& b, size_t j) {
  return copyValue(b.dtype, b.rank, int(j / b.count), j % b.count);
}
double recvValue(const Bench& b, size_t i) {
  return copyValue(b.dtype, int(i / b.count), b.rank, i % b.count);
}
attnResult_t run(const Bench& b, const void* s, void* r) {
  return attnAllToAll(s, r, b.count, b.dtype, b.comm, b.stream);
}

const CollSpec kSpec = {
    .name = "alltoall",
    .usesOp = false,
    .usesRoot = false,
    .hasInPlace = false,
    .busFactor = busFactorGather,
    .countFor = perRankCount,
    .sendElems = countTimesRanks,
    .recvElems = countTimesRanks,
    .sizeElems = countTimesRanks,
    .inPlaceSendOffset = zeroOffset,
    .inPlaceRecvOffset = zeroOffset,
    .sendValue = sendValue,
    .recvValue = recvValue,
    .tolerance = exact,
    .run = run,
};
}  // namespace

int main(int argc, char** argv) { return attnperf::perfMain(argc, argv, kSpec); }
