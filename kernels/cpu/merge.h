// Merging partial attention results (DESIGN.md §2). A partial over a subset
// of keys is (O_j, lse_j), O_j normalised, lse_j = log sum exp(scores). Then
//   lse = log sum_j exp(lse_j),   O = sum_j exp(lse_j - lse) * O_j,
// computed with the maximum subtracted. A partial with lse_j = -inf saw no
// key and contributes nothing, even if its O_j holds garbage; if every
// partial of a row is -inf the row becomes O = 0, lse = -inf.
//
// Layout: `rows` rows of head_dim values (for THD tensors rows = tokens *
// heads), LSE one float per row. The accumulator is fp32; partials may be
// fp32, fp16 or bf16 (LSE always fp32).
#pragma once

#include <cstddef>
#include <cstdint>

#include "attncomm.h"

namespace attn::cpu {

struct AttnPartialRef {
  const void* o;             // [rows, head_dim]
  attnDataType_t o_dtype;    // attnFloat32, attnFloat16 or attnBfloat16
  const float* lse;          // [rows]
};

// (o_acc, lse_acc) <- merge of itself and parts[0 .. nparts), one pass.
[[nodiscard]] attnResult_t mergePartials(float* o_acc, float* lse_acc,
                                         const AttnPartialRef* parts, int nparts,
                                         size_t rows, int head_dim);

// Merge-on-receive: (o_acc, lse_acc) <- merge of itself and one partial.
[[nodiscard]] attnResult_t foldPartial(float* o_acc, float* lse_acc, const AttnPartialRef& part,
                                       size_t rows, int head_dim);

// As foldPartial, but partial token row i folds into accumulator token row
// acc_rows[i]; each token row has `heads` rows of head_dim (pass-Q outputs
// that come back for a subset of the tokens).
[[nodiscard]] attnResult_t foldPartialRows(float* o_acc, float* lse_acc,
                                           const AttnPartialRef& part, const int32_t* acc_rows,
                                           size_t ntokens, int heads, int head_dim);

}  // namespace attn::cpu
