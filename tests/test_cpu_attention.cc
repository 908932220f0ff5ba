// CPU attention kernels (kernels/cpu/attention.h, merge.h, pack.h) against
// the double-precision reference, on every instruction set the CPU has.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_task.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/merge.h"
#include "kernels/cpu/pack.h"
#include "kernels/cpu/reference_attention.h"
#include "kernels/cpu/worker_pool.h"
#include "src/core/datatype.h"

namespace attn::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::vector<Isa> supportedIsas() {
  std::vector<Isa> v{Isa::kGeneric};
  if (detectedIsa() >= Isa::kAvx2) v.push_back(Isa::kAvx2);
  if (detectedIsa() >= Isa::kAvx512) v.push_back(Isa::kAvx512);
  if (detectedIsa() >= Isa::kAvx512Bf16) v.push_back(Isa::kAvx512Bf16);
  return v;
}

struct IsaGuard {
  explicit IsaGuard(Isa isa) { forceIsa(isa); }
  ~IsaGuard() { forceIsa(detectedIsa()); }
};

// A tensor stored in `dtype`, filled from random floats rounded to it.
struct Tensor {
  attnDataType_t dtype;
  std::vector<char> bytes;
  Tensor(attnDataType_t t, size_t n, std::mt19937& rng, float lo, float hi) : dtype(t) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> f(n);
    for (auto& x : f) x = u(rng);
    bytes.resize(n * dataTypeSize(t) + 1);
    EXPECT_EQ(convertFromFloat(bytes.data(), t, f.data(), n), attnSuccess);
  }
  void setRowNan(size_t row, size_t row_elems) {  // garbage that must never be read
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> f(row_elems, nan);
    EXPECT_EQ(convertFromFloat(bytes.data() + row * row_elems * dataTypeSize(dtype), dtype,
                               f.data(), row_elems),
              attnSuccess);
  }
  const void* data() const { return bytes.data(); }
};

struct Case {
  int nq = 0, nk = 0, hq = 1, hkv = 1, d = 64;
  int dv = 0;  // V's and O's head dim (AttnProblem::head_dim_v); 0: d
  attnDataType_t dtype = attnFloat32;
  bool causal = false;
  int32_t wl = -1, wr = -1;  // sliding window (AttnProblem::window_left / right)
  float softcap = 0.0f;
  std::vector<AttnSegment> segs;  // empty: one segment over everything
  std::vector<int32_t> qpos, kpos;
};

struct Inputs {
  Tensor q, k, v;
  AttnProblem p;
  Inputs(const Case& c, uint32_t seed)
      : q(c.dtype, size_t(c.nq) * c.hq * c.d, rng(seed), -1.0f, 1.0f),
        k(c.dtype, size_t(c.nk) * c.hkv * c.d, rng(seed + 1), -1.0f, 1.0f),
        v(c.dtype, size_t(c.nk) * c.hkv * (c.dv > 0 ? c.dv : c.d), rng(seed + 2), -1.0f, 1.0f) {
    // Scores of a few units (not a near-uniform softmax) make errors visible.
    p.q = q.data();
    p.k = k.data();
    p.v = v.data();
    p.dtype = c.dtype;
    p.nq = c.nq;
    p.nk = c.nk;
    p.num_q_heads = c.hq;
    p.num_kv_heads = c.hkv;
    p.head_dim = c.d;
    p.head_dim_v = c.dv;
    p.scale = 4.0f / std::sqrt(float(c.d));
    p.causal = c.causal;
    p.window_left = c.wl;
    p.window_right = c.wr;
    p.softcap = c.softcap;
    p.q_pos = c.qpos.empty() ? nullptr : c.qpos.data();
    p.k_pos = c.kpos.empty() ? nullptr : c.kpos.data();
    p.segments = c.segs.empty() ? nullptr : c.segs.data();
    p.num_segments = int32_t(c.segs.size());
  }
  static std::mt19937& rng(uint32_t seed) {
    static thread_local std::mt19937 r;
    r.seed(seed);
    return r;
  }
};

struct Result {
  std::vector<float> o, lse;
  Result(const AttnProblem& p, float fill = std::numeric_limits<float>::quiet_NaN())
      : o(size_t(p.nq) * p.num_q_heads * valueDim(p), fill), lse(size_t(p.nq) * p.num_q_heads, fill) {}
};

struct Reference {
  std::vector<double> o, lse;
  explicit Reference(const AttnProblem& p)
      : o(size_t(p.nq) * p.num_q_heads * valueDim(p)), lse(size_t(p.nq) * p.num_q_heads) {
    EXPECT_EQ(referenceAttention(p, o.data(), lse.data()), attnSuccess);
  }
};

// tol bounds O's relative error and the LSE's absolute one; oTol, when
// given, O's instead.
void expectClose(const AttnProblem& p, const Result& r, const Reference& ref, double tol,
                 const std::string& what, double oTol = 0) {
  const AttnErrors e = compareAttention(r.o.data(), r.lse.data(), ref.o.data(), ref.lse.data(),
                                        size_t(p.nq) * p.num_q_heads, valueDim(p));
  EXPECT_EQ(e.nan_values, 0) << what;
  EXPECT_EQ(e.empty_mismatch, 0) << what;
  EXPECT_LE(e.max_o_rel, oTol > 0 ? oTol : tol) << what;
  EXPECT_LE(e.max_lse_abs, tol) << what;
}

// An accumulation over blocks against the one call over all of them: the
// same LSE (rows that see no key stay empty) and O within twice oTol.
void expectMatchesOneCall(const Result& acc, const Result& one, int dv, double oTol, const std::string& what) {
  for (size_t i = 0; i < one.lse.size(); ++i) {
    if (one.lse[i] == kNegInf) {
      EXPECT_EQ(acc.lse[i], kNegInf) << what;
      continue;
    }
    EXPECT_NEAR(acc.lse[i], one.lse[i], 1e-5) << what;
    for (int d = 0; d < dv; ++d) EXPECT_NEAR(acc.o[i * dv + d], one.o[i * dv + d], 2 * oTol) << what;
  }
}

// The same keys paged (k_rows into a pool) and gathered give the same bits,
// at 1 and 3 threads, and match the reference within oTol.
void expectPagedEqualsGathered(const AttnProblem& gathered, const AttnProblem& paged, const std::string& what0,
                               double oTol) {
  const Reference ref(paged);
  for (int threads : {1, 3}) {
    const std::string what = what0 + ", threads " + std::to_string(threads);
    Result want(gathered), got(paged);
    ASSERT_EQ(attentionPartial(gathered, want.o.data(), want.lse.data(), {threads}), attnSuccess) << what;
    ASSERT_EQ(attentionPartial(paged, got.o.data(), got.lse.data(), {threads}), attnSuccess) << what;
    EXPECT_EQ(std::memcmp(want.o.data(), got.o.data(), want.o.size() * sizeof(float)), 0) << what;
    EXPECT_EQ(std::memcmp(want.lse.data(), got.lse.data(), want.lse.size() * sizeof(float)), 0) << what;
    expectClose(paged, got, ref, 1e-5, what, oTol);
  }
}

// O's relative error bound for decode-shaped bf16 on an ISA that multiplies
// P·V in bf16: P is rounded to bf16 (unit roundoff 2^-8 per weight), so
// twice that; else fp32 arithmetic on exact inputs.
double decodeOTolerance(attnDataType_t dt, Isa isa) {
  return dt == attnBfloat16 && isa >= Isa::kAvx512Bf16 ? 8e-3 : 1e-5;
}

// Sequential positions 0.. for both sides of one sequence (self-attention).
Case selfAttention(int t, int hq, int hkv, int d, bool causal, attnDataType_t dt) {
  Case c;
  c.nq = c.nk = t;
  c.hq = hq;
  c.hkv = hkv;
  c.d = d;
  c.causal = causal;
  c.dtype = dt;
  for (int i = 0; i < t; ++i) {
    c.qpos.push_back(i);
    c.kpos.push_back(i);
  }
  return c;
}

std::string describe(const Case& c, Isa isa) {
  return std::string(isaName(isa)) + " " + dataTypeName(c.dtype) + " nq=" + std::to_string(c.nq) +
         " nk=" + std::to_string(c.nk) + " hq=" + std::to_string(c.hq) + " hkv=" +
         std::to_string(c.hkv) + " d=" + std::to_string(c.d) +
         (c.dv > 0 ? " dv=" + std::to_string(c.dv) : "") + (c.causal ? " causal" : "") +
         (c.wl >= 0 || c.wr >= 0 ? " window(" + std::to_string(c.wl) + "," + std::to_string(c.wr) + ")" : "") +
         (c.softcap > 0 ? " softcap " + std::to_string(c.softcap) : "");
}

TEST(CpuAttention, MatchesReferenceAcrossGqaHeadDimAndMask) {
  struct Shape { int t, hq, hkv, d; };
  const Shape shapes[] = {{37, 2, 2, 64},   {70, 4, 1, 128}, {45, 8, 1, 80},
                          {29, 16, 1, 256}, {66, 8, 2, 72},  {131, 4, 4, 33},
                          {1, 8, 1, 128},   {5, 3, 1, 7}};
  for (Isa isa : supportedIsas()) {
    IsaGuard guard(isa);
    for (const auto& s : shapes) {
      for (bool causal : {false, true}) {
        const Case c = selfAttention(s.t, s.hq, s.hkv, s.d, causal, attnFloat32);
        Inputs in(c, uint32_t(s.t * 31 + s.d));
        Result r(in.p);
        ASSERT_EQ(attentionPartial(in.p, r.o.data(), r.lse.data()), attnSuccess);
        expectClose(in.p, r, Reference(in.p), 1e-5, describe(c, isa));
      }
    }
  }
}

