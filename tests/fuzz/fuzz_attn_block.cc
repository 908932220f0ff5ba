// The attention collectives' blocks (src/attn/wire.h): every ring, ship-Q,
// head-parallel and level message is one, read with parseBlock. The first
// bytes of the input say what the receiving call expects; the rest is the
// block a peer sent. Whatever parseBlock accepts must lie inside the bytes
// received: every offset, position and tensor byte of the view is read
// here, from an allocation of exactly the block's size.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "src/attn/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 6) return 0;
  attn::BlockExpect want;
  want.from = 1;
  want.nranks = 1 + data[0] % 8;
  want.origin = int(data[1] % (want.nranks + 1)) - 1;
  want.numSeqs = data[2] % 9;
  want.maxRows = data[3];
  want.exactRows = data[4] & 1;
  // K and V rows of different sizes (MLA) as well as equal ones.
  want.rowBytes = (data[4] >> 1) & 1 ? attn::RowBytes::two(1 + data[5], 1 + (data[4] >> 2))
                                     : attn::RowBytes::one(1 + data[5]);
  const size_t bytes = size - 6;
  // Aligned (new[] is), and exactly the block's size: a read past it is seen.
  std::unique_ptr<char[]> block(new char[bytes ? bytes : 1]);
  if (bytes) std::memcpy(block.get(), data + 6, bytes);

  attn::BlockView v;
  if (attn::parseBlock(block.get(), bytes, want, &v) != attnSuccess) return 0;
  if (v.rows < 0 || v.rows > want.maxRows || v.numSeqs != want.numSeqs) std::abort();
  if (v.origin < 0 || v.origin >= want.nranks) std::abort();
  uint64_t sum = 0;  // every byte read: ASan sees a view past the message
  for (int i = 0; i <= v.numSeqs; ++i) sum += uint32_t(v.offsets[i]);
  if (v.offsets[0] != 0 || v.offsets[v.numSeqs] != v.rows) std::abort();
  for (int i = 0; i < v.numSeqs; ++i)
    if (v.offsets[i + 1] < v.offsets[i]) std::abort();
  for (int32_t r = 0; r < v.rows; ++r) sum += uint32_t(v.pos[r]);
  const char* t0 = static_cast<const char*>(v.t0);
  for (size_t i = 0; i < size_t(v.rows) * want.rowBytes.t0; ++i) sum += uint8_t(t0[i]);
  if (want.rowBytes.tensors == 2) {
    const char* t1 = static_cast<const char*>(v.t1);
    for (size_t i = 0; i < size_t(v.rows) * want.rowBytes.t1; ++i) sum += uint8_t(t1[i]);
  } else if (v.t1 != nullptr) {
    std::abort();
  }
  static volatile uint64_t sink;
  sink = sum;  // keeps the reads
  return 0;
}
