// Pipelined chain broadcast: the root streams chunks to the next rank of the
// ring, and every rank forwards each chunk as soon as it has arrived, so the
// time is about (bytes + (n-2) * chunk) / bandwidth instead of (n-1) * bytes.
#include <algorithm>

#include "src/coll/coll.h"
#include "src/coll/request_set.h"

namespace attn {

attnResult_t chainBroadcast(Engine& e, const Ring& ring, char* buf, size_t bytes, size_t chunk) {
  const int n = ring.size();
  if (n == 1) return attnSuccess;
  const bool isRoot = ring.pos == 0, isLast = ring.pos == n - 1;
  const size_t nchunks = (bytes + chunk - 1) / chunk;
  RequestSet rreq(isRoot ? 0 : nchunks), sreq(isLast ? 0 : nchunks);
  auto len = [&](size_t c) { return std::min(chunk, bytes - c * chunk); };
  if (!isRoot)
    for (size_t c = 0; c < nchunks; ++c) {
      ATTN_CHECK(e.irecv(ring.prev(), buf + c * chunk, len(c), rreq.at(c)));
      rreq.markPosted(c);
    }
  size_t nextSend = 0;
  auto step = [&](bool* advanced) -> attnResult_t {
    while (!isLast && nextSend < nchunks) {
      if (!isRoot) {
        bool ok;
        ATTN_CHECK(rreq.done(nextSend, &ok));
        if (!ok) break;
        if (rreq.at(nextSend)->bytes != len(nextSend))
          return setError(attnInvalidUsage,
                          "broadcast: peer %d sent %zu bytes where %zu were expected",
                          ring.prev(), rreq.at(nextSend)->bytes, len(nextSend));
      }
      ATTN_CHECK(e.isend(ring.next(), buf + nextSend * chunk, len(nextSend), sreq.at(nextSend)));
      sreq.markPosted(nextSend++);
      *advanced = true;
    }
    return attnSuccess;
  };
  auto finished = [&] {
    if (!isLast && nextSend < nchunks) return false;
    for (size_t c = 0; c < rreq.size() && !isRoot; ++c)
      if (rreq.at(c)->pending()) return false;
    for (size_t c = 0; c < sreq.size() && !isLast; ++c)
      if (sreq.at(c)->pending()) return false;
    return true;
  };
  ATTN_CHECK(driveUntil(e, step, finished));
  for (size_t c = 0; !isRoot && c < nchunks; ++c) {
    bool ok;
    ATTN_CHECK(rreq.done(c, &ok));
    if (rreq.at(c)->bytes != len(c))
      return setError(attnInvalidUsage, "broadcast: peer %d sent %zu bytes where %zu were expected",
                      ring.prev(), rreq.at(c)->bytes, len(c));
  }
  for (size_t c = 0; !isLast && c < nchunks; ++c) {
    bool ok;
    ATTN_CHECK(sreq.done(c, &ok));
  }
  return attnSuccess;
}

}  // namespace attn
