// Attention sinks (gpt-oss, StreamingLLM-style learned sinks): one extra
// logit per query head that joins the softmax denominator but has no value
// row. Applied once to a finished result: with lse = log sum_j exp(s_j),
//   lse' = log(exp(lse) + exp(sink_h)),   O' = O * exp(lse - lse'),
// computed with the maximum subtracted. A row that saw no key (lse = -inf,
// garbage O) gets lse' = sink_h and O = 0; sink_h = -inf leaves any other
// row as it is.
#pragma once

#include <cmath>
#include <cstdint>

namespace attn::cpu {

// In place. o: [rows, heads, head_dim] fp32, normalised; lse: [rows, heads]
// fp32, natural log, token-major; sinks: [heads] fp32 (host memory).
void applySinks(float* o, float* lse, int64_t rows, int heads, int head_dim, const float* sinks);

// The sink-adjusted LSE of one row of LSE `lse` and sink `sink`, and the
// factor its O is scaled by (0: the row saw no key, O is written as 0).
inline void sinkFold(float lse, float sink, float& lse_out, float& factor) {
  if (std::isinf(lse) && lse < 0) {  // saw no key: only the sink (O = 0 even without one)
    lse_out = sink;
    factor = 0.0f;
    return;
  }
  if (std::isinf(sink) && sink < 0) {  // no sink: unchanged
    lse_out = lse;
    factor = 1.0f;
    return;
  }
  const float m = std::fmax(lse, sink);
  lse_out = m + std::log1p(std::exp(-std::fabs(lse - sink)));
  factor = std::exp(lse - lse_out);
}

}  // namespace attn::cpu
