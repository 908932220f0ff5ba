// Merging partial attention results (DESIGN.md §2). A partial over a subset
// of keys is (O_j, lse_j), O_j normalised, lse_j = log sum exp(scores). Then
//   lse = log sum_j exp(lse_j),   O = sum_j exp(lse_j - lse) * O_j,
// computed with the maximum subtracted. A partial with lse_j = -inf saw no
// key and contributes nothing, even if its O_j holds garbage; if every
// partial of a row is -inf the row becomes O = 0, lse = -inf.
//
// Layout: `rows` rows of head_dim values (for THD tensors rows = tokens *
// heads), LSE one float per row. The accumulator is fp32, its LSE natural
// and token-major; partials may be fp32, fp16 or bf16, their LSE (always
// fp32) natural or base 2, token-major or head-major: read as they are, so
// an engine's own kernel output folds without a conversion pass.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attncomm.h"

namespace attn::cpu {

struct AttnPartialRef {
  const void* o;             // [rows, head_dim]
  attnDataType_t o_dtype;    // attnFloat32, attnFloat16 or attnBfloat16
  const float* lse;          // [rows]
  attnLseBase_t lse_base = attnLseNatural;  // base 2: lse2 = lse * log2(e)
  // Head-major: row r = t * lse_heads + h has its LSE at [h * tokens + t],
  // tokens = rows / lse_heads (the partial's rows, not the accumulator's).
  attnLseLayout_t lse_layout = attnLseTokenMajor;
  int lse_heads = 1;
};

// The natural-log LSE of row r of a partial of `rows` rows.
inline float partLse(const AttnPartialRef& p, size_t r, size_t rows) {
  size_t i = r;
  if (p.lse_layout == attnLseHeadMajor) {
    const size_t h = size_t(p.lse_heads);
    i = (r % h) * (rows / h) + r / h;
  }
  return p.lse_base == attnLseBase2 ? p.lse[i] * 0.69314718055994531f : p.lse[i];  // ln 2
}

// Whether a partial's LSE convention can be read for `rows` rows.
inline bool validLseOf(const AttnPartialRef& p, size_t rows) {
  if (p.lse_base != attnLseNatural && p.lse_base != attnLseBase2) return false;
  if (p.lse_layout == attnLseTokenMajor) return true;
  return p.lse_layout == attnLseHeadMajor && p.lse_heads >= 1 && rows % size_t(p.lse_heads) == 0;
}

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
