// Ring all-gather, pipelined by chunks: at step s a rank forwards the block it
// received at step s-1, chunk by chunk, as soon as each chunk has arrived.
#include <algorithm>

#include "src/coll/coll.h"
#include "src/coll/request_set.h"

namespace attn {

attnResult_t ringAllGatherv(Engine& e, const Ring& ring, char* buf,
                            const std::vector<Block>& blocks, size_t chunk) {
  const int n = ring.size();
  if (n == 1) return attnSuccess;
  auto nchunks = [&](int ringPos) {
    size_t b = blocks[((ringPos % n) + n) % n].bytes;
    return (b + chunk - 1) / chunk;
  };
  // Step s sends the block of ring position pos-s and receives pos-s-1.
  struct Op { int step; size_t chunk; const Block* block; };
  std::vector<Op> sends, recvs;
  for (int s = 0; s < n - 1; ++s) {
    const Block* sb = &blocks[((ring.pos - s) % n + n) % n];
    const Block* rb = &blocks[((ring.pos - s - 1) % n + n) % n];
    for (size_t c = 0; c < nchunks(ring.pos - s); ++c) sends.push_back({s, c, sb});
    for (size_t c = 0; c < nchunks(ring.pos - s - 1); ++c) recvs.push_back({s, c, rb});
  }
  RequestSet sreq(sends.size()), rreq(recvs.size());
  const int next = ring.next(), prev = ring.prev();
  auto slice = [&](const Op& op, size_t* off, size_t* len) {
    *off = op.block->offset + op.chunk * chunk;
    *len = std::min(chunk, op.block->bytes - op.chunk * chunk);
  };
  for (size_t i = 0; i < recvs.size(); ++i) {
    size_t off, len;
    slice(recvs[i], &off, &len);
    ATTN_CHECK(e.irecv(prev, buf + off, len, rreq.at(i)));
    rreq.markPosted(i);
  }
  // Sends of step s >= 1 wait for the same chunk of step s-1 to arrive; the
  // step-0 sends (own block) go at once. Recvs are listed in send order of
  // the previous step, so send i (step s>=1) depends on recv i - ownChunks.
  const size_t own = nchunks(ring.pos);
  size_t nextSend = 0;
  auto step = [&](bool* advanced) -> attnResult_t {
    while (nextSend < sends.size()) {
      if (nextSend >= own) {
        bool ok;
        ATTN_CHECK(rreq.done(nextSend - own, &ok));
        if (!ok) break;
      }
      size_t off, len;
      slice(sends[nextSend], &off, &len);
      ATTN_CHECK(e.isend(next, buf + off, len, sreq.at(nextSend)));
      sreq.markPosted(nextSend);
      ++nextSend;
      *advanced = true;
    }
    return attnSuccess;
  };
  auto finished = [&] {
    if (nextSend < sends.size()) return false;
    for (size_t i = 0; i < sends.size(); ++i)
      if (sreq.at(i)->pending()) return false;
    for (size_t i = 0; i < recvs.size(); ++i)
      if (rreq.at(i)->pending()) return false;
    return true;
  };
  ATTN_CHECK(driveUntil(e, step, finished));
  // Surface failures of requests that completed in error.
  for (size_t i = 0; i < sends.size(); ++i) { bool ok; ATTN_CHECK(sreq.done(i, &ok)); }
  for (size_t i = 0; i < recvs.size(); ++i) {
    bool ok;
    ATTN_CHECK(rreq.done(i, &ok));
    size_t off, len;
    slice(recvs[i], &off, &len);
    if (rreq.at(i)->bytes != len)
      return setError(attnInvalidUsage,
                      "all-gather: peer %d sent %zu bytes where %zu were expected "
                      "(ranks called the collective with different counts?)",
                      prev, rreq.at(i)->bytes, len);
  }
  return attnSuccess;
}

}  // namespace attn