TEST(CpuAttention, HalfInputsAndHalfOutput) {
  for (Isa isa : supportedIsas()) {
    IsaGuard guard(isa);
    for (attnDataType_t dt : {attnFloat16, attnBfloat16}) {
      for (int d : {64, 80, 128}) {
        const Case c = selfAttention(77, 8, 2, d, true, dt);
        Inputs in(c, 5);
        Result r(in.p);
        ASSERT_EQ(attentionPartial(in.p, r.o.data(), r.lse.data()), attnSuccess);
        const Reference ref(in.p);  // reads the same rounded inputs
        expectClose(in.p, r, ref, 1e-5, describe(c, isa) + " fp32 out");
        // Written back in the model's dtype: only the output rounding remains.
        std::vector<uint16_t> narrow(r.o.size());
        ASSERT_EQ(convertFromFloat(narrow.data(), dt, r.o.data(), r.o.size()), attnSuccess);
        ASSERT_EQ(convertToFloat(r.o.data(), narrow.data(), dt, r.o.size()), attnSuccess);
        expectClose(in.p, r, ref, 1e-2, describe(c, isa) + " dtype out");
      }
    }
  }
}

// A causal case with these heads and no rows yet.
Case emptyCausal(int hq, int hkv, int d, attnDataType_t dt) {
  Case c;
  c.hq = hq;
  c.hkv = hkv;
  c.d = d;
  c.dtype = dt;
  c.causal = true;
  return c;
}

// Two sequences sharded like CP rank 1 of 3 (chunks 1 and 4 of 6), a third
// with no query rows and a fourth with no keys; rows of chunk 1 against keys
// of later chunks see nothing.
Case variableLength(int hq, int hkv, int d, attnDataType_t dt) {
  Case c = emptyCausal(hq, hkv, d, dt);
  auto addSeq = [&](int len, bool with_q, bool with_k, int key_chunk_lo) {
    const int chunk = len / 6;
    AttnSegment s{c.nq, c.nq, c.nk, c.nk};
    if (with_q)
      for (int ch : {1, 4})
        for (int i = ch * chunk; i < (ch + 1) * chunk; ++i) c.qpos.push_back(i), ++c.nq;
    if (with_k)
      for (int ch : {key_chunk_lo, 5 - key_chunk_lo})
        for (int i = ch * chunk; i < (ch + 1) * chunk; ++i) c.kpos.push_back(i), ++c.nk;
    s.q_end = c.nq;
    s.k_end = c.nk;
    c.segs.push_back(s);
  };
  addSeq(6 * 23, true, true, 2);   // keys of chunks 2 and 3: chunk-1 rows see none
  addSeq(6 * 70, true, true, 0);   // keys of chunks 0 and 5
  addSeq(6 * 9, false, true, 1);   // no queries
  addSeq(6 * 11, true, false, 0);  // no keys: all -inf
  return c;
}

TEST(CpuAttention, VariableLengthShardedBatch) {
  for (Isa isa : supportedIsas()) {
    IsaGuard guard(isa);
    for (attnDataType_t dt : {attnFloat32, attnBfloat16}) {
      const Case c = variableLength(8, 2, 64, dt);
      Inputs in(c, 11);
      Result r(in.p);  // NaN-filled: every row must be written
      ASSERT_EQ(attentionPartial(in.p, r.o.data(), r.lse.data()), attnSuccess);
      const Reference ref(in.p);
      expectClose(in.p, r, ref, 1e-5, describe(c, isa));
      int empty = 0;
      for (double l : ref.lse) empty += l == -std::numeric_limits<double>::infinity();
      EXPECT_GT(empty, 0);  // the case does exercise fully masked rows
    }
  }
}

TEST(CpuAttention, FullyMaskedRowsAreZeroAndMinusInf) {
  Case c = selfAttention(40, 4, 2, 64, true, attnFloat32);
  for (auto& p : c.qpos) p -= 1000;  // every key is in every query's future
  Inputs in(c, 3);
  Result r(in.p);
  AttnStats st;
  ASSERT_EQ(attentionPartial(in.p, r.o.data(), r.lse.data(), {1, nullptr, &st}), attnSuccess);
  for (float x : r.o) ASSERT_EQ(x, 0.0f);
  for (float l : r.lse) ASSERT_EQ(l, kNegInf);
  EXPECT_EQ(st.tiles_full + st.tiles_masked, 0);
  EXPECT_GT(st.tiles_skipped, 0);
}

// Tiles whose keys are all in the future are skipped: their K/V hold NaN and
// nothing leaks; the tile counts match the tiling.
TEST(CpuAttention, SkipsFullyMaskedTiles) {
  for (Isa isa : supportedIsas()) {
    IsaGuard guard(isa);
    const int T = 256, rows = kernelsFor(activeIsa()).attn_tile_rows;
    Case c = selfAttention(T, 4, 4, 64, true, attnFloat32);
    c.qpos.resize(T / 2);  // queries: the first half; keys: all
    c.nq = T / 2;
    Inputs in(c, 9);
    for (int j = T / 2 + kAttnKeyTile - (T / 2) % kAttnKeyTile; j < T; ++j) {
      in.k.setRowNan(size_t(j), size_t(c.hkv) * c.d);
      in.v.setRowNan(size_t(j), size_t(c.hkv) * c.d);
    }
    Result r(in.p);
    AttnStats st;
    ASSERT_EQ(attentionPartial(in.p, r.o.data(), r.lse.data(), {1, nullptr, &st}), attnSuccess);
    expectClose(in.p, r, Reference(in.p), 1e-5, describe(c, isa));
    // Expected classification of every (query tile, key tile) pair.
    AttnStats want;
    for (int h = 0; h < c.hkv; ++h)
      for (int m0 = 0; m0 < c.nq; m0 += rows)
        for (int k0 = 0; k0 < T; k0 += kAttnKeyTile) {
          const int qmin = m0, qmax = std::min(c.nq, m0 + rows) - 1;
          const int kmin = k0, kmax = std::min(T, k0 + kAttnKeyTile) - 1;
          if (kmin > qmax) ++want.tiles_skipped;
          else if (kmax > qmin) ++want.tiles_masked;
          else ++want.tiles_full;
        }
    EXPECT_EQ(st.tiles_skipped, want.tiles_skipped) << isaName(isa);
    EXPECT_EQ(st.tiles_masked, want.tiles_masked) << isaName(isa);
    EXPECT_EQ(st.tiles_full, want.tiles_full) << isaName(isa);
    EXPECT_GT(want.tiles_skipped, 0);
  }
}

// Splits every segment's keys into `parts` contiguous pieces.
std::vector<std::vector<AttnSegment>> keyPartition(const Case& c, int parts, std::mt19937& rng) {
  std::vector<AttnSegment> segs = c.segs;
  if (segs.empty()) segs.push_back({0, c.nq, 0, c.nk});
  std::vector<std::vector<AttnSegment>> out(static_cast<size_t>(parts));
  for (const auto& s : segs) {
    std::vector<int32_t> cuts{s.k_begin, s.k_end};
    for (int i = 1; i < parts; ++i)
      cuts.push_back(s.k_begin + int32_t(rng() % uint32_t(s.k_end - s.k_begin + 1)));
    std::sort(cuts.begin(), cuts.end());
    for (int i = 0; i < parts; ++i) out[size_t(i)].push_back({s.q_begin, s.q_end, cuts[i], cuts[i + 1]});
  }
  return out;
}

// A batch of decode steps: each sequence has a few query rows at its end
// and all its keys. Few rows per kv head put several kv heads in one task
// and (head_dim a multiple of the vector) score by dot products; fp32 keys
// are read in place. Covers group sizes around the dot-product cut-off,
// kv head counts that do not divide into the tasks, and thread counts.
Case decodeBatch(int rows, int hq, int hkv, int d, attnDataType_t dt) {
  Case c = emptyCausal(hq, hkv, d, dt);
  for (int len : {300, 1, 129, 64}) {
    const int q = std::min(rows, len);
    AttnSegment s{c.nq, c.nq + q, c.nk, c.nk + len};
    for (int i = len - q; i < len; ++i) c.qpos.push_back(i), ++c.nq;
    for (int i = 0; i < len; ++i) c.kpos.push_back(i), ++c.nk;
    c.segs.push_back(s);
  }
  return c;
}

TEST(CpuAttention, DecodeBatchesMatchReference) {
  struct Shape { int rows, hq, hkv, d; };
  const Shape shapes[] = {{1, 32, 8, 128}, {1, 8, 1, 64},  {2, 12, 3, 64}, {3, 10, 2, 128},
                          {1, 16, 1, 128}, {1, 24, 3, 80}, {4, 7, 7, 64},  {1, 64, 8, 32}};
  for (Isa isa : supportedIsas()) {
    IsaGuard guard(isa);
    for (const auto& s : shapes)
      for (attnDataType_t dt : {attnFloat32, attnBfloat16}) {
        const Case c = decodeBatch(s.rows, s.hq, s.hkv, s.d, dt);
        Inputs in(c, uint32_t(s.hq * 7 + s.d));
        const Reference ref(in.p);
        for (int threads : {1, 2, 3}) {
          Result r(in.p);
          ASSERT_EQ(attentionPartial(in.p, r.o.data(), r.lse.data(), {threads}), attnSuccess);
          expectClose(in.p, r, ref, 1e-5, describe(c, isa) + " threads " + std::to_string(threads),
                      decodeOTolerance(dt, isa));
        }
        // The same keys folded in two calls (ring attention's accumulate).
        std::mt19937 rng(5);
        const auto split = keyPartition(c, 2, rng);
        Result acc(in.p);
        initAccumulator(acc.o.data(), acc.lse.data(), c.nq, c.hq, c.d);
        AttnProblem p = in.p;
        for (const auto& segs : split) {
          p.segments = segs.data();
          p.num_segments = int32_t(segs.size());
          ASSERT_EQ(attentionAccumulate(p, acc.o.data(), acc.lse.data(), {2}), attnSuccess);
        }
        expectClose(in.p, acc, ref, 1e-5, describe(c, isa) + " accumulate", decodeOTolerance(dt, isa));
      }
  }
}

