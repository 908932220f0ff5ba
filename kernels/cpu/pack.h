// Gathering and scattering whole rows of a [rows, heads, head_dim] tensor by
// an index list, for any dtype: packing the tokens a peer needs into one
// message, and putting received tokens back in place. And the key table of
// paged K/V: which row of a block pool each key is, and its position.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attncomm.h"
#include "kernels/kernel_types.h"

namespace attn::cpu {

inline size_t rowBytes(int heads, int head_dim, attnDataType_t type) {
  return size_t(heads) * size_t(head_dim) * kernels::elementSize(type);
}

// dst row i = src row idx[i], i in [0, n). dst and src must not overlap.
void gatherRows(void* dst, const void* src, const int32_t* idx, size_t n, size_t row_bytes);
// dst row idx[i] = src row i. Indices should be distinct (else the last wins).
void scatterRows(void* dst, const void* src, const int32_t* idx, size_t n, size_t row_bytes);

// One block of a paged key table: table entries [at, at + tokens) are rows
// [slot * block_tokens, slot * block_tokens + tokens) of the pool.
struct KeyBlock {
  int64_t slot;
  int32_t at;
  int32_t tokens;
};
// For each block and t < its tokens: rows[at + t] = slot * block_tokens + t
// (AttnProblem::k_rows) and pos[at + t] = slot_pos[slot * block_tokens + t]
// (the pool's positions, by row). Blocks with a slot outside
// [0, slot_bound) or tokens outside [0, block_tokens] are skipped.
void gatherKeyTable(int64_t* rows, int32_t* pos, const KeyBlock* blocks, size_t nblocks,
                    int block_tokens, const int32_t* slot_pos, size_t slot_bound);

}  // namespace attn::cpu
