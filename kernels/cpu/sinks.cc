#include "kernels/cpu/sinks.h"

namespace attn::cpu {

void applySinks(float* o, float* lse, int64_t rows, int heads, int head_dim, const float* sinks) {
  if (rows <= 0 || heads <= 0 || head_dim <= 0) return;
  for (int64_t r = 0; r < rows; ++r)
    for (int h = 0; h < heads; ++h) {
      const size_t i = size_t(r) * size_t(heads) + size_t(h);
      float l, f;
      sinkFold(lse[i], sinks[h], l, f);
      lse[i] = l;
      if (f == 1.0f) continue;
      float* row = o + i * size_t(head_dim);
      for (int d = 0; d < head_dim; ++d) row[d] = f == 0.0f ? 0.0f : row[d] * f;  // O = 0, never NaN
    }
}

}  // namespace attn::cpu