// Split-K: a decode step with fewer tasks than threads (one kv head) cuts
// every segment's keys into chunks computed apart and merged. Query rows at
// the end, in the middle and near the start of a long sequence (later
// chunks are fully masked for them), a second sequence shorter than a chunk
// (its later chunks are empty), partial and accumulate (over a first call's
// keys), fp32 and bf16, 2 to 4 threads, every ISA, against the reference.
TEST(CpuAttention, SplitKeysDecodeMatchesReference) {
  for (Isa isa : supportedIsas()) {
    IsaGuard guard(isa);
    for (attnDataType_t dt : {attnFloat32, attnBfloat16})
      for (int seqs : {1, 2}) {
        Case c = emptyCausal(8, 1, 64, dt);
        const std::vector<std::vector<int32_t>> rows = {{2999, 1200, 3}, {99}};
        const int32_t lens[] = {3000, 100};
        for (int i = 0; i < seqs; ++i) {
          c.segs.push_back({c.nq, c.nq + int32_t(rows[size_t(i)].size()), c.nk, c.nk + lens[i]});
          for (int32_t q : rows[size_t(i)]) c.qpos.push_back(q), ++c.nq;
          for (int32_t k = 0; k < lens[i]; ++k) c.kpos.push_back(k), ++c.nk;
        }
        Inputs in(c, uint32_t(31 + seqs));
        const Reference ref(in.p);
        for (int threads : {2, 3, 4}) {
          const std::string what = describe(c, isa) + " threads " + std::to_string(threads);
          Result r(in.p);
          ASSERT_EQ(attentionPartial(in.p, r.o.data(), r.lse.data(), {threads}), attnSuccess);
          expectClose(in.p, r, ref, 1e-5, what, decodeOTolerance(dt, isa));
          // The first 700 keys of the first sequence in one call, the rest
          // folded in by a second.
          std::vector<AttnSegment> first = c.segs, rest = c.segs;
          first[0].k_end = first[0].k_begin + 700;
          rest[0].k_begin = first[0].k_end;
          for (size_t i = 1; i < first.size(); ++i) first[i].k_end = first[i].k_begin;
          AttnProblem p = in.p;
          Result acc(in.p);
          p.segments = first.data();
          p.num_segments = int32_t(first.size());
          ASSERT_EQ(attentionPartial(p, acc.o.data(), acc.lse.data(), {threads}), attnSuccess);
          p.segments = rest.data();
          ASSERT_EQ(attentionAccumulate(p, acc.o.data(), acc.lse.data(), {threads}), attnSuccess);
          expectClose(in.p, acc, ref, 1e-5, what + " accumulate", decodeOTolerance(dt, isa));
        }
      }
  }
}

// Paged K/V (AttnProblem::k_rows): the keys' rows scattered over a larger
// "pool" in shuffled blocks of 16, every other pool row NaN (never to be
// read). The result must be bit for bit that of the same keys gathered
// into contiguous tensors, and match the reference: decode batches (the
// in-place fp32 and the converting paths, split-K at 2-3 threads), a
// causal prefill whose keys are packed once per call, and head_dim 80.
TEST(CpuAttention, PagedKeysGiveTheBitsOfTheGatheredKeys) {
  struct Shape { int rows, hq, hkv, d; bool prefill; };
  const Shape shapes[] = {{1, 32, 8, 128, false}, {2, 8, 1, 64, false}, {1, 24, 3, 80, false},
                          {0, 4, 1, 128, true}};
  for (Isa isa : supportedIsas()) {
    IsaGuard guard(isa);
    for (const auto& s : shapes)
      for (attnDataType_t dt : {attnFloat32, attnBfloat16}) {
        const Case c = s.prefill ? selfAttention(150, s.hq, s.hkv, s.d, true, dt)
                                 : decodeBatch(s.rows, s.hq, s.hkv, s.d, dt);
        Inputs in(c, uint32_t(s.hq * 5 + s.d));
        // Key j goes to pool row rows[j]: blocks of 16 in a shuffled order,
        // one pool block in two left unused.
        const int block = 16, blocks = (c.nk + block - 1) / block;
        std::vector<int> order(size_t(2 * blocks));
        for (size_t b = 0; b < order.size(); ++b) order[b] = int(b);
        std::mt19937 rng(uint32_t(s.d + s.hq));
        std::shuffle(order.begin(), order.end(), rng);
        std::vector<int64_t> rows(size_t(c.nk));
        for (int j = 0; j < c.nk; ++j) rows[size_t(j)] = int64_t(order[size_t(j / block)]) * block + j % block;
        const size_t poolRows = order.size() * block, rowElems = size_t(c.hkv) * c.d;
        Tensor pk(dt, poolRows * rowElems, rng, -1.0f, 1.0f), pv(dt, poolRows * rowElems, rng, -1.0f, 1.0f);
        std::vector<bool> used(poolRows, false);
        const size_t rowBytes = rowElems * dataTypeSize(dt);
        for (int j = 0; j < c.nk; ++j) {
          const size_t r = size_t(rows[size_t(j)]);
          used[r] = true;
          std::memcpy(pk.bytes.data() + r * rowBytes, static_cast<const char*>(in.k.data()) + size_t(j) * rowBytes,
                      rowBytes);
          std::memcpy(pv.bytes.data() + r * rowBytes, static_cast<const char*>(in.v.data()) + size_t(j) * rowBytes,
                      rowBytes);
        }
        for (size_t r = 0; r < poolRows; ++r)
          if (!used[r]) pk.setRowNan(r, rowElems), pv.setRowNan(r, rowElems);
        AttnProblem paged = in.p;
        paged.k = pk.data();
        paged.v = pv.data();
        paged.k_rows = rows.data();
        const Reference ref(paged);
        for (int threads : {1, 2, 3}) {
          const std::string what = describe(c, isa) + " threads " + std::to_string(threads);
          Result want(in.p), got(paged);
          ASSERT_EQ(attentionPartial(in.p, want.o.data(), want.lse.data(), {threads}), attnSuccess);
          ASSERT_EQ(attentionPartial(paged, got.o.data(), got.lse.data(), {threads}), attnSuccess) << what;
          EXPECT_EQ(std::memcmp(want.o.data(), got.o.data(), want.o.size() * sizeof(float)), 0) << what;
          EXPECT_EQ(std::memcmp(want.lse.data(), got.lse.data(), want.lse.size() * sizeof(float)), 0) << what;
          expectClose(paged, got, ref, 1e-5, what + " vs reference", s.prefill ? 1e-5 : decodeOTolerance(dt, isa));
        }
      }
  }
}

TEST(CpuAttention, PartialsOverAKeyPartitionMergeToTheFullResult) {
  std::mt19937 rng(17);
  for (Isa isa : supportedIsas()) {
    IsaGuard guard(isa);
    const Case c = variableLength(8, 1, 128, attnFloat32);
    Inputs in(c, 21);
    const Reference ref(in.p);
    for (int parts : {1, 2, 5}) {
      const auto split = keyPartition(c, parts, rng);
      std::vector<Result> partial;
      AttnProblem p = in.p;
      for (const auto& segs : split) {
        p.segments = segs.data();
        p.num_segments = int32_t(segs.size());
        partial.emplace_back(p);
        ASSERT_EQ(attentionPartial(p, partial.back().o.data(), partial.back().lse.data()), attnSuccess);
      }
      const size_t rows = size_t(c.nq) * c.hq;
      // N-way merge in place into the first partial.
      Result merged = partial[0];
      std::vector<AttnPartialRef> refs;
      for (int j = 1; j < parts; ++j)
        refs.push_back({partial[size_t(j)].o.data(), attnFloat32, partial[size_t(j)].lse.data()});
      ASSERT_EQ(mergePartials(merged.o.data(), merged.lse.data(), refs.data(), int(refs.size()),
                              rows, c.d),
                attnSuccess);
      expectClose(in.p, merged, ref, 1e-5, describe(c, isa) + " merge " + std::to_string(parts));
      // Merge-on-receive: fold one at a time into an empty accumulator,
      // partial O arriving in bf16.
      Result folded(in.p);
      initAccumulator(folded.o.data(), folded.lse.data(), c.nq, c.hq, c.d);
      for (const auto& part : partial) {
        std::vector<uint16_t> wire(part.o.size());
        ASSERT_EQ(convertFromFloat(wire.data(), attnBfloat16, part.o.data(), wire.size()), attnSuccess);
        ASSERT_EQ(foldPartial(folded.o.data(), folded.lse.data(),
                              {wire.data(), attnBfloat16, part.lse.data()}, rows, c.d),
                  attnSuccess);
      }
      expectClose(in.p, folded, ref, 1e-2, describe(c, isa) + " fold bf16");
      // Online: accumulate each key part straight into the accumulator.
      Result acc(in.p);
      initAccumulator(acc.o.data(), acc.lse.data(), c.nq, c.hq, c.d);
      for (const auto& segs : split) {
        p.segments = segs.data();
        p.num_segments = int32_t(segs.size());
        ASSERT_EQ(attentionAccumulate(p, acc.o.data(), acc.lse.data()), attnSuccess);
      }
      expectClose(in.p, acc, ref, 1e-5, describe(c, isa) + " accumulate " + std::to_string(parts));
    }
  }
}

