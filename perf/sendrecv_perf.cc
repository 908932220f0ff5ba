// sendrecv_perf: every rank sends count elements to rank+1 and receives
// from rank-1 in one group (a ring shift). size = count elements;
// busbw = algbw. Sending and receiving one buffer at once would race, so
// there is no in-place variant.
#include "perf/coll_spec.h"
#include "perf/patterns.h"

namespace {
using namespace attnperf;

int next(const Bench& b) { return (b.rank + 1) % b.nranks; }
int prev(const Bench& b) { return (b.rank + b.nranks - 1) % b.nranks; }
double sendValue(const Bench& b, size_t i) { return copyValue(b.dtype, b.rank, next(b), i); }
double recvValue(const Bench& b, size_t i) { return copyValue(b.dtype, prev(b), b.rank, i); }

attnResult_t run(const Bench& b, const void* s, void* r) {
  attnResult_t st = attnGroupStart();
  if (st != attnSuccess) return st;
  attnResult_t a = attnSend(s, b.count, b.dtype, next(b), b.comm, b.stream);
  attnResult_t c = attnRecv(r, b.count, b.dtype, prev(b), b.comm, b.stream);
  st = attnGroupEnd();  // always close the group, even after a bad post
  return a != attnSuccess ? a : c != attnSuccess ? c : st;
}

const CollSpec kSpec = {
    .name = "sendrecv",
    .usesOp = false,
    .usesRoot = false,
    .hasInPlace = false,
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
