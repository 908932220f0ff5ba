#include "kernels/cpu/reference_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/half.h"

namespace attn::cpu {
namespace {

double elem(const void* base, attnDataType_t t, size_t i) {
  switch (t) {
    case attnFloat16: return halfToFloat(static_cast<const uint16_t*>(base)[i]);
    case attnBfloat16: return bf16ToFloat(static_cast<const uint16_t*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

}  // namespace

attnResult_t referenceAttention(const AttnProblem& p, double* o, double* lse) {
  return referenceAttention(p, nullptr, o, lse);
}

attnResult_t referenceAttention(const AttnProblem& p, const float* sinks, double* o, double* lse) {
  if (p.dtype != attnFloat32 && p.dtype != attnFloat16 && p.dtype != attnBfloat16)
    return attnInvalidArgument;
  if (p.num_q_heads <= 0 || p.num_kv_heads <= 0 || p.num_q_heads % p.num_kv_heads ||
      p.head_dim <= 0 || p.head_dim_v < 0)
    return attnInvalidArgument;
  if (p.window_left < -1 || p.window_right < -1 || !(p.softcap >= 0.0f) || std::isinf(p.softcap))
    return attnInvalidArgument;
  const VisibleSpan span = visibleSpan(p);
  if (span.bounded && ((p.nq > 0 && !p.q_pos) || (p.nk > 0 && !p.k_pos))) return attnInvalidArgument;
  const int Hq = p.num_q_heads, Hkv = p.num_kv_heads, D = p.head_dim, Dv = valueDim(p);
  const int group = Hq / Hkv;
  const double scale = p.scale != 0.0f ? double(p.scale) : 1.0 / std::sqrt(double(D));
  const double cap = double(p.softcap);
  const double ninf = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < size_t(p.nq) * Hq * Dv; ++i) o[i] = 0.0;
  for (size_t i = 0; i < size_t(p.nq) * Hq; ++i)
    lse[i] = sinks != nullptr ? double(sinks[i % size_t(Hq)]) : ninf;

  std::vector<AttnSegment> segs;
  if (p.segments == nullptr) segs.push_back({0, p.nq, 0, p.nk});
  else segs.assign(p.segments, p.segments + p.num_segments);
  std::vector<double> s, q(size_t(D), 0.0);
  for (const auto& seg : segs) {
    for (int32_t i = seg.q_begin; i < seg.q_end; ++i) {
      for (int h = 0; h < Hq; ++h) {
        const int kvh = h / group;
        for (int d = 0; d < D; ++d) q[d] = elem(p.q, p.dtype, (size_t(i) * Hq + h) * D + d);
        s.assign(size_t(seg.k_end - seg.k_begin), ninf);
        // The sink joins the max: exp(sink - mx) stays <= 1.
        const double sink = sinks != nullptr ? double(sinks[h]) : ninf;
        double mx = ninf;
        bool seen = false;
        for (int32_t j = seg.k_begin; j < seg.k_end; ++j) {
          if (span.bounded && !span.sees(p.q_pos[i], p.k_pos[j])) continue;
          double dot = 0.0;
          for (int d = 0; d < D; ++d) dot += q[d] * elem(p.k, p.dtype, (keyRow(p, j) * Hkv + kvh) * D + d);
          double sc = dot * scale;
          if (cap > 0.0) sc = cap * std::tanh(sc / cap);
          s[j - seg.k_begin] = sc;
          mx = std::max(mx, sc);
          seen = true;
        }
        if (!seen) continue;  // saw no key: O = 0, LSE = the sink (or -inf)
        if (sink > mx) mx = sink;
        double sum = sink == ninf ? 0.0 : std::exp(sink - mx);
        double* out = o + (size_t(i) * Hq + h) * Dv;
        for (int32_t j = seg.k_begin; j < seg.k_end; ++j) {
          if (s[j - seg.k_begin] == ninf) continue;
          const double w = std::exp(s[j - seg.k_begin] - mx);
          sum += w;
          for (int d = 0; d < Dv; ++d) out[d] += w * elem(p.v, p.dtype, (keyRow(p, j) * Hkv + kvh) * Dv + d);
        }
        for (int d = 0; d < Dv; ++d) out[d] /= sum;
        lse[size_t(i) * Hq + h] = mx + std::log(sum);
      }
    }
  }
  return attnSuccess;
}

AttnErrors compareAttention(const float* o, const float* lse, const double* ref_o,
                            const double* ref_lse, size_t rows, int head_dim) {
  AttnErrors e;
  const double ninf = -std::numeric_limits<double>::infinity();
  for (size_t r = 0; r < rows; ++r) {
    const float* a = o + r * head_dim;
    const double* b = ref_o + r * head_dim;
    bool row_nan = std::isnan(lse[r]);
    bool row_zero = true;
    double diff = 0.0, mag = 0.0;
    for (int d = 0; d < head_dim; ++d) {
      if (std::isnan(a[d])) row_nan = true;
      if (a[d] != 0.0f) row_zero = false;
      diff = std::max(diff, std::fabs(double(a[d]) - b[d]));
      mag = std::max(mag, std::fabs(b[d]));
    }
    if (row_nan) {
      ++e.nan_values;
      continue;
    }
    if (ref_lse[r] == ninf || lse[r] == -std::numeric_limits<float>::infinity()) {
      if (!(ref_lse[r] == ninf && double(lse[r]) == ninf && row_zero)) ++e.empty_mismatch;
      continue;
    }
    e.max_o_rel = std::max(e.max_o_rel, mag > 0.0 ? diff / mag : diff);
    e.max_lse_abs = std::max(e.max_lse_abs, std::fabs(double(lse[r]) - ref_lse[r]));
  }
  return e;
}

}  // namespace attn::cpu