TEST(CpuAttention, AccumulateLeavesUnreachedRowsBitExact) {
  Case c = selfAttention(64, 2, 1, 64, true, attnFloat32);
  Inputs in(c, 4);
  Result acc(in.p);
  ASSERT_EQ(attentionPartial(in.p, acc.o.data(), acc.lse.data()), attnSuccess);
  const Result before = acc;
  // Keys from the far future: nobody sees them.
  std::vector<int32_t> future(c.kpos.size());
  for (size_t i = 0; i < future.size(); ++i) future[i] = 100000 + int32_t(i);
  AttnProblem p = in.p;
  p.k_pos = future.data();
  ASSERT_EQ(attentionAccumulate(p, acc.o.data(), acc.lse.data()), attnSuccess);
  EXPECT_EQ(std::memcmp(acc.o.data(), before.o.data(), acc.o.size() * 4), 0);
  EXPECT_EQ(std::memcmp(acc.lse.data(), before.lse.data(), acc.lse.size() * 4), 0);
  // Keys every query sees only partly (tile masked, rows reached): changes.
  for (size_t i = 0; i < future.size(); ++i) future[i] = 32 + int32_t(i);
  ASSERT_EQ(attentionAccumulate(p, acc.o.data(), acc.lse.data()), attnSuccess);
  EXPECT_EQ(std::memcmp(acc.o.data(), before.o.data(), 32 * 2 * 64 * 4), 0);  // rows < 32
  EXPECT_NE(std::memcmp(acc.lse.data(), before.lse.data(), acc.lse.size() * 4), 0);
}

TEST(CpuAttention, ThreadsAndPoolGiveIdenticalBits) {
  const Case c = variableLength(16, 4, 64, attnFloat16);
  Inputs in(c, 8);
  Result one(in.p), two(in.p), pooled(in.p);
  ASSERT_EQ(attentionPartial(in.p, one.o.data(), one.lse.data(), {1}), attnSuccess);
  ASSERT_EQ(attentionPartial(in.p, two.o.data(), two.lse.data(), {2}), attnSuccess);
  WorkerPool pool(3);
  for (int rep = 0; rep < 3; ++rep)
    ASSERT_EQ(attentionPartial(in.p, pooled.o.data(), pooled.lse.data(), {3, &pool}), attnSuccess);
  EXPECT_EQ(std::memcmp(one.o.data(), two.o.data(), one.o.size() * 4), 0);
  EXPECT_EQ(std::memcmp(one.o.data(), pooled.o.data(), one.o.size() * 4), 0);
  EXPECT_EQ(std::memcmp(one.lse.data(), pooled.lse.data(), one.lse.size() * 4), 0);
}

TEST(CpuAttention, RejectsBadProblems) {
  Case c = selfAttention(8, 4, 2, 64, false, attnFloat32);
  Inputs in(c, 1);
  Result r(in.p);
  AttnProblem p = in.p;
  p.num_kv_heads = 3;
  EXPECT_EQ(attentionPartial(p, r.o.data(), r.lse.data()), attnInvalidArgument);
  p = in.p;
  p.head_dim = kAttnMaxHeadDim + 1;
  EXPECT_EQ(attentionPartial(p, r.o.data(), r.lse.data()), attnInvalidArgument);
  p = in.p;
  p.dtype = attnInt8;
  EXPECT_EQ(attentionPartial(p, r.o.data(), r.lse.data()), attnInvalidArgument);
  p = in.p;
  p.causal = true;
  p.q_pos = nullptr;
  EXPECT_EQ(attentionPartial(p, r.o.data(), r.lse.data()), attnInvalidArgument);
  const AttnSegment overlap[2] = {{0, 5, 0, 8}, {4, 8, 0, 8}};
  p = in.p;
  p.segments = overlap;
  p.num_segments = 2;
  EXPECT_EQ(attentionPartial(p, r.o.data(), r.lse.data()), attnInvalidArgument);
  const AttnSegment outside[1] = {{0, 9, 0, 8}};
  p.segments = outside;
  p.num_segments = 1;
  EXPECT_EQ(attentionPartial(p, r.o.data(), r.lse.data()), attnInvalidArgument);
}

// ---- Sliding windows, softcap and sinks (issue 48) ----

struct Window { int32_t wl, wr; };
// Left only, right only, both, window 0 (one side or both: the query's own
// position only), wider than any sequence here, and symmetric.
const Window kWindows[] = {{16, -1}, {-1, 9}, {20, 5}, {0, 0}, {0, -1}, {-1, 0}, {100000, 100000}, {70, 70}};

Case withWindow(Case c, Window w, float softcap = 0.0f) {
  c.wl = w.wl;
  c.wr = w.wr;
  c.softcap = softcap;
  return c;
}

// The case on the active ISA with 1 and 2 threads (and `more`), against the
// reference; `adjust` edits the problem first (e.g. its scale).
template <class Adjust>
void checkCase(const Case& c, uint32_t seed, double tol, double oTol, const std::string& what,
               Adjust adjust, std::initializer_list<int> threads = {1, 2}) {
  Inputs in(c, seed);
  adjust(in.p);
  const Reference ref(in.p);
  for (int n : threads) {
    Result r(in.p);
    ASSERT_EQ(attentionPartial(in.p, r.o.data(), r.lse.data(), {n}), attnSuccess) << what;
    expectClose(in.p, r, ref, tol, what + " threads " + std::to_string(n), oTol);
  }
}
void checkCase(const Case& c, uint32_t seed, double tol, double oTol, const std::string& what) {
  checkCase(c, seed, tol, oTol, what, [](AttnProblem&) {});
}

// Prefill shapes: several query tiles per kv head (K/V packed), GQA, head_dim
// 64, 128 and 40 (no whole vectors), each window with and without causal.
TEST(CpuAttention, SlidingWindowsMatchReference) {
  struct Shape { int t, hq, hkv, d; };
  const Shape shapes[] = {{300, 2, 1, 64}, {150, 4, 2, 128}, {97, 3, 1, 40}, {20, 8, 8, 64}};
  for (Isa isa : supportedIsas()) {
    IsaGuard guard(isa);
    for (const auto& s : shapes)
      for (const Window& w : kWindows)
        for (bool causal : {false, true}) {
          const Case c = withWindow(selfAttention(s.t, s.hq, s.hkv, s.d, causal, attnFloat32), w);
          checkCase(c, uint32_t(s.t + s.d), 1e-5, 0, describe(c, isa));
        }
  }
}

TEST(CpuAttention, SlidingWindowsHalfInputs) {
  for (Isa isa : supportedIsas()) {
    IsaGuard guard(isa);
    for (attnDataType_t dt : {attnFloat16, attnBfloat16})
      for (int d : {64, 128, 40})
        for (bool causal : {false, true})
          for (Window w : {Window{32, 8}, Window{5, -1}}) {
            const Case c = withWindow(selfAttention(140, 8, 2, d, causal, dt), w);
            checkCase(c, 5, 1e-5, 0, describe(c, isa));
          }
  }
}

// Positions out of order (shuffled, repeated), several sequences, one of
// them near INT32_MAX and one near INT32_MIN (the bounds saturate), a decode
// segment, a segment without keys.
Case shuffledSegments(std::mt19937& rng, attnDataType_t dt, bool causal, Window w) {
  Case c = emptyCausal(4, 2, 64, dt);
  c.causal = causal;
  c.wl = w.wl;
  c.wr = w.wr;
  auto add = [&](int len, int64_t base, int nq, int nk) {
    AttnSegment s{c.nq, c.nq + nq, c.nk, c.nk + nk};
    std::vector<int32_t> qp, kp;
    for (int i = 0; i < nq; ++i) qp.push_back(int32_t(base + len - nq + i));
    for (int i = 0; i < nk; ++i) kp.push_back(int32_t(base + int64_t(rng() % uint32_t(len))));  // repeats
    std::shuffle(qp.begin(), qp.end(), rng);
    for (int32_t q : qp) c.qpos.push_back(q), ++c.nq;
    for (int32_t k : kp) c.kpos.push_back(k), ++c.nk;
    c.segs.push_back(s);
  };
  add(200, 0, 200, 230);
  add(90, 1000, 3, 90);  // decode-like
  add(80, int64_t(std::numeric_limits<int32_t>::max()) - 80, 80, 80);
  add(70, std::numeric_limits<int32_t>::min(), 70, 70);
  add(10, 5000, 10, 0);  // no keys
  return c;
}

TEST(CpuAttention, WindowsOnShuffledPositionsAndSegments) {
  std::mt19937 rng(7);
  for (Isa isa : supportedIsas()) {
    IsaGuard guard(isa);
    for (attnDataType_t dt : {attnFloat32, attnBfloat16})
      for (bool causal : {false, true})
        for (Window w : {Window{24, -1}, Window{30, 10}, Window{-1, 12}, Window{0, 0}, Window{40, 40}}) {
          const Case c = shuffledSegments(rng, dt, causal, w);
          // (its decode segment goes through bf16 P·V on AVX512_BF16)
          checkCase(c, 13, 1e-5, decodeOTolerance(dt, isa), describe(c, isa), [](AttnProblem&) {}, {1, 3});
        }
  }
}

// Decode shapes: several kv heads per task, dot-product scores (fp32 in
// place, converted fp16, bf16 dot products on AVX512_BF16), split-K.
TEST(CpuAttention, SlidingWindowsDecode) {
  struct Shape { int rows, hq, hkv, d; };
  const Shape shapes[] = {{1, 32, 8, 128}, {1, 8, 1, 64}, {3, 10, 2, 128}, {1, 24, 3, 80}, {2, 12, 3, 40}};
  for (Isa isa : supportedIsas()) {
    IsaGuard guard(isa);
    for (const auto& s : shapes)
      for (attnDataType_t dt : {attnFloat32, attnFloat16, attnBfloat16})
        for (Window w : {Window{100, -1}, Window{5, -1}, Window{64, 0}, Window{0, 0}}) {
          const Case c = withWindow(decodeBatch(s.rows, s.hq, s.hkv, s.d, dt), w);
          checkCase(c, uint32_t(s.hq + s.d), 1e-5, decodeOTolerance(dt, isa), describe(c, isa),
                    [](AttnProblem&) {}, {1, 2, 3});
        }
    // Split-K over one long sequence: rows whose windows lie in different chunks.
    for (attnDataType_t dt : {attnFloat32, attnBfloat16}) {
      Case c = emptyCausal(8, 1, 64, dt);
      c.wl = 500;
      c.segs.push_back({0, 3, 0, 3000});
      for (int32_t q : {2999, 1200, 3}) c.qpos.push_back(q), ++c.nq;
      for (int32_t k = 0; k < 3000; ++k) c.kpos.push_back(k), ++c.nk;
      checkCase(c, 31, 1e-5, decodeOTolerance(dt, isa), describe(c, isa) + " split-K",
                [](AttnProblem&) {}, {2, 3, 4});
    }
  }
}

