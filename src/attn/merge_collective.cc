#include "src/attn/merge_collective.h"

#include <cstring>
#include <memory>
#include <vector>

#include "kernels/cpu/convert.h"
#include "kernels/cpu/merge.h"
#include "src/coll/coll.h"
#include "src/core/comm.h"
#include "src/core/datatype.h"
#include "src/core/error.h"

namespace attn {
namespace {

// One peer's slice of a partial for `heads` heads: O [rows, heads, D] in
// the dtype, then LSE [rows, heads].
struct Slice {
  size_t oBytes = 0, lseBytes = 0;
  size_t total() const { return oBytes + lseBytes; }
  static Slice of(const MergeShape& s, int heads) {
    const size_t cells = size_t(s.rows) * size_t(heads);
    return {cells * size_t(s.headDim) * dataTypeSize(s.dtype), cells * sizeof(float)};
  }
};

// Heads [h0, h0 + h) of a [rows, heads, D] O and [rows, heads] LSE, packed.
void packHeads(const MergeShape& s, const char* o, const float* lse, int h0, int h, char* dst) {
  if (h == 0 || s.rows == 0) return;  // nothing (and maybe no buffer) to pack
  const size_t esz = dataTypeSize(s.dtype), row = size_t(s.headDim) * esz;
  const Slice sl = Slice::of(s, h);
  float* dl = reinterpret_cast<float*>(dst + sl.oBytes);
  for (int64_t t = 0; t < s.rows; ++t) {
    std::memcpy(dst + size_t(t) * h * row, o + (size_t(t) * s.heads + h0) * row, size_t(h) * row);
    std::memcpy(dl + size_t(t) * h, lse + size_t(t) * s.heads + h0, size_t(h) * sizeof(float));
  }
}

}  // namespace

attnResult_t mergeReduceScatter(attnComm* comm, const MergeShape& s, const void* outPart, const float* lsePart,
                                void* out, float* lse) {
  const int n = comm->nranks, me = comm->rank;
  const int h0 = mergeHeadBegin(me, s.heads, n), mine = mergeHeadBegin(me + 1, s.heads, n) - h0;
  const size_t cells = size_t(s.rows) * size_t(mine);
  const char* o = static_cast<const char*>(outPart);
  Engine& e = *comm->engine;

  // What goes to each peer, packed first: the partial may alias out.
  std::vector<size_t> sendAt(size_t(n) + 1, 0);
  for (int p = 0; p < n; ++p) {
    const int hp = p == me ? 0 : mergeHeadBegin(p + 1, s.heads, n) - mergeHeadBegin(p, s.heads, n);
    sendAt[size_t(p) + 1] = sendAt[size_t(p)] + Slice::of(s, hp).total();
  }
  std::vector<char> sendBuf(sendAt[size_t(n)]);
  for (int p = 0; p < n; ++p)
    if (p != me) {
      const int hb = mergeHeadBegin(p, s.heads, n);
      packHeads(s, o, lsePart, hb, mergeHeadBegin(p + 1, s.heads, n) - hb, sendBuf.data() + sendAt[size_t(p)]);
    }
  // This rank's own heads start the accumulator.
  const Slice mineSlice = Slice::of(s, mine);
  std::vector<char> own(mineSlice.total());
  packHeads(s, o, lsePart, h0, mine, own.data());
  std::vector<float> acc(cells * size_t(s.headDim)), accLse(cells);
  if (cells) {
    ATTN_CHECK(cpu::convertToFloat(acc.data(), own.data(), s.dtype, acc.size()));
    std::memcpy(accLse.data(), own.data() + mineSlice.oBytes, mineSlice.lseBytes);
  }

  std::vector<std::vector<char>> recvBuf(static_cast<size_t>(n));
  std::unique_ptr<Request[]> sends(new Request[size_t(n)]), recvs(new Request[size_t(n)]);
  std::vector<Request*> pending;
  std::vector<int> from;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    if (mineSlice.total()) {
      recvBuf[size_t(p)].resize(mineSlice.total());
      ATTN_CHECK(e.irecv(p, recvBuf[size_t(p)].data(), mineSlice.total(), &recvs[size_t(p)]));
      pending.push_back(&recvs[size_t(p)]);
      from.push_back(p);
    }
    const size_t bytes = sendAt[size_t(p) + 1] - sendAt[size_t(p)];
    if (bytes) ATTN_CHECK(e.isend(p, sendBuf.data() + sendAt[size_t(p)], bytes, &sends[size_t(p)]));
  }
  // Fold each peer's slice as it arrives.
  while (!pending.empty()) {
    size_t done = 0;
    ATTN_CHECK(e.waitAny(pending.data(), pending.size(), &done));
    const int p = from[done];
    ATTN_CHECK(checkWholeMessage(*pending[done], "merge reduce-scatter", p, mineSlice.total()));
    const char* b = recvBuf[size_t(p)].data();
    const cpu::AttnPartialRef part{b, s.dtype, reinterpret_cast<const float*>(b + mineSlice.oBytes)};
    ATTN_CHECK(cpu::foldPartial(acc.data(), accLse.data(), part, cells, s.headDim));
    pending.erase(pending.begin() + long(done));
    from.erase(from.begin() + long(done));
  }
  for (int p = 0; p < n; ++p)
    if (p != me && sendAt[size_t(p) + 1] > sendAt[size_t(p)]) ATTN_CHECK(e.wait(&sends[size_t(p)]));
  if (cells) ATTN_CHECK(cpu::convertFromFloat(out, s.dtype, acc.data(), acc.size()));
  if (lse && cells) std::memcpy(lse, accLse.data(), cells * sizeof(float));
  return attnSuccess;
}

