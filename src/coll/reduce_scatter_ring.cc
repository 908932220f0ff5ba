// Ring reduce-scatter, pipelined by chunks. The partial result of the block
// owned by ring position o starts at o+1 and travels o+1 -> o+2 -> ... -> o,
// each hop adding its own contribution. Received chunks land in one of two
// staging buffers (alternating by step), are reduced in place with the local
// input, and are forwarded from there; the last hop reduces into `out`.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/reduce.h"
#include "src/coll/coll.h"
#include "src/coll/request_set.h"
#include "src/core/datatype.h"

namespace attn {

attnResult_t ringReduceScatterv(Engine& e, const Ring& ring, const char* in, char* out,
                                const std::vector<Block>& blocks, attnDataType_t type,
                                attnRedOp_t op, size_t chunk, char* staging) {
  const int n = ring.size();
  const size_t esz = dataTypeSize(type);
  const Block& mine = blocks[ring.pos];
  if (n == 1) {
    if (out != in + mine.offset) std::memmove(out, in + mine.offset, mine.bytes);
    return attnSuccess;
  }
  auto blockAt = [&](int p) -> const Block& { return blocks[((p % n) + n) % n]; };
  size_t maxBytes = 0;
  for (const Block& b : blocks) maxBytes = std::max(maxBytes, b.bytes);
  if (!staging) staging = e.scratch(2 * maxBytes);
  char* stage[2] = {staging, staging + maxBytes};

  // Step s sends the partial of block pos-s-1 and receives that of pos-s-2;
  // so receive step s and send step s+1 carry the same block.
  struct Op { int step; size_t chunk; const Block* block; size_t off, len; };
  std::vector<Op> sends, recvs;
  std::vector<size_t> sendStart(n), recvStart(n);
  for (int s = 0; s < n - 1; ++s) {
    const Block& sb = blockAt(ring.pos - s - 1);
    const Block& rb = blockAt(ring.pos - s - 2);
    sendStart[s] = sends.size();
    recvStart[s] = recvs.size();
    for (size_t c = 0; c * chunk < sb.bytes; ++c)
      sends.push_back({s, c, &sb, c * chunk, std::min(chunk, sb.bytes - c * chunk)});
    for (size_t c = 0; c * chunk < rb.bytes; ++c)
      recvs.push_back({s, c, &rb, c * chunk, std::min(chunk, rb.bytes - c * chunk)});
  }
  sendStart[n - 1] = sends.size();
  recvStart[n - 1] = recvs.size();
  auto sendsOfStep = [&](int s) { return sendStart[s + 1] - sendStart[s]; };

  RequestSet sreq(sends.size()), rreq(recvs.size());
  std::vector<bool> reduced(recvs.size(), false);
  const int next = ring.next(), prev = ring.prev();
  size_t nextSend = 0, nextRecv = 0, nextReduce = 0;

  auto step = [&](bool* advanced) -> attnResult_t {
    // Fold arrived chunks into the staging buffer (or into out, last step).
    while (nextReduce < nextRecv) {
      bool ok;
      ATTN_CHECK(rreq.done(nextReduce, &ok));
      if (!ok) break;
      const Op& r = recvs[nextReduce];
      if (rreq.at(nextReduce)->bytes != r.len)
        return setError(attnInvalidUsage,
                        "reduce-scatter: peer %d sent %zu bytes where %zu were expected "
                        "(ranks called the collective with different counts?)",
                        prev, rreq.at(nextReduce)->bytes, r.len);
      char* st = stage[r.step % 2] + r.off;
      const char* mineIn = in + r.block->offset + r.off;
      if (r.step == n - 2)
        cpu::reduce2(out + r.off, mineIn, st, r.len / esz, type, op);
      else
        cpu::reduceInto(st, mineIn, r.len / esz, type, op);
      reduced[nextReduce++] = true;
      *advanced = true;
    }
    // A receive of step s >= 2 overwrites the staging region that the send
    // of step s-1 (same chunk index) forwards from.
    while (nextRecv < recvs.size()) {
      const Op& r = recvs[nextRecv];
      if (r.step >= 2 && r.chunk < sendsOfStep(r.step - 1)) {
        bool ok;
        ATTN_CHECK(sreq.done(sendStart[r.step - 1] + r.chunk, &ok));
        if (!ok) break;
      }
      ATTN_CHECK(e.irecv(prev, stage[r.step % 2] + r.off, r.len, rreq.at(nextRecv)));
      rreq.markPosted(nextRecv++);
      *advanced = true;
    }
    // A send of step s >= 1 forwards the reduced chunk received at step s-1.
    while (nextSend < sends.size()) {
      const Op& s = sends[nextSend];
      const char* src;
      if (s.step == 0) {
        src = in + s.block->offset + s.off;
      } else {
        if (!reduced[recvStart[s.step - 1] + s.chunk]) break;
        src = stage[(s.step - 1) % 2] + s.off;
      }
      ATTN_CHECK(e.isend(next, src, s.len, sreq.at(nextSend)));
      sreq.markPosted(nextSend++);
      *advanced = true;
    }
    return attnSuccess;
  };
  auto finished = [&] {
    if (nextSend < sends.size() || nextReduce < recvs.size()) return false;
    for (size_t i = 0; i < sends.size(); ++i)
      if (sreq.at(i)->pending()) return false;
    return true;
  };
  ATTN_CHECK(driveUntil(e, step, finished));
  for (size_t i = 0; i < sends.size(); ++i) {
    bool ok;
    ATTN_CHECK(sreq.done(i, &ok));
  }
  return attnSuccess;
}

}  // namespace attn