// ---- Split-K under a window: only the reachable keys are shared out ----

// A decode-like case over `nk` keys of one sequence (one kv head, so a
// single task: split-K at 2+ threads), query rows at `rows`, window (wl, wr).
// Key positions: 0.. in order, or (sorted = false) blocks of 256 positions
// laid out in shuffled order, each shuffled inside (a paged cache filled out
// of order).
Case windowedDecode(int nk, const std::vector<int32_t>& rows, Window w, bool causal, bool sorted,
                    attnDataType_t dt) {
  Case c = emptyCausal(8, 1, 128, dt);
  c.causal = causal;
  c.wl = w.wl;
  c.wr = w.wr;
  for (int32_t q : rows) c.qpos.push_back(q), ++c.nq;
  for (int32_t k = 0; k < nk; ++k) c.kpos.push_back(k), ++c.nk;
  if (!sorted) {
    std::mt19937 rng(uint32_t(nk + rows.size()));
    const int B = 256;
    std::vector<int> blocks(size_t((nk + B - 1) / B));
    for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = int(i);
    std::shuffle(blocks.begin(), blocks.end(), rng);
    std::vector<int32_t> kp;
    for (int b : blocks) {
      const size_t at = kp.size();
      for (int k = b * B; k < std::min(nk, (b + 1) * B); ++k) kp.push_back(k);
      std::shuffle(kp.begin() + ptrdiff_t(at), kp.end(), rng);
    }
    c.kpos = kp;
  }
  c.segs.push_back({0, c.nq, 0, c.nk});
  return c;
}

// Key tiles of chunk [k0, k1) of segment s that the kernel computes for some
// query of the segment (a key position within the segment's loosest
// bounds, or keys on both sides of them), counted here from scratch.
int reachableTilesIn(const Case& c, const AttnSegment& s, int32_t k0, int32_t k1) {
  const VisibleSpan span = visibleSpan(c.causal, c.wl, c.wr);
  const int64_t qmin = *std::min_element(c.qpos.begin() + s.q_begin, c.qpos.begin() + s.q_end);
  const int64_t qmax = *std::max_element(c.qpos.begin() + s.q_begin, c.qpos.begin() + s.q_end);
  int n = 0;
  for (int32_t t = k0; t < k1; t += kAttnKeyTile) {
    const auto mm = std::minmax_element(c.kpos.begin() + t, c.kpos.begin() + std::min(k1, t + kAttnKeyTile));
    n += !(*mm.first > qmax + span.hi || *mm.second < qmin - span.lo);
  }
  return n;
}

// 8192 keys, windows of 512 and 2048 (causal, and two-sided without it),
// one row at the end or rows spread over the sequence (the reachable keys
// in three clumps), sorted and block-shuffled positions, fp32 and bf16, 1, 2
// and 4 threads, every ISA: the reference, and the same tile counts at
// every thread count (the chunks hold the tiles of one unsplit walk; those
// left out are counted as skipped).
TEST(CpuAttention, WindowedSplitKeysDecodeMatchesReference) {
  const int nk = 8192;
  const std::vector<std::vector<int32_t>> rowSets = {{nk - 1}, {nk - 1, 5000, 700}};
  for (Isa isa : supportedIsas()) {
    IsaGuard guard(isa);
    for (attnDataType_t dt : {attnFloat32, attnBfloat16})
      for (const auto& rows : rowSets)
        for (bool sorted : {true, false})
          for (Window w : {Window{512, -1}, Window{2048, -1}, Window{1500, 300}}) {
            const bool causal = w.wr < 0;
            const Case c = windowedDecode(nk, rows, w, causal, sorted, dt);
            const std::string what = describe(c, isa) + (sorted ? " sorted" : " block-shuffled") +
                                     " rows " + std::to_string(rows.size());
            Inputs in(c, 41);
            const Reference ref(in.p);
            AttnStats one;
            for (int threads : {1, 2, 4}) {
              Result r(in.p);
              AttnStats st;
              ASSERT_EQ(attentionPartial(in.p, r.o.data(), r.lse.data(), {threads, nullptr, &st}), attnSuccess);
              expectClose(in.p, r, ref, 1e-5, what + " threads " + std::to_string(threads),
                          decodeOTolerance(dt, isa));
              if (threads == 1) one = st;
              EXPECT_EQ(st.tiles_full, one.tiles_full) << what << " threads " << threads;
              EXPECT_EQ(st.tiles_masked, one.tiles_masked) << what << " threads " << threads;
              EXPECT_EQ(st.tiles_skipped, one.tiles_skipped) << what << " threads " << threads;
            }
            // Folded into an accumulator holding a first call's keys.
            AttnProblem p = in.p;
            std::vector<AttnSegment> first = c.segs, rest = c.segs;
            first[0].k_end = 3000;
            rest[0].k_begin = 3000;
            Result acc(in.p);
            p.segments = first.data();
            ASSERT_EQ(attentionPartial(p, acc.o.data(), acc.lse.data(), {4}), attnSuccess);
            p.segments = rest.data();
            ASSERT_EQ(attentionAccumulate(p, acc.o.data(), acc.lse.data(), {4}), attnSuccess);
            expectClose(in.p, acc, ref, 1e-5, what + " accumulate", decodeOTolerance(dt, isa));
          }
  }
}

// The split itself (planKeySplit, what the call above runs): with a window,
// every chunk gets the same number of reachable key tiles (to one), the
// chunks hold every reachable tile, and those left out are unreachable. An
// even cut of all 8192 keys gives one chunk nearly all the work (window
// 2048 at the end: 32 of 33 tiles in the last quarter).
TEST(CpuAttention, WindowedSplitKeysBalanceReachableTiles) {
  const int nk = 8192;
  const std::vector<std::vector<int32_t>> rowSets = {{nk - 1}, {nk - 1, 5000, 700}, {3000}};
  for (const auto& rows : rowSets)
    for (bool sorted : {true, false})
      for (Window w : {Window{2048, -1}, Window{4000, -1}, Window{1500, 300}, Window{-1, 1800}})
        for (int threads : {2, 3, 4}) {
          const bool causal = w.wl >= 0 && w.wr < 0;
          const Case c = windowedDecode(nk, rows, w, causal, sorted, attnBfloat16);
          const Inputs in(c, 1);
          const std::string what = describe(c, Isa::kGeneric) + (sorted ? " sorted" : " block-shuffled") +
                                   " rows " + std::to_string(rows.size()) + " threads " + std::to_string(threads);
          const std::vector<AttnTask> tasks = {{0, 0, 1, 0, int32_t(rows.size()) * 8}};
          const AttnKeySplit plan = planKeySplit(in.p, c.segs, tasks, threads);
          const AttnSegment& s = c.segs[0];
          const int total = reachableTilesIn(c, s, s.k_begin, s.k_end);
          ASSERT_GT(total, 0) << what;
          ASSERT_EQ(plan.splits, std::min(threads, total * kAttnKeyTile / (8 * kAttnKeyTile))) << what;
          ASSERT_GT(plan.splits, 1) << what;
          ASSERT_EQ(plan.bounds.size(), size_t(plan.splits) + 1) << what;
          int lo = nk, hi = 0, sum = 0;
          for (int j = 0; j < plan.splits; ++j) {
            const int32_t k0 = plan.bounds[size_t(j)], k1 = plan.bounds[size_t(j) + 1];
            ASSERT_LE(k0, k1) << what;
            ASSERT_EQ(k0 % kAttnKeyTile, 0) << what;  // on the tile grid
            const int n = reachableTilesIn(c, s, k0, k1);
            lo = std::min(lo, n);
            hi = std::max(hi, n);
            sum += n;
          }
          EXPECT_EQ(sum, total) << what;
          EXPECT_LE(hi - lo, 1) << what << ": reachable tiles per chunk " << lo << ".." << hi;
          // Left out: unreachable only, and counted.
          EXPECT_EQ(reachableTilesIn(c, s, s.k_begin, plan.bounds.front()), 0) << what;
          EXPECT_EQ(reachableTilesIn(c, s, plan.bounds.back(), s.k_end), 0) << what;
          EXPECT_EQ(plan.trimmed[0], (plan.bounds.front() - s.k_begin + kAttnKeyTile - 1) / kAttnKeyTile +
                                         (s.k_end - plan.bounds.back() + kAttnKeyTile - 1) / kAttnKeyTile)
              << what;
        }
  // Unwindowed (plain causal): the even cut of all keys, as before.
  Case c = windowedDecode(nk, {nk - 1}, Window{-1, -1}, true, true, attnFloat32);
  const Inputs in(c, 1);
  const AttnKeySplit plan = planKeySplit(in.p, c.segs, std::vector<AttnTask>{AttnTask{0, 0, 1, 0, 8}}, 4);
  ASSERT_EQ(plan.splits, 4);
  EXPECT_EQ(plan.bounds, (std::vector<int32_t>{0, 2048, 4096, 6144, 8192}));
  EXPECT_EQ(plan.trimmed, std::vector<int32_t>{0});
}

