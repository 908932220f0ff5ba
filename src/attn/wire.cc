#include "src/attn/wire.h"

#include <climits>
#include <cstring>
#include <string>

#include "src/core/error.h"

namespace attn {
namespace {
constexpr uint32_t kBlockMagic = 0xB10CA77Eu;
size_t roundUp(size_t x, size_t a) { return (x + a - 1) / a * a; }
}  // namespace

BlockLayout BlockLayout::of(int numSeqs, int64_t rows, RowBytes rb) {
  BlockLayout l;
  l.offsetsAt = sizeof(BlockHeader);
  l.posAt = l.offsetsAt + sizeof(int32_t) * (numSeqs + 1);
  l.t0At = roundUp(l.posAt + sizeof(int32_t) * rows, 64);
  l.t0Bytes = rb.t0 * rows;
  l.t1At = l.t0At + l.t0Bytes;
  l.t1Bytes = rb.tensors == 2 ? rb.t1 * rows : 0;
  l.total = l.t1At + l.t1Bytes;
  return l;
}

BlockLayout packBlockMeta(int origin, int numSeqs, const int32_t* offsets, const int32_t* pos,
                          int64_t rows, RowBytes rowBytes, char* out) {
  BlockLayout l = BlockLayout::of(numSeqs, rows, rowBytes);
  BlockHeader h{kBlockMagic, origin, numSeqs, static_cast<int32_t>(rows)};
  std::memcpy(out, &h, sizeof(h));
  // Offsets are rebased so the block's rows start at 0.
  auto* offs = reinterpret_cast<int32_t*>(out + l.offsetsAt);
  for (int i = 0; i <= numSeqs; ++i) offs[i] = offsets[i] - offsets[0];
  if (rows) std::memcpy(out + l.posAt, pos, sizeof(int32_t) * rows);
  return l;
}

BlockLayout packBlockInto(int origin, int numSeqs, const int32_t* offsets, const int32_t* pos,
                          int64_t rows, const void* t0, const void* t1, RowBytes rowBytes, char* p) {
  if (t1 == nullptr) rowBytes = RowBytes::one(rowBytes.t0);
  BlockLayout l = packBlockMeta(origin, numSeqs, offsets, pos, rows, rowBytes, p);
  if (rows) std::memcpy(p + l.t0At, t0, l.t0Bytes);
  if (rows && t1) std::memcpy(p + l.t1At, t1, l.t1Bytes);
  return l;
}

void packBlock(int origin, int numSeqs, const int32_t* offsets, const int32_t* pos, int64_t rows,
               const void* t0, const void* t1, RowBytes rowBytes, std::vector<char>* out) {
  if (t1 == nullptr) rowBytes = RowBytes::one(rowBytes.t0);
  out->resize(BlockLayout::of(numSeqs, rows, rowBytes).total);
  packBlockInto(origin, numSeqs, offsets, pos, rows, t0, t1, rowBytes, out->data());
}

bool BlockLayout::checked(int64_t numSeqs, int64_t rows, RowBytes rb, BlockLayout* out) {
  if (numSeqs < 0 || rows < 0 || rb.tensors < 1 || rb.tensors > 2 || numSeqs >= INT32_MAX || rows > INT32_MAX)
    return false;
  if (rb.tensors == 1) rb.t1 = 0;
  BlockLayout l;
  l.offsetsAt = sizeof(BlockHeader);
  l.posAt = l.offsetsAt + sizeof(int32_t) * size_t(numSeqs + 1);  // < 2^34: no overflow
  const size_t metaEnd = l.posAt + sizeof(int32_t) * size_t(rows);
  l.t0At = roundUp(metaEnd, 64);
  if (__builtin_mul_overflow(rb.t0, size_t(rows), &l.t0Bytes) || __builtin_mul_overflow(rb.t1, size_t(rows), &l.t1Bytes) ||
      __builtin_add_overflow(l.t0At, l.t0Bytes, &l.t1At) || __builtin_add_overflow(l.t1At, l.t1Bytes, &l.total))
    return false;
  *out = l;
  return true;
}

attnResult_t parseBlock(const char* data, size_t bytes, const BlockExpect& want, BlockView* v) {
  const int from = want.from;
  if (bytes < sizeof(BlockHeader))
    return setError(attnRemoteError, "%s from rank %d: %zu bytes, shorter than its header", want.what, from, bytes);
  BlockHeader h;
  std::memcpy(&h, data, sizeof(h));
  if (h.magic != kBlockMagic)
    return setError(attnRemoteError, "%s from rank %d: not a block (magic 0x%x)", want.what, from, h.magic);
  if (h.origin < 0 || h.origin >= want.nranks || (want.origin >= 0 && h.origin != want.origin))
    return setError(attnRemoteError, "%s from rank %d: carries rows of rank %d, %s expected", want.what, from,
                    h.origin, want.origin >= 0 ? std::to_string(want.origin).c_str() : "a rank of the call");
  if (h.num_seqs != want.numSeqs)
    return setError(attnRemoteError, "%s from rank %d: %d sequences, the call has %d", want.what, from, h.num_seqs,
                    want.numSeqs);
  if (h.rows < 0 || h.rows > want.maxRows || (want.exactRows && h.rows != want.maxRows))
    return setError(attnRemoteError, "%s from rank %d: %d rows of rank %d, %s %lld", want.what, from, h.rows,
                    h.origin, want.exactRows ? "its card says" : "at most", (long long)want.maxRows);
  BlockLayout l{};
  if (!BlockLayout::checked(h.num_seqs, h.rows, want.rowBytes, &l) || l.total != bytes)
    return setError(attnRemoteError, "%s from rank %d: %zu bytes for %d rows of %zu + %zu bytes, %zu expected",
                    want.what, from, bytes, h.rows, want.rowBytes.t0, want.rowBytes.t1, l.total);
  const auto* offsets = reinterpret_cast<const int32_t*>(data + l.offsetsAt);
  if (offsets[0] != 0 || offsets[h.num_seqs] != h.rows)
    return setError(attnRemoteError, "%s from rank %d: offsets run from %d to %d over %d rows", want.what, from,
                    offsets[0], offsets[h.num_seqs], h.rows);
  for (int i = 0; i < h.num_seqs; ++i)
    if (offsets[i + 1] < offsets[i])
      return setError(attnRemoteError, "%s from rank %d: offsets decrease at sequence %d", want.what, from, i);
  v->origin = h.origin;
  v->numSeqs = h.num_seqs;
  v->rows = h.rows;
  v->offsets = offsets;
  v->pos = reinterpret_cast<const int32_t*>(data + l.posAt);
  v->t0 = data + l.t0At;
  v->t1 = want.rowBytes.tensors == 2 ? data + l.t1At : nullptr;
  return attnSuccess;
}

}  // namespace attn
