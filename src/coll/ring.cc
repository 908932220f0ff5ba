#include "src/coll/coll.h"

#include "src/core/settings.h"

namespace attn {

Ring Ring::identity(int rank, int nranks) {
  Ring r;
  r.ranks.resize(nranks);
  for (int i = 0; i < nranks; ++i) r.ranks[i] = i;
  r.pos = rank;
  return r;
}

size_t chunkBytes(size_t elemSize) {
  // Read once per process; at least 4096 (the table's range).
  static const size_t configured = static_cast<size_t>(settingInt<Setting::kChunkSize>());
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