// Softcap across scales: scores ~1e-3 of the cap (the polynomial), around
// it, far past it (saturated), and a cap that caps nothing; with causal,
// windows, GQA, prefill and decode, every dtype.
TEST(CpuAttention, SoftcapMatchesReference) {
  struct Cap { float scale_mul, cap; };
  const Cap caps[] = {{1.0f, 2.0f}, {1.0f, 0.3f}, {1e-3f, 0.5f}, {10.0f, 1.0f}, {10.0f, 4.0f}, {1.0f, 1e6f}};
  for (Isa isa : supportedIsas()) {
    IsaGuard guard(isa);
    for (const Cap& k : caps)
      for (attnDataType_t dt : {attnFloat32, attnFloat16, attnBfloat16}) {
        auto scaled = [&](AttnProblem& p) { p.scale *= k.scale_mul; };
        const Case cases[] = {
            withWindow(selfAttention(130, 8, 2, 64, true, dt), {-1, -1}, k.cap),
            withWindow(selfAttention(130, 8, 2, 64, false, dt), {-1, -1}, k.cap),
            withWindow(selfAttention(90, 4, 1, 40, true, dt), {20, -1}, k.cap),
            withWindow(selfAttention(70, 3, 3, 128, false, dt), {10, 10}, k.cap),
            withWindow(decodeBatch(1, 32, 8, 128, dt), {-1, -1}, k.cap),
            withWindow(decodeBatch(2, 8, 1, 64, dt), {50, -1}, k.cap)};
        // Scores 10x larger carry 10x the fp32 rounding of their dot
        // products (capped or not): scale the tolerance with them.
        const double tol = k.scale_mul > 1.0f ? 3e-5 : 1e-5;
        for (const Case& c : cases)
          checkCase(c, 3, tol, c.nq < 20 ? std::max(tol, decodeOTolerance(dt, isa)) : 0,
                    describe(c, isa) + " scale x" + std::to_string(k.scale_mul), scaled);
      }
  }
}

// attentionAccumulate over the keys in 2 or 3 blocks gives the one call's
// result (and the reference's), windows and softcap on; a first block seen
// by no row leaves those rows' accumulators empty.
TEST(CpuAttention, WindowedAccumulateInBlocksEqualsOneCall) {
  std::mt19937 rng(3);
  for (Isa isa : supportedIsas()) {
    IsaGuard guard(isa);
    for (attnDataType_t dt : {attnFloat32, attnBfloat16}) {
      const Case cases[] = {withWindow(selfAttention(260, 4, 2, 64, true, dt), {40, -1}, 3.0f),
                            withWindow(selfAttention(120, 2, 2, 40, false, dt), {7, 30}, 0.0f),
                            withWindow(decodeBatch(2, 16, 4, 128, dt), {70, -1}, 5.0f),
                            shuffledSegments(rng, dt, true, {25, -1})};
      for (const Case& c : cases) {
        Inputs in(c, 19);
        const Reference ref(in.p);
        Result one(in.p);
        ASSERT_EQ(attentionPartial(in.p, one.o.data(), one.lse.data()), attnSuccess);
        const double oTol = decodeOTolerance(dt, isa);  // bf16 decode rows on AVX512_BF16
        for (int parts : {2, 3}) {
          const auto split = keyPartition(c, parts, rng);
          Result acc(in.p);
          initAccumulator(acc.o.data(), acc.lse.data(), c.nq, c.hq, c.d);
          AttnProblem p = in.p;
          for (const auto& segs : split) {
            p.segments = segs.data();
            p.num_segments = int32_t(segs.size());
            ASSERT_EQ(attentionAccumulate(p, acc.o.data(), acc.lse.data(), {2}), attnSuccess);
          }
          const std::string what = describe(c, isa) + " parts " + std::to_string(parts);
          expectClose(in.p, acc, ref, 1e-5, what, oTol);
          expectMatchesOneCall(acc, one, c.d, oTol, what);  // the one call, as a reference of its own
        }
      }
    }
  }
}

// Paged K/V with a window and a softcap: the bits of the gathered keys.
TEST(CpuAttention, PagedKeysWithWindowGiveTheBitsOfTheGatheredKeys) {
  for (Isa isa : supportedIsas()) {
    IsaGuard guard(isa);
    for (attnDataType_t dt : {attnFloat32, attnBfloat16})
      for (bool prefill : {false, true}) {
        const Case c = withWindow(prefill ? selfAttention(150, 4, 1, 128, true, dt) : decodeBatch(1, 32, 8, 128, dt),
                                  {40, -1}, 4.0f);
        Inputs in(c, 23);
        std::vector<int64_t> rows(size_t(c.nk));
        for (int j = 0; j < c.nk; ++j) rows[size_t(j)] = int64_t(c.nk - 1 - j) * 2 + 1;  // reversed, odd rows
        const size_t rowElems = size_t(c.hkv) * c.d, rowBytes = rowElems * dataTypeSize(dt);
        std::mt19937 rng(1);
        Tensor pk(dt, 2 * c.nk * rowElems, rng, -1.0f, 1.0f), pv(dt, 2 * c.nk * rowElems, rng, -1.0f, 1.0f);
        for (int j = 0; j < c.nk; ++j) {
          const size_t r = size_t(rows[size_t(j)]);
          std::memcpy(pk.bytes.data() + r * rowBytes, static_cast<const char*>(in.k.data()) + j * rowBytes, rowBytes);
          std::memcpy(pv.bytes.data() + r * rowBytes, static_cast<const char*>(in.v.data()) + j * rowBytes, rowBytes);
          pk.setRowNan(r - 1, rowElems);
          pv.setRowNan(r - 1, rowElems);
        }
        AttnProblem paged = in.p;
        paged.k = pk.data();
        paged.v = pv.data();
        paged.k_rows = rows.data();
        expectPagedEqualsGathered(in.p, paged, describe(c, isa), prefill ? 1e-5 : decodeOTolerance(dt, isa));
      }
  }
}

// The expected tile classification of a self-attention case (one segment,
// positions 0..T-1, one kv head per task) under span (lo, hi).
AttnStats expectedTiles(int T, int nq, int hkv, int rows, int64_t lo, int64_t hi) {
  AttnStats want;
  for (int h = 0; h < hkv; ++h)
    for (int m0 = 0; m0 < nq; m0 += rows)
      for (int k0 = 0; k0 < T; k0 += kAttnKeyTile) {
        const int64_t qmin = m0 + (T - nq), qmax = std::min(nq, m0 + rows) - 1 + (T - nq);
        const int64_t kmin = k0, kmax = std::min(T, k0 + kAttnKeyTile) - 1;
        if (kmin > qmax + hi || kmax < qmin - lo) ++want.tiles_skipped;
        else if (kmin < qmax - lo || kmax > qmin + hi) ++want.tiles_masked;
        else ++want.tiles_full;
      }
  return want;
}

// Window 64 over 4096 keys: all but the tiles around the window are skipped
// (their K/V hold NaN in the decode case: never read).
TEST(CpuAttention, WindowSkipsTilesOutsideIt) {
  const int T = 4096;
  for (Isa isa : supportedIsas()) {
    IsaGuard guard(isa);
    {  // decode: one row at the last position
      Case c = emptyCausal(8, 1, 64, attnFloat32);
      c.wl = 64;
      c.qpos = {T - 1};
      c.nq = 1;
      for (int k = 0; k < T; ++k) c.kpos.push_back(k);
      c.nk = T;
      Inputs in(c, 2);
      for (int j = 0; j < T - 2 * kAttnKeyTile; ++j) {
        in.k.setRowNan(size_t(j), size_t(c.d));
        in.v.setRowNan(size_t(j), size_t(c.d));
      }
      Result r(in.p);
      AttnStats st;
      ASSERT_EQ(attentionPartial(in.p, r.o.data(), r.lse.data(), {1, nullptr, &st}), attnSuccess);
      expectClose(in.p, r, Reference(in.p), 1e-5, describe(c, isa));
      EXPECT_EQ(st.tiles_skipped, T / kAttnKeyTile - 2) << isaName(isa);
      EXPECT_EQ(st.tiles_masked, 1) << isaName(isa);  // keys 3968..4031: 4031 only
      EXPECT_EQ(st.tiles_full, 1) << isaName(isa);    // keys 4032..4095
    }
    for (Window w : {Window{64, -1}, Window{64, 64}}) {  // prefill, causal / two-sided
      const bool causal = w.wr < 0;
      const Case c = withWindow(selfAttention(T, 1, 1, 64, causal, attnFloat32), w);
      Inputs in(c, 4);
      Result r(in.p);
      AttnStats st;
      ASSERT_EQ(attentionPartial(in.p, r.o.data(), r.lse.data(), {1, nullptr, &st}), attnSuccess);
      expectClose(in.p, r, Reference(in.p), 1e-5, describe(c, isa));
      const VisibleSpan span = visibleSpan(in.p);
      const AttnStats want = expectedTiles(T, T, 1, kernelsFor(activeIsa()).attn_tile_rows, span.lo, span.hi);
      EXPECT_EQ(st.tiles_skipped, want.tiles_skipped) << describe(c, isa);
      EXPECT_EQ(st.tiles_masked, want.tiles_masked) << describe(c, isa);
      EXPECT_EQ(st.tiles_full, want.tiles_full) << describe(c, isa);
      const int64_t total = st.tiles_skipped + st.tiles_masked + st.tiles_full;
      EXPECT_GT(st.tiles_skipped, total * 8 / 10) << describe(c, isa);
    }
  }
}

