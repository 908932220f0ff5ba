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

bool validParts(const AttnPartialRef* parts, int n, size_t rows) {
  for (int j = 0; j < n; ++j)
    if (!isAttnFloatType(parts[j].o_dtype) || parts[j].o == nullptr || parts[j].lse == nullptr ||
        !validLseOf(parts[j], rows))
      return false;
  return true;
}

// Merges an accumulator row with row `rp` of every part (of `rows` rows);
// l: room for the n parts' natural LSEs of the row, read once.
void mergeRow(float* o, float& lse, const AttnPartialRef* parts, int n, size_t rp, size_t rows,
              int d, float* buf, float* l) {
  for (int j = 0; j < n; ++j) l[j] = partLse(parts[j], rp, rows);
  float mx = lse;
  for (int j = 0; j < n; ++j) mx = std::fmax(mx, l[j]);
  if (mx == kNegInf) {  // nobody saw a key
    for (int i = 0; i < d; ++i) o[i] = 0.0f;
    lse = kNegInf;
    return;
  }
  // Weights relative to the max; -inf partials are skipped, not multiplied,
  // so garbage in their O cannot leak (0 * NaN).
  float w0 = lse == kNegInf ? 0.0f : std::exp(lse - mx);
  float sum = w0;
  for (int j = 0; j < n; ++j)
    if (l[j] != kNegInf) sum += std::exp(l[j] - mx);
  const float inv = 1.0f / sum;
  if (w0 == 0.0f) {
    for (int i = 0; i < d; ++i) o[i] = 0.0f;
  } else {
    const float s = w0 * inv;
    for (int i = 0; i < d; ++i) o[i] *= s;
  }
  for (int j = 0; j < n; ++j) {
    if (l[j] == kNegInf) continue;
    const float s = std::exp(l[j] - mx) * inv;
    const float* src = partRow(parts[j], rp, d, buf);
    for (int i = 0; i < d; ++i) o[i] += s * src[i];
  }
  lse = mx + std::log(sum);
}

}  // namespace

attnResult_t mergePartials(float* o_acc, float* lse_acc, const AttnPartialRef* parts, int nparts,
                           size_t rows, int head_dim) {
  if (nparts < 0 || head_dim <= 0 || (rows && (!o_acc || !lse_acc)) || !validParts(parts, nparts, rows))
    return attnInvalidArgument;
  std::vector<float> buf(static_cast<size_t>(head_dim)), l(size_t(nparts) + 1);
  for (size_t r = 0; r < rows; ++r)
    mergeRow(o_acc + r * head_dim, lse_acc[r], parts, nparts, r, rows, head_dim, buf.data(), l.data());
  return attnSuccess;
}

attnResult_t foldPartial(float* o_acc, float* lse_acc, const AttnPartialRef& part, size_t rows,
                         int head_dim) {
  return mergePartials(o_acc, lse_acc, &part, 1, rows, head_dim);
}

attnResult_t foldPartialRows(float* o_acc, float* lse_acc, const AttnPartialRef& part,
                             const int32_t* acc_rows, size_t ntokens, int heads, int head_dim) {
  if (heads <= 0 || head_dim <= 0 || (ntokens && !acc_rows) || !validParts(&part, 1, ntokens * size_t(heads)))
    return attnInvalidArgument;
  std::vector<float> buf(static_cast<size_t>(head_dim));
  float l = 0;
  for (size_t t = 0; t < ntokens; ++t) {
    for (int h = 0; h < heads; ++h) {
      const size_t ra = size_t(acc_rows[t]) * heads + h;
      mergeRow(o_acc + ra * head_dim, lse_acc[ra], &part, 1, t * heads + h, ntokens * size_t(heads),
               head_dim, buf.data(), &l);
    }
  }
  return attnSuccess;
}

}  // namespace attn::cpu
