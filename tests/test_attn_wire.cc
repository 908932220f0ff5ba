// Attention blocks on the wire (src/attn/wire.h): packBlockMeta, which the
// GPU ring fills around device copies of K and V, writes exactly what
// packBlock writes, and a packed block reads back through parseBlock; a
// block other than the receiver expects (another origin, shape or size,
// sizes that overflow) is attnRemoteError naming the rank it came from.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "src/attn/wire.h"
#include "src/core/error.h"

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
  const attn::RowBytes kv = attn::RowBytes::two(rowBytes, rowBytes);
  attn::packBlock(2, numSeqs, offsets.data(), pos.data(), rows, k.data(), v.data(), kv, &packed);

  const attn::BlockLayout l = attn::BlockLayout::of(numSeqs, rows, kv);
  ASSERT_EQ(packed.size(), l.total);
  std::vector<char> meta(l.total, 0);
  const attn::BlockLayout m = attn::packBlockMeta(2, numSeqs, offsets.data(), pos.data(), rows, kv, meta.data());
  EXPECT_EQ(m.total, l.total);
  EXPECT_EQ(m.t0At % 64, 0u);
  std::memcpy(meta.data() + m.t0At, k.data(), m.t0Bytes);
  std::memcpy(meta.data() + m.t1At, v.data(), m.t1Bytes);
  EXPECT_EQ(std::memcmp(meta.data(), packed.data(), l.total), 0);

  attn::BlockExpect want;
  want.from = 2;
  want.nranks = 4;
  want.origin = 2;
  want.numSeqs = numSeqs;
  want.maxRows = rows;
  want.exactRows = true;
  want.rowBytes = kv;
  attn::BlockView view;
  ASSERT_EQ(attn::parseBlock(meta.data(), meta.size(), want, &view), attnSuccess) << attn::threadLastError();
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
  std::vector<char> buf(attn::BlockLayout::of(1, 0, attn::RowBytes::two(16, 16)).total);
  const attn::BlockLayout l =
      attn::packBlockMeta(1, 1, offsets.data(), nullptr, 0, attn::RowBytes::two(16, 16), buf.data());
  EXPECT_EQ(l.t0Bytes + l.t1Bytes, 0u);
  EXPECT_EQ(l.total, l.t0At);
  attn::BlockExpect want;
  want.from = 1;
  want.nranks = 2;
  want.numSeqs = 1;
  want.rowBytes = attn::RowBytes::two(16, 16);
  attn::BlockView view;
  ASSERT_EQ(attn::parseBlock(buf.data(), buf.size(), want, &view), attnSuccess) << attn::threadLastError();
  EXPECT_EQ(view.rows, 0);
  // A block truncated by one byte is refused, not read past its end.
  EXPECT_EQ(attn::parseBlock(buf.data(), buf.size() - 1, want, &view), attnRemoteError);
}

// A well-formed block of rank 2's 5 rows over 3 sequences, 24-byte rows.
struct Sample {
  std::vector<char> bytes;
  attn::BlockExpect want;
  Sample() {
    const std::vector<int32_t> offsets = {0, 2, 2, 5}, pos = {0, 1, 2, 3, 4};
    std::vector<uint8_t> k(5 * 24, 1), v(5 * 24, 2);
    attn::packBlock(2, 3, offsets.data(), pos.data(), 5, k.data(), v.data(), attn::RowBytes::two(24, 24), &bytes);
    want.from = 1;  // relayed by rank 1
    want.nranks = 4;
    want.origin = 2;
    want.numSeqs = 3;
    want.maxRows = 5;
    want.exactRows = true;
    want.rowBytes = attn::RowBytes::two(24, 24);
  }
  attn::BlockHeader& header() { return *reinterpret_cast<attn::BlockHeader*>(bytes.data()); }
  int32_t* offsets() { return reinterpret_cast<int32_t*>(bytes.data() + sizeof(attn::BlockHeader)); }
};

// The call fails as the peer's fault, and the text names the rank it came
// from.
void ExpectRefusedFromRank1(Sample& s, const char* what) {
  attn::BlockView view;
  EXPECT_EQ(attn::parseBlock(s.bytes.data(), s.bytes.size(), s.want, &view), attnRemoteError) << what;
  EXPECT_NE(attn::threadLastError().find("rank 1"), std::string::npos) << what << ": " << attn::threadLastError();
}

