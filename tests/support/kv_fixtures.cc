#include "tests/support/kv_fixtures.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/reference_attention.h"
#include "tests/support/attn_fixtures.h"

namespace attn_test {

namespace {
float Hash(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return float(double(x >> 11) / double(1ULL << 53) * 2.0 - 1.0);
}
}  // namespace

size_t KvElemSize(attnDataType_t t) { return t == attnFloat32 ? 4 : 2; }

std::vector<uint8_t> KvValues(attnDataType_t t, size_t count, uint64_t seed) {
  std::vector<float> f(count);
  for (size_t i = 0; i < count; ++i) f[i] = Hash(seed * 1000003ULL + i);
  std::vector<uint8_t> out(count * KvElemSize(t));
  EXPECT_EQ(attn::cpu::convertFromFloat(out.data(), t, f.data(), count), attnSuccess);
  return out;
}

KvTokens RequestTokens(attnDataType_t t, int owner, int64_t req, int len, int base) {
  KvTokens x;
  const uint64_t seed = uint64_t(owner) * 7919 + uint64_t(req) * 104729;
  x.k = KvValues(t, size_t(len) * kKvHeads * kKvDim, seed * 2 + 1);
  x.v = KvValues(t, size_t(len) * kKvHeads * kKvDim, seed * 2 + 2);
  for (int i = 0; i < len; ++i) x.pos.push_back(base + i);
  return x;
}

attnKvPoolConfig_t PoolCfg(int blockTokens, int64_t capacity, attnDataType_t t) {
  attnKvPoolConfig_t c{};
  c.block_tokens = blockTokens;
  c.num_kv_heads = kKvHeads;
  c.head_dim = kKvDim;
  c.dtype = t;
  c.capacity_blocks = capacity;
  return c;
}

KvQueries MakeKvQueries(int rank, const std::vector<Req>& reqs, attnDataType_t t, bool causal, int hq) {
  KvQueries qs;
  qs.cfg = AttnCfg(hq, kKvHeads, kKvDim, t, causal);
  qs.offs = {0};
  for (const Req& r : reqs) {
    qs.ids.push_back(r.id);
    qs.offs.push_back(qs.offs.back() + r.qRows);
    for (int i = 0; i < r.qRows; ++i) qs.qpos.push_back(r.len - r.qRows + i);
  }
  qs.rows = qs.offs.back();
  qs.q = KvValues(t, size_t(qs.rows) * hq * kKvDim, 99 + uint64_t(rank) * 31);
  return qs;
}

AttnCheck CompareKvAttention(const KvQueries& qs, int rank, const std::vector<Req>& reqs, attnDataType_t t,
                             bool causal, const uint8_t* out, const float* lse) {
  AttnCheck c;
  const int hq = qs.cfg.num_q_heads;
  const size_t rowElems = size_t(hq) * kKvDim;
  std::vector<float> of(size_t(qs.rows) * rowElems);
  EXPECT_EQ(attn::cpu::convertToFloat(of.data(), out, t, of.size()), attnSuccess);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Req& r = reqs[i];
    KvTokens x = RequestTokens(t, rank, r.id, r.len);
    attn::cpu::AttnProblem p;
    p.q = qs.q.data() + size_t(qs.offs[i]) * rowElems * KvElemSize(t);
    p.k = x.k.data();
    p.v = x.v.data();
    p.dtype = t;
    p.nq = r.qRows;
    p.nk = r.len;
    p.num_q_heads = hq;
    p.num_kv_heads = kKvHeads;
    p.head_dim = kKvDim;
    p.causal = causal;
    p.window_left = qs.cfg.window_left;
    p.window_right = qs.cfg.window_right;
    p.softcap = qs.cfg.softcap;
    p.q_pos = qs.qpos.data() + qs.offs[i];
    p.k_pos = x.pos.data();
    std::vector<double> ro(size_t(r.qRows) * rowElems), rl(size_t(r.qRows) * hq);
    EXPECT_EQ(attn::cpu::referenceAttention(p, ro.data(), rl.data()), attnSuccess);
    attn::cpu::AttnErrors e = attn::cpu::compareAttention(
        of.data() + size_t(qs.offs[i]) * rowElems, lse + size_t(qs.offs[i]) * hq, ro.data(), rl.data(),
        size_t(r.qRows) * hq, kKvDim);
    c.maxORel = std::max(c.maxORel, e.max_o_rel);
    c.maxLse = std::max(c.maxLse, e.max_lse_abs);
    c.nans += e.nan_values;
    c.emptyMismatch += e.empty_mismatch;
  }
  return c;
}

void ExpectExact(const AttnCheck& c, attnDataType_t t, const std::string& what) {
  ASSERT_EQ(c.rc, attnSuccess) << what << ": " << c.error;
  EXPECT_LE(c.maxORel, OutBound(t)) << what;
  EXPECT_LE(c.maxLse, LseBound(t)) << what;
  EXPECT_EQ(c.nans, 0) << what;
  EXPECT_EQ(c.emptyMismatch, 0) << what;
}

}  // namespace attn_test
