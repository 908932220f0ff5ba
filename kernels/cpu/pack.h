// Gathering and scattering whole rows of a [rows, heads, head_dim] tensor by
// an index list, for any dtype: packing the tokens a peer needs into one
// message, and putting received tokens back in place.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attncomm.h"
#include "src/core/datatype.h"

namespace attn::cpu {

inline size_t rowBytes(int heads, int head_dim, attnDataType_t type) {
  return size_t(heads) * size_t(head_dim) * dataTypeSize(type);
}

// dst row i = src row idx[i], i in [0, n). dst and src must not overlap.
void gatherRows(void* dst, const void* src, const int32_t* idx, size_t n, size_t row_bytes);
// dst row idx[i] = src row i. Indices should be distinct (else the last wins).
void scatterRows(void* dst, const void* src, const int32_t* idx, size_t n, size_t row_bytes);

}  // namespace attn::cpu
