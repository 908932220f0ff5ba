// Level-attention fixtures (level_fixtures.h).
#include "tests/support/level_fixtures.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "kernels/cpu/reference_attention.h"

namespace attn_test {

Placement ContiguousPlacement(const AttnCase& c, int nranks, int empty_rank) {
  Placement pl;
  pl.nranks = nranks;
  pl.q_rows.resize(nranks);
  pl.kv_rows.resize(nranks);
  std::vector<int> holders;
  for (int r = 0; r < nranks; ++r)
    if (r != empty_rank) holders.push_back(r);
  const int h = static_cast<int>(holders.size());
  for (int s = 0; s < c.num_seqs; ++s) {
    const int64_t q0 = c.q_off[s], qn = c.q_off[s + 1] - q0;
    const int64_t k0 = c.kv_off[s], kn = c.kv_off[s + 1] - k0;
    const int64_t qChunk = (qn + h - 1) / h, kChunk = (kn + h - 1) / h;
    for (int i = 0; i < h; ++i) {
      for (int64_t j = i * qChunk; j < std::min(qn, (i + 1) * qChunk); ++j) pl.q_rows[holders[i]].push_back(q0 + j);
      for (int64_t j = i * kChunk; j < std::min(kn, (i + 1) * kChunk); ++j) pl.kv_rows[holders[i]].push_back(k0 + j);
    }
  }
  return pl;
}

std::shared_ptr<const AttnCase> PrefillCase(const std::string& name, const attnAttnConfig_t& cfg,
                                            const std::vector<int32_t>& lens, uint64_t seed) {
  return std::make_shared<AttnCase>(MakeCase(name, PrefillSpec(cfg, lens, {}), seed));
}

std::vector<float> RandomImportance(const AttnCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> imp(c.kv_rows());
  for (float& x : imp) x = u(rng);
  return imp;
}

int64_t ExpectedKept(int64_t n, float keep) {
  if (n == 0 || keep <= 0) return 0;
  if (keep >= 1) return n;
  return std::clamp<int64_t>(static_cast<int64_t>(std::floor(double(keep) * n + 0.5)), 1, n);
}

std::vector<int64_t> KeptFrom(const AttnCase& c, const Placement& pl, int peer, float keep,
                              const std::vector<float>& imp) {
  std::vector<int64_t> out;
  for (int s = 0; s < c.num_seqs; ++s) {
    std::vector<int> local;  // indices into pl.kv_rows[peer] of sequence s
    for (size_t i = 0; i < pl.kv_rows[peer].size(); ++i)
      if (c.kv_seq[pl.kv_rows[peer][i]] == s) local.push_back(static_cast<int>(i));
    std::stable_sort(local.begin(), local.end(), [&](int a, int b) {
      return imp[pl.kv_rows[peer][a]] > imp[pl.kv_rows[peer][b]];
    });
    local.resize(ExpectedKept(static_cast<int64_t>(local.size()), keep));
    for (int i : local) out.push_back(pl.kv_rows[peer][i]);
  }
  return out;
}

AttnCase ReferenceOverKeptKeys(const AttnCase& c, const Placement& pl, int rank, const float keep[4],
                               const std::vector<float>& imp,
                               const std::function<int(int, int)>& tierOf) {
  std::vector<int64_t> keys(pl.kv_rows[rank].begin(), pl.kv_rows[rank].end());
  for (int p = 0; p < pl.nranks; ++p) {
    if (p == rank) continue;
    std::vector<int64_t> kept = KeptFrom(c, pl, p, keep[tierOf(rank, p)], imp);
    keys.insert(keys.end(), kept.begin(), kept.end());
  }
  std::sort(keys.begin(), keys.end());  // global rows are grouped by sequence
  AttnCase r = c;
  const size_t kRow = AttnElemSize(c.cfg.dtype) * c.cfg.num_kv_heads * c.cfg.head_dim;
  const size_t vRow = AttnElemSize(c.cfg.dtype) * c.cfg.num_kv_heads * ValueDim(c.cfg);
  r.kv_pos.clear();
  r.kv_seq.clear();
  r.k.clear();
  r.v.clear();
  r.kv_off.assign(c.num_seqs + 1, 0);
  for (int64_t g : keys) {
    r.kv_pos.push_back(c.kv_pos[g]);
    r.kv_seq.push_back(c.kv_seq[g]);
    ++r.kv_off[c.kv_seq[g] + 1];
    r.k.insert(r.k.end(), c.k.begin() + g * kRow, c.k.begin() + (g + 1) * kRow);
    r.v.insert(r.v.end(), c.v.begin() + g * vRow, c.v.begin() + (g + 1) * vRow);
  }
  for (int s = 0; s < c.num_seqs; ++s) r.kv_off[s + 1] += r.kv_off[s];
  std::vector<attn::cpu::AttnSegment> segs;
  attn::cpu::AttnProblem p = ProblemFor(r, r.num_seqs, r.cfg, &segs);
  r.ref_o.assign(r.q_pos.size() * r.cfg.num_q_heads * ValueDim(r.cfg), 0.0);
  r.ref_lse.assign(r.q_pos.size() * r.cfg.num_q_heads, -std::numeric_limits<double>::infinity());
  EXPECT_EQ(attn::cpu::referenceAttention(p, r.ref_o.data(), r.ref_lse.data()), attnSuccess);
  return r;
}

}  // namespace attn_test
