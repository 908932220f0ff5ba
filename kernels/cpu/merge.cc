#include "kernels/cpu/merge.h"

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/convert.h"

namespace attn::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Row r of a partial's O as fp32 (in place, or converted into buf).
const float* partRow(const AttnPartialRef& p, size_t r, int d, float* buf) {
  if (p.o_dtype == attnFloat32) return static_cast<const float*>(p.o) + r * d;
  (void)convertToFloat(buf, static_cast<const uint16_t*>(p.o) + r * d, p.o_dtype, size_t(d));
  return buf;
}

bool validParts(const AttnPartialRef* parts, int n) {
  for (int j = 0; j < n; ++j)
    if (!isAttnFloatType(parts[j].o_dtype) || parts[j].o == nullptr || parts[j].lse == nullptr)
      return false;
  return true;
}

// Merges row `ra` of the accumulator with row `rp` of every part.
void mergeRow(float* o, float& lse, const AttnPartialRef* parts, int n, size_t rp, int d,
              float* buf) {
  float mx = lse;
  for (int j = 0; j < n; ++j) mx = std::fmax(mx, parts[j].lse[rp]);
  if (mx == kNegInf) {  // nobody saw a key
    for (int i = 0; i < d; ++i) o[i] = 0.0f;
    lse = kNegInf;
    return;
  }
  // Weights relative to the max; -inf partials are skipped, not multiplied,
  // so garbage in their O cannot leak (0 * NaN).
  float w0 = lse == kNegInf ? 0.0f : std::exp(lse - mx);
  float sum = w0;
  for (int j = 0; j < n; ++j) {
    const float l = parts[j].lse[rp];
    if (l != kNegInf) sum += std::exp(l - mx);
  }
  const float inv = 1.0f / sum;
  if (w0 == 0.0f) {
    for (int i = 0; i < d; ++i) o[i] = 0.0f;
  } else {
    const float s = w0 * inv;
    for (int i = 0; i < d; ++i) o[i] *= s;
  }
  for (int j = 0; j < n; ++j) {
    const float l = parts[j].lse[rp];
    if (l == kNegInf) continue;
    const float s = std::exp(l - mx) * inv;
    const float* src = partRow(parts[j], rp, d, buf);
    for (int i = 0; i < d; ++i) o[i] += s * src[i];
  }
  lse = mx + std::log(sum);
}

}  // namespace

attnResult_t mergePartials(float* o_acc, float* lse_acc, const AttnPartialRef* parts, int nparts,
                           size_t rows, int head_dim) {
  if (nparts < 0 || head_dim <= 0 || (rows && (!o_acc || !lse_acc)) || !validParts(parts, nparts))
    return attnInvalidArgument;
  std::vector<float> buf(static_cast<size_t>(head_dim));
  for (size_t r = 0; r < rows; ++r)
    mergeRow(o_acc + r * head_dim, lse_acc[r], parts, nparts, r, head_dim, buf.data());
  return attnSuccess;
}

attnResult_t foldPartial(float* o_acc, float* lse_acc, const AttnPartialRef& part, size_t rows,
                         int head_dim) {
  return mergePartials(o_acc, lse_acc, &part, 1, rows, head_dim);
}

attnResult_t foldPartialRows(float* o_acc, float* lse_acc, const AttnPartialRef& part,
                             const int32_t* acc_rows, size_t ntokens, int heads, int head_dim) {
  if (heads <= 0 || head_dim <= 0 || (ntokens && !acc_rows) || !validParts(&part, 1))
    return attnInvalidArgument;
  std::vector<float> buf(static_cast<size_t>(head_dim));
  for (size_t t = 0; t < ntokens; ++t) {
    for (int h = 0; h < heads; ++h) {
      const size_t ra = size_t(acc_rows[t]) * heads + h;
      mergeRow(o_acc + ra * head_dim, lse_acc[ra], &part, 1, t * heads + h, head_dim,
               buf.data());
    }
  }
  return attnSuccess;
}

}  // namespace attn::cpu
