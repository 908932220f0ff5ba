// Attention blocks on the wire (src/attn/wire.h): packBlockMeta, which the
// GPU ring fills around device copies of K and V, writes exactly what
// packBlock writes, and a packed block reads back through viewBlock.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "src/attn/wire.h"

namespace {

TEST(AttnWire, MetaThenTensorsEqualsPackBlock) {
  const int numSeqs = 3;
  // Offsets of a shard that starts at row 5 of a bigger layout: rebased.
  const std::vector<int32_t> offsets = {5, 9, 9, 12};
  const std::vector<int32_t> pos = {3, 1, 2, 0, 7, 8, 6};
  const int64_t rows = 7;
  const size_t rowBytes = 24;  // e.g. 3 kv heads x 4 dims x bf16
  std::vector<uint8_t> k(rows * rowBytes), v(rows * rowBytes);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = uint8_t(i * 7 + 1);
    v[i] = uint8_t(i * 13 + 5);
  }
  std::vector<char> packed;
  attn::packBlock(2, numSeqs, offsets.data(), pos.data(), rows, k.data(), v.data(), rowBytes, &packed);

  const attn::BlockLayout l = attn::BlockLayout::of(numSeqs, rows, rowBytes, 2);
  ASSERT_EQ(packed.size(), l.total);
  std::vector<char> meta(l.total, 0);
  const attn::BlockLayout m =
      attn::packBlockMeta(2, numSeqs, offsets.data(), pos.data(), rows, rowBytes, 2, meta.data());
  EXPECT_EQ(m.total, l.total);
  EXPECT_EQ(m.tensorAt % 64, 0u);
  std::memcpy(meta.data() + m.tensorAt, k.data(), m.tensorBytes);
  std::memcpy(meta.data() + m.tensorAt + m.tensorBytes, v.data(), m.tensorBytes);
  EXPECT_EQ(std::memcmp(meta.data(), packed.data(), l.total), 0);

  attn::BlockView view;
  ASSERT_EQ(attn::viewBlock(meta.data(), meta.size(), rowBytes, 2, &view), attnSuccess);
  EXPECT_EQ(view.origin, 2);
  EXPECT_EQ(view.numSeqs, numSeqs);
  EXPECT_EQ(view.rows, rows);
  const int32_t rebased[] = {0, 4, 4, 7};
  for (int i = 0; i <= numSeqs; ++i) EXPECT_EQ(view.offsets[i], rebased[i]);
  EXPECT_EQ(std::memcmp(view.pos, pos.data(), sizeof(int32_t) * rows), 0);
  EXPECT_EQ(std::memcmp(view.t1, v.data(), v.size()), 0);
}

TEST(AttnWire, EmptyBlockHasOnlyMetadata) {
  const std::vector<int32_t> offsets = {0, 0};
  std::vector<char> buf(attn::BlockLayout::of(1, 0, 16, 2).total);
  const attn::BlockLayout l = attn::packBlockMeta(1, 1, offsets.data(), nullptr, 0, 16, 2, buf.data());
  EXPECT_EQ(l.tensorBytes, 0u);
  EXPECT_EQ(l.total, l.tensorAt);
  attn::BlockView view;
  ASSERT_EQ(attn::viewBlock(buf.data(), buf.size(), 16, 2, &view), attnSuccess);
  EXPECT_EQ(view.rows, 0);
  // A block truncated by one byte is refused, not read past its end.
  EXPECT_NE(attn::viewBlock(buf.data(), buf.size() - 1, 16, 2, &view), attnSuccess);
}

}  // namespace