TEST(AttnWire, BlockOfTheExpectedShapeParses) {
  Sample s;
  attn::BlockView view;
  ASSERT_EQ(attn::parseBlock(s.bytes.data(), s.bytes.size(), s.want, &view), attnSuccess) << attn::threadLastError();
  EXPECT_EQ(view.origin, 2);
  EXPECT_EQ(view.rows, 5);
  s.want.origin = -1;  // any origin, up to 7 rows
  s.want.maxRows = 7;
  s.want.exactRows = false;
  EXPECT_EQ(attn::parseBlock(s.bytes.data(), s.bytes.size(), s.want, &view), attnSuccess) << attn::threadLastError();
}

TEST(AttnWire, BlockOfAnotherOriginIsRefused) {
  Sample s;
  s.want.origin = 3;
  ExpectRefusedFromRank1(s, "origin 2 where 3 was expected");
  Sample t;
  t.header().origin = 9;  // not a rank of the call
  t.want.origin = -1;
  ExpectRefusedFromRank1(t, "origin outside the communicator");
  Sample u;
  u.header().origin = -1;
  u.want.origin = -1;
  ExpectRefusedFromRank1(u, "negative origin");
}

TEST(AttnWire, BlockOfAnotherShapeIsRefused) {
  Sample s;
  s.want.numSeqs = 4;  // the call has 4 sequences, the block 3: reading 4 would pass its offsets
  ExpectRefusedFromRank1(s, "fewer sequences");
  Sample t;
  t.want.maxRows = 4;
  ExpectRefusedFromRank1(t, "exact row count");
  Sample u;
  u.want.exactRows = false;
  u.want.maxRows = 4;
  ExpectRefusedFromRank1(u, "more rows than allowed");
  Sample v;
  v.want.rowBytes = attn::RowBytes::two(32, 32);  // other heads / dtype: the size does not add up
  ExpectRefusedFromRank1(v, "row size");
  Sample w;
  w.offsets()[1] = 4;  // 0, 4, 2, 5: decreasing
  ExpectRefusedFromRank1(w, "decreasing offsets");
  Sample x;
  x.offsets()[3] = 4;  // last offset not the row count
  ExpectRefusedFromRank1(x, "offsets not ending at rows");
}

// Header counts chosen to overflow the layout's sizes: refused from the
// size check, never used to index or allocate.
TEST(AttnWire, BlockSizesThatOverflowAreRefused) {
  Sample s;
  s.header().num_seqs = INT32_MAX;
  s.want.numSeqs = INT32_MAX;
  ExpectRefusedFromRank1(s, "INT32_MAX sequences");
  Sample t;
  t.header().rows = INT32_MAX;
  t.want.maxRows = INT32_MAX;
  t.want.exactRows = false;
  t.want.rowBytes = attn::RowBytes::two(SIZE_MAX / 4, 8);  // rows x rowBytes overflows size_t
  ExpectRefusedFromRank1(t, "rows x row size overflows");
  Sample u;
  u.header().rows = -5;
  ExpectRefusedFromRank1(u, "negative rows");
  attn::BlockLayout l;
  EXPECT_FALSE(attn::BlockLayout::checked(3, INT32_MAX, attn::RowBytes::two(SIZE_MAX / 2, 8), &l));
  EXPECT_FALSE(attn::BlockLayout::checked(3, 1 << 20, attn::RowBytes::two(8, SIZE_MAX / 1024), &l));
  EXPECT_FALSE(attn::BlockLayout::checked(-1, 3, attn::RowBytes::one(8), &l));
  EXPECT_FALSE(attn::BlockLayout::checked(3, int64_t(1) << 40, attn::RowBytes::one(8), &l));
  ASSERT_TRUE(attn::BlockLayout::checked(3, 5, attn::RowBytes::two(24, 24), &l));
  EXPECT_EQ(l.total, attn::BlockLayout::of(3, 5, attn::RowBytes::two(24, 24)).total);
}

TEST(AttnWire, ShortOrForeignBytesAreRefused) {
  Sample s;
  s.header().magic ^= 1;
  ExpectRefusedFromRank1(s, "bad magic");
  Sample t;
  t.bytes.resize(sizeof(attn::BlockHeader) - 1);
  ExpectRefusedFromRank1(t, "shorter than a header");
  Sample u;
  u.bytes.push_back(0);
  ExpectRefusedFromRank1(u, "a byte too many");
}

}  // namespace
