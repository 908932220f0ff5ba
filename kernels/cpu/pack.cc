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

void gatherKeyTable(int64_t* rows, int32_t* pos, const KeyBlock* blocks, size_t nblocks,
                    int block_tokens, const int32_t* slot_pos, size_t slot_bound) {
  for (size_t b = 0; b < nblocks; ++b) {
    const KeyBlock& k = blocks[b];
    if (k.slot < 0 || size_t(k.slot) >= slot_bound || k.tokens < 0 || k.tokens > block_tokens) continue;
    const int64_t row0 = k.slot * block_tokens;
    for (int32_t t = 0; t < k.tokens; ++t) rows[k.at + t] = row0 + t;
    std::memcpy(pos + k.at, slot_pos + row0, size_t(k.tokens) * sizeof(int32_t));
  }
}

}  // namespace attn::cpu