TEST(CpuAttention, RejectsBadWindowsAndSoftcaps) {
  Case c = selfAttention(8, 4, 2, 64, false, attnFloat32);
  Inputs in(c, 1);
  Result r(in.p);
  auto run = [&](auto edit) {
    AttnProblem p = in.p;
    edit(p);
    return attentionPartial(p, r.o.data(), r.lse.data());
  };
  EXPECT_EQ(run([](AttnProblem& p) { p.window_left = -2; }), attnInvalidArgument);
  EXPECT_EQ(run([](AttnProblem& p) { p.window_right = -7; }), attnInvalidArgument);
  EXPECT_EQ(run([](AttnProblem& p) { p.softcap = -1.0f; }), attnInvalidArgument);
  EXPECT_EQ(run([](AttnProblem& p) { p.softcap = std::numeric_limits<float>::quiet_NaN(); }),
            attnInvalidArgument);
  EXPECT_EQ(run([](AttnProblem& p) { p.softcap = std::numeric_limits<float>::infinity(); }),
            attnInvalidArgument);
  // A window needs positions, on either side, causal or not.
  EXPECT_EQ(run([](AttnProblem& p) { p.window_left = 3; p.q_pos = nullptr; }), attnInvalidArgument);
  EXPECT_EQ(run([](AttnProblem& p) { p.window_right = 0; p.k_pos = nullptr; }), attnInvalidArgument);
  // Fine: -1 (unbounded), a window with positions, a cap, no positions unbounded.
  EXPECT_EQ(run([](AttnProblem& p) { p.window_left = 4; p.window_right = 0; p.softcap = 30.0f; }), attnSuccess);
  EXPECT_EQ(run([](AttnProblem& p) { p.q_pos = nullptr; p.k_pos = nullptr; p.softcap = 1e-30f; }), attnSuccess);
  for (float x : r.o) EXPECT_FALSE(std::isnan(x));
  EXPECT_EQ(run([](AttnProblem& p) { p.softcap = 3e38f; }), attnSuccess);  // caps nothing
  double o[8 * 4 * 64], lse[8 * 4];
  AttnProblem p = in.p;
  p.window_left = -3;
  EXPECT_EQ(referenceAttention(p, o, lse), attnInvalidArgument);
  p = in.p;
  p.window_left = 2;
  p.q_pos = nullptr;
  EXPECT_EQ(referenceAttention(p, o, lse), attnInvalidArgument);
}

// Sinks in the reference, from the definition: every row's denominator
// gains exp(sink[h]); rows that see no key (masked by the window, or in no
// segment) get O = 0 and LSE = sink. Checked against the kernels' sink-free
// result with the sink folded in afterwards, as the library does.
TEST(CpuAttention, ReferenceSinks) {
  Case c = withWindow(selfAttention(50, 4, 2, 64, true, attnFloat32), {10, -1}, 5.0f);
  for (int i = 0; i < 5; ++i) c.qpos[size_t(i)] += 1000;  // beyond every key's window
  c.segs = {{0, 45, 0, 50}};                              // rows 45.. in no segment
  Inputs in(c, 6);
  const float sinks[4] = {0.5f, -1.0f, 3.0f, -20.0f};
  std::vector<double> so(size_t(c.nq) * c.hq * c.d), slse(size_t(c.nq) * c.hq);
  ASSERT_EQ(referenceAttention(in.p, sinks, so.data(), slse.data()), attnSuccess);
  Result r(in.p);
  ASSERT_EQ(attentionPartial(in.p, r.o.data(), r.lse.data()), attnSuccess);
  int empty = 0;
  for (int i = 0; i < c.nq; ++i)
    for (int h = 0; h < c.hq; ++h) {
      const size_t row = size_t(i) * c.hq + h;
      const double sink = sinks[h];
      if (r.lse[row] == kNegInf) {
        ++empty;
        EXPECT_EQ(slse[row], sink);
        for (int d = 0; d < c.d; ++d) EXPECT_EQ(so[row * c.d + d], 0.0);
        continue;
      }
      const double l = r.lse[row], m = std::max(l, sink);
      const double want = m + std::log(std::exp(l - m) + std::exp(sink - m));
      EXPECT_NEAR(slse[row], want, 1e-5) << i << " " << h;
      for (int d = 0; d < c.d; ++d)
        EXPECT_NEAR(so[row * c.d + d], r.o[row * c.d + d] * std::exp(l - want), 1e-5) << i << " " << h;
    }
  EXPECT_EQ(empty, 10 * c.hq);
  // One key: o = v e^s / (e^s + e^sink), straight.
  Case one = selfAttention(1, 1, 1, 4, false, attnFloat32);
  Inputs in1(one, 8);
  double o1[4], l1;
  const float sink1 = 0.25f;
  ASSERT_EQ(referenceAttention(in1.p, &sink1, o1, &l1), attnSuccess);
  const float* q = static_cast<const float*>(in1.p.q);
  const float* k = static_cast<const float*>(in1.p.k);
  const float* v = static_cast<const float*>(in1.p.v);
  double s = 0;
  for (int d = 0; d < 4; ++d) s += double(q[d]) * k[d];
  s *= in1.p.scale;
  EXPECT_NEAR(l1, std::log(std::exp(s) + std::exp(double(sink1))), 1e-12);
  for (int d = 0; d < 4; ++d) EXPECT_NEAR(o1[d], v[d] * std::exp(s) / (std::exp(s) + std::exp(double(sink1))), 1e-12);
}

// ---- MLA-shaped heads: V (and O) with a head dim of their own ----

struct MlaDims { int d, dv; };
// DeepSeek's 192/128, V narrower and wider than Q/K, and odd sizes that fill
// no whole vector on any ISA.
const MlaDims kMlaDims[] = {{192, 128}, {128, 64}, {64, 128}, {256, 64}, {72, 40}, {40, 72}};

Case withValueDim(Case c, int dv) {
  c.dv = dv;
  return c;
}

// Causal prefill after `cached` keys: query rows at positions cached ..
// cached + nq - 1, keys at 0 .. cached + nq - 1.
Case cachedPrefill(int nq, int cached, int hq, int hkv, int d, attnDataType_t dt) {
  Case c = emptyCausal(hq, hkv, d, dt);
  c.nq = nq;
  c.nk = cached + nq;
  for (int i = 0; i < nq; ++i) c.qpos.push_back(cached + i);
  for (int k = 0; k < c.nk; ++k) c.kpos.push_back(k);
  return c;
}

// One sequence of `nk` keys with query rows at `rows` (one kv head: split-K
// at 2 threads and more).
Case longDecode(int hq, int d, attnDataType_t dt, std::initializer_list<int32_t> rows, int nk) {
  Case c = emptyCausal(hq, 1, d, dt);
  c.segs.push_back({0, int32_t(rows.size()), 0, nk});
  for (int32_t q : rows) c.qpos.push_back(q), ++c.nq;
  for (int32_t k = 0; k < nk; ++k) c.kpos.push_back(k), ++c.nk;
  return c;
}

// Prefill: one query tile per kv head (K/V read from the input: fp32 in
// place, or converted), GQA with two tiles per kv head (K/V packed once per
// call), and a window with softcap; every dtype.
TEST(CpuAttention, MlaValueHeadDimPrefill) {
  for (Isa isa : supportedIsas()) {
    IsaGuard guard(isa);
    for (const MlaDims& m : kMlaDims)
      for (attnDataType_t dt : {attnFloat32, attnFloat16, attnBfloat16}) {
        const Case cases[] = {withValueDim(cachedPrefill(37, 50, 2, 1, m.d, dt), m.dv),
                              withValueDim(cachedPrefill(100, 60, 8, 2, m.d, dt), m.dv),
                              withValueDim(withWindow(cachedPrefill(90, 40, 4, 2, m.d, dt), {30, -1}, 5.0f), m.dv)};
        for (const Case& c : cases) checkCase(c, uint32_t(m.d + m.dv), 1e-5, 0, describe(c, isa));
      }
  }
}

// Decode: a batch of sequences, one query row each, GQA groups of 4 (several
// kv heads per task, dot-product scores; fp32 V read in place when its rows
// are whole vectors), 1 to 3 threads; one long sequence over one kv head
// split across 2 to 4 threads (split-K), with and without a window.
TEST(CpuAttention, MlaValueHeadDimDecode) {
  for (Isa isa : supportedIsas()) {
    IsaGuard guard(isa);
    for (const MlaDims& m : kMlaDims)
      for (attnDataType_t dt : {attnFloat32, attnFloat16, attnBfloat16}) {
        const double oTol = decodeOTolerance(dt, isa);
        const Case batch = withValueDim(decodeBatch(1, 8, 2, m.d, dt), m.dv);
        checkCase(batch, uint32_t(m.d * 3 + m.dv), 1e-5, oTol, describe(batch, isa), [](AttnProblem&) {},
                  {1, 2, 3});
        Case split = withValueDim(longDecode(8, m.d, dt, {2999, 1200, 3}, 3000), m.dv);
        checkCase(split, uint32_t(m.d + m.dv), 1e-5, oTol, describe(split, isa) + " split-K",
                  [](AttnProblem&) {}, {2, 4});
        split.wl = 700;
        checkCase(split, uint32_t(m.d + m.dv), 1e-5, oTol, describe(split, isa) + " split-K",
                  [](AttnProblem&) {}, {3});
      }
  }
}

// attentionAccumulate over two key blocks gives the one call's result (and
// the reference's): prefill, a decode batch and split-K decode.
TEST(CpuAttention, MlaValueHeadDimAccumulateInTwoBlocks) {
  std::mt19937 rng(23);
  for (Isa isa : supportedIsas()) {
    IsaGuard guard(isa);
    for (const MlaDims& m : kMlaDims)
      for (attnDataType_t dt : {attnFloat32, attnBfloat16}) {
        const Case cases[] = {withValueDim(cachedPrefill(60, 70, 4, 2, m.d, dt), m.dv),
                              withValueDim(decodeBatch(1, 8, 2, m.d, dt), m.dv),
                              withValueDim(longDecode(4, m.d, dt, {2500, 1000}, 2600), m.dv)};
        for (const Case& c : cases) {
          Inputs in(c, uint32_t(m.d * 7 + m.dv));
          const Reference ref(in.p);
          Result one(in.p);
          ASSERT_EQ(attentionPartial(in.p, one.o.data(), one.lse.data(), {3}), attnSuccess);
          const double oTol = decodeOTolerance(dt, isa);
          const std::string what = describe(c, isa) + " accumulate";
          Result acc(in.p);
          initAccumulator(acc.o.data(), acc.lse.data(), c.nq, c.hq, m.dv);
          AttnProblem p = in.p;
          for (const auto& segs : keyPartition(c, 2, rng)) {
            p.segments = segs.data();
            p.num_segments = int32_t(segs.size());
            ASSERT_EQ(attentionAccumulate(p, acc.o.data(), acc.lse.data(), {3}), attnSuccess) << what;
          }
          expectClose(in.p, acc, ref, 1e-5, what, oTol);
          expectMatchesOneCall(acc, one, m.dv, oTol, what);
        }
      }
  }
}

