#include "src/attn/wire.h"

#include <cstring>

#include "src/core/error.h"

namespace attn {
namespace {
constexpr uint32_t kBlockMagic = 0xB10CA77Eu;
size_t roundUp(size_t x, size_t a) { return (x + a - 1) / a * a; }
}  // namespace

BlockLayout BlockLayout::of(int numSeqs, int64_t rows, size_t rowBytes, int tensors) {
  BlockLayout l;
  l.offsetsAt = sizeof(BlockHeader);
  l.posAt = l.offsetsAt + sizeof(int32_t) * (numSeqs + 1);
  l.tensorAt = roundUp(l.posAt + sizeof(int32_t) * rows, 64);
  l.tensorBytes = rowBytes * rows;
  l.total = l.tensorAt + l.tensorBytes * tensors;
  return l;
}

BlockLayout packBlockMeta(int origin, int numSeqs, const int32_t* offsets, const int32_t* pos,
                          int64_t rows, size_t rowBytes, int tensors, char* out) {
  BlockLayout l = BlockLayout::of(numSeqs, rows, rowBytes, tensors);
  BlockHeader h{kBlockMagic, origin, numSeqs, static_cast<int32_t>(rows)};
  std::memcpy(out, &h, sizeof(h));
  // Offsets are rebased so the block's rows start at 0.
  auto* offs = reinterpret_cast<int32_t*>(out + l.offsetsAt);
  for (int i = 0; i <= numSeqs; ++i) offs[i] = offsets[i] - offsets[0];
  if (rows) std::memcpy(out + l.posAt, pos, sizeof(int32_t) * rows);
  return l;
}

BlockLayout packBlockInto(int origin, int numSeqs, const int32_t* offsets, const int32_t* pos,
                          int64_t rows, const void* t0, const void* t1, size_t rowBytes, char* p) {
  const int tensors = t1 ? 2 : 1;
  BlockLayout l = packBlockMeta(origin, numSeqs, offsets, pos, rows, rowBytes, tensors, p);
  if (rows) std::memcpy(p + l.tensorAt, t0, l.tensorBytes);
  if (rows && t1) std::memcpy(p + l.tensorAt + l.tensorBytes, t1, l.tensorBytes);
  return l;
}

void packBlock(int origin, int numSeqs, const int32_t* offsets, const int32_t* pos, int64_t rows,
               const void* t0, const void* t1, size_t rowBytes, std::vector<char>* out) {
  out->resize(BlockLayout::of(numSeqs, rows, rowBytes, t1 ? 2 : 1).total);
  packBlockInto(origin, numSeqs, offsets, pos, rows, t0, t1, rowBytes, out->data());
}

attnResult_t viewBlock(const char* data, size_t bytes, size_t rowBytes, int tensors, BlockView* v) {
  if (bytes < sizeof(BlockHeader))
    return setError(attnInternalError, "attention block of %zu bytes is too short", bytes);
  BlockHeader h;
  std::memcpy(&h, data, sizeof(h));
  if (h.magic != kBlockMagic || h.rows < 0 || h.num_seqs < 0)
    return setError(attnInvalidUsage, "malformed attention block (magic 0x%x, rows %d)", h.magic, h.rows);
  BlockLayout l = BlockLayout::of(h.num_seqs, h.rows, rowBytes, tensors);
  if (l.total != bytes)
    return setError(attnInvalidUsage,
                    "attention block from rank %d has %zu bytes, %zu expected: ranks disagree "
                    "on heads, head_dim or dtype?", h.origin, bytes, l.total);
  v->origin = h.origin;
  v->numSeqs = h.num_seqs;
  v->rows = h.rows;
  v->offsets = reinterpret_cast<const int32_t*>(data + l.offsetsAt);
  v->pos = reinterpret_cast<const int32_t*>(data + l.posAt);
  v->t0 = data + l.tensorAt;
  v->t1 = tensors == 2 ? data + l.tensorAt + l.tensorBytes : nullptr;
  if (v->offsets[0] != 0 || v->offsets[h.num_seqs] != h.rows)
    return setError(attnInvalidUsage, "attention block from rank %d has inconsistent offsets", h.origin);
  for (int i = 0; i < h.num_seqs; ++i)
    if (v->offsets[i + 1] < v->offsets[i])
      return setError(attnInvalidUsage, "attention block from rank %d has decreasing offsets", h.origin);
  return attnSuccess;
}

}  // namespace attn
