// broadcast_perf: attnBroadcast from -r root. size = count elements;
// busbw = algbw (every rank must receive the whole buffer).
#include "perf/coll_spec.h"
#include "perf/patterns.h"

namespace {
using namespace attnperf;

double sendValue(const Bench& b, size_t i) { return copyValue(b.dtype, b.rank, 0, i); }
double recvValue(const Bench& b, size_t i) { return copyValue(b.dtype, b.root, 0, i); }
attnResult_t run(const Bench& b, const void* s, void* r) {
  return attnBroadcast(s, r, b.count, b.dtype, b.root, b.comm, b.stream);
}

const CollSpec kSpec = {
    .name = "broadcast",
    .usesOp = false,
    .usesRoot = true,
    .hasInPlace = true,
    .busFactor = busFactorOne,
    .countFor = wholeCount,
    .sendElems = countElems,
    .recvElems = countElems,
    .sizeElems = countElems,
    .inPlaceSendOffset = zeroOffset,
    .inPlaceRecvOffset = zeroOffset,
    .sendValue = sendValue,
    .recvValue = recvValue,
    .tolerance = exact,
    .run = run,
};
}  // namespace

int main(int argc, char** argv) { return attnperf::perfMain(argc, argv, kSpec); }