// Paged K/V (k_rows) with V rows of their own size: the bits of the same
// keys gathered, and the reference. A decode batch, split-K decode and a
// packed prefill.
TEST(CpuAttention, MlaValueHeadDimPagedKeys) {
  for (Isa isa : supportedIsas()) {
    IsaGuard guard(isa);
    for (const MlaDims& m : kMlaDims)
      for (attnDataType_t dt : {attnFloat32, attnBfloat16}) {
        const Case cases[] = {withValueDim(decodeBatch(1, 8, 2, m.d, dt), m.dv),
                              withValueDim(longDecode(8, m.d, dt, {1999, 700}, 2000), m.dv),
                              withValueDim(cachedPrefill(80, 40, 8, 2, m.d, dt), m.dv)};
        for (const Case& c : cases) {
          Inputs in(c, uint32_t(m.d + 5 * m.dv));
          // Key j at pool row rows[j]: blocks of 16 shuffled over twice the
          // rows needed, the unused ones NaN.
          const int block = 16, blocks = (c.nk + block - 1) / block;
          std::vector<int> order(size_t(2 * blocks));
          for (size_t b = 0; b < order.size(); ++b) order[b] = int(b);
          std::mt19937 rng(uint32_t(m.d * m.dv));
          std::shuffle(order.begin(), order.end(), rng);
          std::vector<int64_t> rows(size_t(c.nk));
          for (int j = 0; j < c.nk; ++j) rows[size_t(j)] = int64_t(order[size_t(j / block)]) * block + j % block;
          const size_t poolRows = order.size() * block;
          const size_t kElems = size_t(c.hkv) * m.d, vElems = size_t(c.hkv) * m.dv;
          Tensor pk(dt, poolRows * kElems, rng, -1.0f, 1.0f), pv(dt, poolRows * vElems, rng, -1.0f, 1.0f);
          std::vector<bool> used(poolRows, false);
          const size_t es = dataTypeSize(dt);
          for (int j = 0; j < c.nk; ++j) {
            const size_t r = size_t(rows[size_t(j)]);
            used[r] = true;
            std::memcpy(pk.bytes.data() + r * kElems * es, static_cast<const char*>(in.k.data()) + j * kElems * es,
                        kElems * es);
            std::memcpy(pv.bytes.data() + r * vElems * es, static_cast<const char*>(in.v.data()) + j * vElems * es,
                        vElems * es);
          }
          for (size_t r = 0; r < poolRows; ++r)
            if (!used[r]) pk.setRowNan(r, kElems), pv.setRowNan(r, vElems);
          AttnProblem paged = in.p;
          paged.k = pk.data();
          paged.v = pv.data();
          paged.k_rows = rows.data();
          expectPagedEqualsGathered(in.p, paged, describe(c, isa) + " paged", decodeOTolerance(dt, isa));
        }
      }
  }
}

// head_dim_v outside 0 .. kAttnMaxHeadDim is refused; 0 (head_dim) and the
// largest one are served.
TEST(CpuAttention, RejectsBadValueHeadDim) {
  Case c = withValueDim(selfAttention(8, 4, 2, 64, false, attnFloat32), kAttnMaxHeadDim);
  Inputs in(c, 1);
  Result r(in.p);
  ASSERT_EQ(attentionPartial(in.p, r.o.data(), r.lse.data()), attnSuccess);
  expectClose(in.p, r, Reference(in.p), 1e-5, "head_dim_v 256");
  AttnProblem p = in.p;
  p.head_dim_v = 0;
  EXPECT_EQ(attentionPartial(p, r.o.data(), r.lse.data()), attnSuccess);
  for (int32_t dv : {kAttnMaxHeadDim + 1, -1}) {
    p.head_dim_v = dv;
    EXPECT_EQ(attentionPartial(p, r.o.data(), r.lse.data()), attnInvalidArgument) << dv;
    EXPECT_EQ(attentionAccumulate(p, r.o.data(), r.lse.data()), attnInvalidArgument) << dv;
  }
}

TEST(CpuMerge, MinusInfinityPartialsContributeNothing) {
  const int d = 16;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> o0(2 * d, nan), lse0 = {kNegInf, kNegInf};  // empty accumulator, garbage O
  std::vector<float> o1(2 * d, nan), lse1 = {kNegInf, kNegInf};  // empty partial, garbage O
  std::vector<float> o2(2 * d, 0.5f), lse2 = {kNegInf, 3.0f};
  const AttnPartialRef parts[2] = {{o1.data(), attnFloat32, lse1.data()},
                                   {o2.data(), attnFloat32, lse2.data()}};
  ASSERT_EQ(mergePartials(o0.data(), lse0.data(), parts, 2, 2, d), attnSuccess);
  for (int i = 0; i < d; ++i) {
    EXPECT_EQ(o0[i], 0.0f);          // row 0: nobody saw a key
    EXPECT_FLOAT_EQ(o0[d + i], 0.5f);  // row 1: only partial 2
  }
  EXPECT_EQ(lse0[0], kNegInf);
  EXPECT_FLOAT_EQ(lse0[1], 3.0f);
  // Large LSEs do not overflow: the max is subtracted.
  std::vector<float> a(d, 1.0f), la = {1000.0f}, b(d, 3.0f), lb = {1000.0f};
  const AttnPartialRef pb{b.data(), attnFloat32, lb.data()};
  ASSERT_EQ(foldPartial(a.data(), la.data(), pb, 1, d), attnSuccess);
  EXPECT_FLOAT_EQ(a[0], 2.0f);
  EXPECT_FLOAT_EQ(la[0], 1000.0f + std::log(2.0f));
}

TEST(CpuMerge, FoldRowsByIndex) {
  const int heads = 2, d = 8;
  std::vector<float> acc(4 * heads * d, 1.0f), lse(4 * heads, 0.0f);
  std::vector<float> part(2 * heads * d, 3.0f), plse(2 * heads, 0.0f);
  const int32_t rows[2] = {3, 1};
  ASSERT_EQ(foldPartialRows(acc.data(), lse.data(), {part.data(), attnFloat32, plse.data()}, rows,
                            2, heads, d),
            attnSuccess);
  for (int t = 0; t < 4; ++t)
    EXPECT_FLOAT_EQ(acc[size_t(t) * heads * d], (t == 1 || t == 3) ? 2.0f : 1.0f) << t;
  EXPECT_FLOAT_EQ(lse[3 * heads], std::log(2.0f));
  EXPECT_EQ(lse[0], 0.0f);
}

TEST(CpuPack, GatherScatterRoundTripEveryType) {
  std::mt19937 rng(5);
  for (int t = 0; t < attnNumTypes; ++t) {
    const auto type = attnDataType_t(t);
    const int n = 50, heads = 3, d = 5;
    const size_t rb = rowBytes(heads, d, type);
    std::vector<unsigned char> src(n * rb);
    for (auto& b : src) b = static_cast<unsigned char>(rng());
    std::vector<int32_t> idx;  // two runs and strays, as a CP shard
    for (int i = 10; i < 20; ++i) idx.push_back(i);
    for (int i = 40; i < 50; ++i) idx.push_back(i);
    idx.push_back(3);
    idx.push_back(0);
    std::vector<unsigned char> packed(idx.size() * rb), back(n * rb, 0);
    gatherRows(packed.data(), src.data(), idx.data(), idx.size(), rb);
    for (size_t i = 0; i < idx.size(); ++i)
      ASSERT_EQ(std::memcmp(&packed[i * rb], &src[size_t(idx[i]) * rb], rb), 0);
    scatterRows(back.data(), packed.data(), idx.data(), idx.size(), rb);
    for (int i = 0; i < n; ++i) {
      const bool in = std::find(idx.begin(), idx.end(), i) != idx.end();
      const bool same = std::memcmp(&back[size_t(i) * rb], &src[size_t(i) * rb], rb) == 0;
      EXPECT_EQ(same, in) << dataTypeName(type) << " row " << i;
    }
  }
}

// Rows and positions of paged keys, from one entry per block: a partial
// block in the middle, blocks out of slot order, and bad entries skipped.
TEST(CpuPack, KeyTableExpandsBlocksIntoRowsAndPositions) {
  const int bt = 4;
  const size_t slots = 6;
  std::vector<int32_t> slotPos(slots * bt);
  for (size_t i = 0; i < slotPos.size(); ++i) slotPos[i] = int32_t(1000 + 7 * i);
  const std::vector<KeyBlock> blocks = {
      {5, 0, 4}, {1, 4, 2}, {3, 6, 4},  // 10 keys, slot 1 half full
      {-1, 10, 4}, {6, 10, 4}, {2, 10, 5},  // slot out of range, too many tokens: skipped
  };
  std::vector<int64_t> rows(12, -7);
  std::vector<int32_t> pos(12, -7);
  gatherKeyTable(rows.data(), pos.data(), blocks.data(), blocks.size(), bt, slotPos.data(), slots);
  const std::vector<int64_t> wantRows = {20, 21, 22, 23, 4, 5, 12, 13, 14, 15, -7, -7};
  EXPECT_EQ(rows, wantRows);
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(pos[i], slotPos[size_t(wantRows[i])]) << i;
  EXPECT_EQ(pos[10], -7);
}

}  // namespace
}  // namespace attn::cpu
