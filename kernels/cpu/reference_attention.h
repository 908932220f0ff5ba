// Exact attention in double precision, straight from the definition: the
// yardstick every attention result in the project is compared with
// (DESIGN.md §4). Same inputs and conventions as attention.h: O normalised,
// LSE natural log, rows that see no key O = 0 and LSE = -inf; causal and
// sliding-window masks on global positions (visibleSpan), softcap on the
// scaled scores.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attncomm.h"
#include "kernels/cpu/attention.h"

namespace attn::cpu {

// o: [nq, num_q_heads, valueDim(p)], lse: [nq, num_q_heads], both double.
[[nodiscard]] attnResult_t referenceAttention(const AttnProblem& p, double* o, double* lse);

// With attention sinks: sinks[h] (num_q_heads fp32 logits, natural log, in
// the space of the scaled and softcapped scores) adds exp(sinks[h]) to the
// softmax denominator of every row of query head h, and weighs no value:
// o = sum_j exp(s_j) v_j / (exp(sink) + sum_j exp(s_j)), lse = log of that
// denominator. A row that sees no key (in no segment, or masked) gets O = 0
// and LSE = sink. The fast kernels never apply sinks (the library folds them
// in once, after merging partials); null sinks: referenceAttention above.
[[nodiscard]] attnResult_t referenceAttention(const AttnProblem& p, const float* sinks, double* o,
                                              double* lse);

// How far a result is from the reference. O errors are relative to the
// largest |O| of the row (attention outputs are averages and may be near
// zero elementwise); LSE errors are absolute (an LSE error d is a relative
// error d of the denominator).
struct AttnErrors {
  double max_o_rel = 0;     // max over rows of max|o - ref| / max|ref row|
  double max_lse_abs = 0;   // over rows the reference saw a key
  int64_t nan_values = 0;   // NaN anywhere in o or lse
  int64_t empty_mismatch = 0;  // rows with ref LSE -inf but o != 0 or lse != -inf, or vice versa
};

// rows = nq * num_q_heads; o/lse in fp32 as the kernels produce them.
AttnErrors compareAttention(const float* o, const float* lse, const double* ref_o,
                            const double* ref_lse, size_t rows, int head_dim);

}  // namespace attn::cpu