attnResult_t mergeAllGather(attnComm* comm, const MergeShape& s, const void* outPart, const float* lsePart,
                            void* out, float* lse) {
  const int n = comm->nranks, me = comm->rank;
  // Every rank's merged heads as packed slices, in rank order: the blocks
  // of one all-gather.
  std::vector<Block> blocks(static_cast<size_t>(n));
  size_t at = 0;
  for (int r = 0; r < n; ++r) {
    const int h = mergeHeadBegin(r + 1, s.heads, n) - mergeHeadBegin(r, s.heads, n);
    blocks[size_t(r)] = {at, Slice::of(s, h).total()};
    at += blocks[size_t(r)].bytes;
  }
  std::vector<char> all(at);
  const int h0 = mergeHeadBegin(me, s.heads, n), mine = mergeHeadBegin(me + 1, s.heads, n) - h0;
  const Slice ms = Slice::of(s, mine);
  char* myBlock = all.data() + blocks[size_t(me)].offset;
  ATTN_CHECK(mergeReduceScatter(comm, s, outPart, lsePart, myBlock, reinterpret_cast<float*>(myBlock + ms.oBytes)));
  // This rank's block to every peer, every peer's into its place.
  std::vector<Block> send(size_t(n), blocks[size_t(me)]), recv = blocks;
  send[size_t(me)].bytes = recv[size_t(me)].bytes = 0;
  ATTN_CHECK(pairwiseAllToAllv(*comm->engine, all.data(), send, all.data(), recv));
  // Unpack each rank's heads into [rows, heads, D] and [rows, heads].
  const size_t esz = dataTypeSize(s.dtype), row = size_t(s.headDim) * esz;
  char* o = static_cast<char*>(out);
  for (int r = 0; r < n; ++r) {
    const int hb = mergeHeadBegin(r, s.heads, n), h = mergeHeadBegin(r + 1, s.heads, n) - hb;
    if (h == 0) continue;
    const char* src = all.data() + blocks[size_t(r)].offset;
    const float* srcLse = reinterpret_cast<const float*>(src + Slice::of(s, h).oBytes);
    for (int64_t t = 0; t < s.rows; ++t) {
      std::memcpy(o + (size_t(t) * s.heads + hb) * row, src + size_t(t) * h * row, size_t(h) * row);
      if (lse) std::memcpy(lse + size_t(t) * s.heads + hb, srcLse + size_t(t) * h, size_t(h) * sizeof(float));
    }
  }
  return attnSuccess;
}

}  // namespace attn
