// Pipelined chain reduce: the partial result flows along the ring towards
// the root (the last position), each rank adding its own contribution to a
// chunk as soon as it has arrived and forwarding it. Every rank sends and
// receives the message once, so the time is about
// (bytes + (n-2) * chunk) / bandwidth, against twice the bytes through the
// root for reduce-scatter + gather. Chunks land in a small window of slots,
// so the memory it needs does not grow with the message.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/reduce.h"
#include "src/coll/coll.h"
#include "src/coll/request_set.h"
#include "src/core/datatype.h"

namespace attn {
namespace {
constexpr size_t kWindow = 4;  // chunks in flight into one rank
}  // namespace

attnResult_t chainReduce(Engine& e, const Ring& ring, const char* in, char* out, size_t count,
                         attnDataType_t type, attnRedOp_t op, size_t chunk) {
  const int n = ring.size();
  const size_t esz = dataTypeSize(type), bytes = count * esz;
  const bool isFirst = ring.pos == 0, isRoot = ring.pos == n - 1;
  if (n == 1) {
    if (out != in) std::memmove(out, in, bytes);
    return attnSuccess;
  }
  chunk = std::max(esz, chunk / esz * esz);
  const size_t nchunks = (bytes + chunk - 1) / chunk;
  auto len = [&](size_t c) { return std::min(chunk, bytes - c * chunk); };
  char* slots = isFirst ? nullptr : e.scratch(std::min(kWindow, nchunks) * chunk);
  auto slot = [&](size_t c) { return slots + (c % kWindow) * chunk; };

  RequestSet rreq(isFirst ? 0 : nchunks), sreq(isRoot ? 0 : nchunks);
  size_t nextRecv = 0, nextReduce = 0, nextSend = 0;
  auto step = [&](bool* advanced) -> attnResult_t {
    // Fold arrived chunks: the root's result goes to `out`, a middle rank's
    // partial stays in its slot to be forwarded.
    while (!isFirst && nextReduce < nextRecv) {
      bool ok;
      ATTN_CHECK(rreq.done(nextReduce, &ok));
      if (!ok) break;
      const size_t c = nextReduce;
      if (rreq.at(c)->bytes != len(c))
        return setError(attnInvalidUsage,
                        "reduce: peer %d sent %zu bytes where %zu were expected "
                        "(ranks called the collective with different counts?)",
                        ring.prev(), rreq.at(c)->bytes, len(c));
      if (isRoot)
        cpu::reduce2(out + c * chunk, in + c * chunk, slot(c), len(c) / esz, type, op);
      else
        cpu::reduceInto(slot(c), in + c * chunk, len(c) / esz, type, op);
      ++nextReduce;
      *advanced = true;
    }
    // Forward: the first rank its own input, a middle rank each reduced
    // chunk; at most a window of sends in flight, so the next rank is never
    // handed more than it has slots for.
    while (!isRoot && nextSend < (isFirst ? nchunks : nextReduce)) {
      if (nextSend >= kWindow) {
        bool ok;
        ATTN_CHECK(sreq.done(nextSend - kWindow, &ok));
        if (!ok) break;
      }
      const char* src = isFirst ? in + nextSend * chunk : slot(nextSend);
      ATTN_CHECK(e.isend(ring.next(), src, len(nextSend), sreq.at(nextSend)));
      sreq.markPosted(nextSend++);
      *advanced = true;
    }
    // A slot takes the next chunk once its previous one is folded (root) or
    // forwarded (middle).
    while (!isFirst && nextRecv < nchunks && nextRecv < nextReduce + kWindow) {
      if (!isRoot && nextRecv >= kWindow) {
        bool ok;
        ATTN_CHECK(sreq.done(nextRecv - kWindow, &ok));
        if (!ok) break;
      }
      ATTN_CHECK(e.irecv(ring.prev(), slot(nextRecv), len(nextRecv), rreq.at(nextRecv)));
      rreq.markPosted(nextRecv++);
      *advanced = true;
    }
    return attnSuccess;
  };
  auto finished = [&] {
    if (!isFirst && nextReduce < nchunks) return false;
    if (isRoot) return true;
    if (nextSend < nchunks) return false;
    for (size_t c = 0; c < nchunks; ++c)
      if (sreq.at(c)->pending()) return false;
    return true;
  };
  ATTN_CHECK(driveUntil(e, step, finished));
  for (size_t c = 0; !isRoot && c < nchunks; ++c) {
    bool ok;
    ATTN_CHECK(sreq.done(c, &ok));
  }
  return attnSuccess;
}

}  // namespace attn
