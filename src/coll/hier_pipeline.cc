#include "src/coll/hier_pipeline.h"

#include <algorithm>

#include "src/core/settings.h"
#include "src/core/error.h"

namespace attn {

int hierSegments(size_t maxBlockBytes) {
  const int64_t configured = settingInt<Setting::kHierSegments>();  // in [0, 64]
  if (configured > 0) return static_cast<int>(configured);
  constexpr size_t kSegmentBytes = 256 << 10;
  return static_cast<int>(std::clamp<size_t>(maxBlockBytes / kSegmentBytes, 1, 8));
}

Block segmentOf(const Block& b, int s, int segments, size_t align) {
  const size_t units = b.bytes / align;
  const size_t lo = units * s / segments, hi = units * (s + 1) / segments;
  Block out{b.offset + lo * align, (hi - lo) * align};
  if (s == segments - 1) out.bytes = b.bytes - lo * align;  // any unaligned tail
  return out;
}

attnResult_t runWaves(Engine& e, int stages, int segments,
                      const std::function<std::unique_ptr<CollOp>(int stage, int segment)>& make) {
  for (int w = 0; w + 1 < stages + segments; ++w) {
    std::vector<std::unique_ptr<CollOp>> owned;
    std::vector<CollOp*> ops;
    for (int l = 0; l < stages; ++l) {
      const int s = w - l;
      if (s < 0 || s >= segments) continue;
      owned.push_back(make(l, s));
      ops.push_back(owned.back().get());
    }
    ATTN_CHECK(runOps(e, ops));
  }
  return attnSuccess;
}

}  // namespace attn
