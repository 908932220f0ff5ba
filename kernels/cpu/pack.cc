#include "kernels/cpu/pack.h"

#include <cstring>

namespace attn::cpu {

// Runs of consecutive indices are copied as one block: load-balanced shards
// are two long runs, so this is mostly a couple of memcpy calls.
void gatherRows(void* dst, const void* src, const int32_t* idx, size_t n, size_t row_bytes) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  for (size_t i = 0; i < n;) {
    size_t run = 1;
    while (i + run < n && idx[i + run] == idx[i] + int32_t(run)) ++run;
    std::memcpy(d + i * row_bytes, s + size_t(idx[i]) * row_bytes, run * row_bytes);
    i += run;
  }
}

void scatterRows(void* dst, const void* src, const int32_t* idx, size_t n, size_t row_bytes) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  for (size_t i = 0; i < n;) {
    size_t run = 1;
    while (i + run < n && idx[i + run] == idx[i] + int32_t(run)) ++run;
    std::memcpy(d + size_t(idx[i]) * row_bytes, s + i * row_bytes, run * row_bytes);
    i += run;
  }
}

}  // namespace attn::cpu
