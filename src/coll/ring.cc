#include "src/coll/coll.h"

#include "src/core/env.h"

namespace attn {

Ring Ring::identity(int rank, int nranks) {
  Ring r;
  r.ranks.resize(nranks);
  for (int i = 0; i < nranks; ++i) r.ranks[i] = i;
  r.pos = rank;
  return r;
}

size_t chunkBytes(size_t elemSize) {
  static const size_t configured = [] {
    int64_t v = envInt("ATTN_CHUNK_SIZE", 1 << 20);
    return static_cast<size_t>(v < 4096 ? 4096 : v);
  }();
  size_t e = elemSize ? elemSize : 1;
  return configured / e * e;
}

std::vector<Block> splitEvenly(size_t count, int n, size_t elemSize) {
  std::vector<Block> blocks(n);
  size_t base = count / n, extra = count % n, off = 0;
  for (int i = 0; i < n; ++i) {
    size_t c = base + (static_cast<size_t>(i) < extra ? 1 : 0);
    blocks[i] = {off * elemSize, c * elemSize};
    off += c;
  }
  return blocks;
}

}  // namespace attn
