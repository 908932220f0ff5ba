// Device kernels (kernels/cuda) against the CPU double-precision reference
// and the CPU kernels. Built only when CUDA was found; every test that needs
// a device skips with the reason when none is usable. Argument checking runs
// everywhere (it happens on the host before any CUDA call).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/merge.h"
#include "kernels/cpu/pack.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/reference_attention.h"
#include "kernels/cpu/sinks.h"
#include "kernels/cuda/cuda_kernels.h"
#include "src/core/datatype.h"

namespace attn::cuda {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Empty when a device is usable, else why not.
const std::string& noGpuReason() {
  static const std::string reason = [] {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
      return std::string("no usable CUDA device: cudaGetDeviceCount: ") + cudaGetErrorString(e);
    if (n == 0) return std::string("no CUDA device present");
    return std::string();
  }();
  return reason;
}
#define REQUIRE_GPU()                                                    \
  do {                                                                   \
    if (!noGpuReason().empty()) GTEST_SKIP() << noGpuReason();           \
  } while (0)

// A device buffer; bytes + 256 so tests can offset pointers (misalignment).
struct Dev {
  void* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t bytes) : n(bytes) { EXPECT_EQ(cudaMalloc(&p, bytes + 256), cudaSuccess); }
  template <class T>
  explicit Dev(const std::vector<T>& h) : Dev(h.size() * sizeof(T)) { up(h.data(), n); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void up(const void* h, size_t bytes, size_t off = 0) {
    EXPECT_EQ(cudaMemcpy(static_cast<char*>(p) + off, h, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  template <class T>
  std::vector<T> down(size_t count, size_t off = 0) const {
    std::vector<T> h(count);
    EXPECT_EQ(cudaMemcpy(h.data(), static_cast<const char*>(p) + off, count * sizeof(T),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    return h;
  }
  template <class T> T* as(size_t off = 0) const {
    return reinterpret_cast<T*>(static_cast<char*>(p) + off);
  }
};

void sync() { ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess); }

// Random values rounded to `t`, as raw bytes.
std::vector<char> randomBytes(attnDataType_t t, size_t n, std::mt19937& rng, float lo = -1, float hi = 1) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> f(n);
  for (auto& x : f) x = u(rng);
  std::vector<char> b(n * dataTypeSize(t) + 1);
  EXPECT_EQ(cpu::convertFromFloat(b.data(), t, f.data(), n), attnSuccess);
  return b;
}

const char* dtName(attnDataType_t t) { return dataTypeName(t); }

// ---- attention ------------------------------------------------------------------

struct Case {
  int nq = 0, nk = 0, hq = 1, hkv = 1, d = 64;
  int dv = 0;  // head dim of V and O (MLA); 0: d
  int vdim() const { return dv > 0 ? dv : d; }
  attnDataType_t dtype = attnBfloat16;
  bool causal = false;
  int window_left = -1, window_right = -1;  // AttnProblem's sliding window
  float softcap = 0.0f;
  bool force_generic = false;
  bool force_wmma = false;             // the WMMA kernel instead of the mma.sync one
  int key_splits = 0;                  // AttnCudaExec::key_splits
  std::vector<cpu::AttnSegment> segs;  // empty: one segment
  std::vector<int32_t> qpos, kpos;
  std::string name() const {
    return std::string(dtName(dtype)) + " nq " + std::to_string(nq) + " nk " + std::to_string(nk) +
           " hq " + std::to_string(hq) + " hkv " + std::to_string(hkv) + " d " + std::to_string(d) +
           (dv > 0 ? " dv " + std::to_string(dv) : "") + (causal ? " causal" : "") +
           (window_left >= 0 || window_right >= 0
                ? " window " + std::to_string(window_left) + "," + std::to_string(window_right)
                : "") +
           (softcap != 0.0f ? " softcap " + std::to_string(softcap) : "") + (force_generic ? " simt" : "") + (force_wmma ? " wmma" : "") +
           (key_splits ? " splits " + std::to_string(key_splits) : "") +
           (segs.empty() ? "" : " segs " + std::to_string(segs.size()));
  }
};

Case selfAttn(int t, int hq, int hkv, int d, bool causal, attnDataType_t dt) {
  Case c;
  c.nq = c.nk = t;
  c.hq = hq;
  c.hkv = hkv;
  c.d = d;
  c.causal = causal;
  c.dtype = dt;
  for (int i = 0; i < t; ++i) c.qpos.push_back(i), c.kpos.push_back(i);
  return c;
}

// A causal decode step: one query row per sequence, at the last position
// of its `keys` keys.
Case decodeStep(int hq, int hkv, int d, attnDataType_t dt, std::initializer_list<int> keys) {
  Case c;
  c.hq = hq, c.hkv = hkv, c.d = d, c.causal = true, c.dtype = dt;
  for (int n : keys) {
    c.segs.push_back({c.nq, c.nq + 1, c.nk, c.nk + n});
    c.qpos.push_back(n - 1);
    for (int j = 0; j < n; ++j) c.kpos.push_back(j);
    ++c.nq;
    c.nk += n;
  }
  return c;
}

// Tolerances: fp32 and the SIMT path compute in fp32 from exact inputs; the
// tensor-core path rounds the softmax weights to the input type (as flash
// attention does), DESIGN.md §4's bf16/fp16 bound.
double tolerance(const Case& c, bool tensor_cores) {
  if (!tensor_cores) return 2e-5;
  return c.dtype == attnBfloat16 ? 1e-2 : 5e-3;
}

struct HostProblem {
  std::vector<char> q, k, v;
  cpu::AttnProblem p;  // host pointers: for the reference
  HostProblem(const Case& c, uint32_t seed) {
    std::mt19937 rng(seed);
    q = randomBytes(c.dtype, size_t(c.nq) * c.hq * c.d, rng);
    k = randomBytes(c.dtype, size_t(c.nk) * c.hkv * c.d, rng);
    v = randomBytes(c.dtype, size_t(c.nk) * c.hkv * c.vdim(), rng);
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
    p.scale = 4.0f / std::sqrt(float(c.d));  // peaked softmax: errors stay visible
    p.causal = c.causal;
    p.window_left = c.window_left;
    p.window_right = c.window_right;
    p.softcap = c.softcap;
    p.q_pos = c.qpos.empty() ? nullptr : c.qpos.data();
    p.k_pos = c.kpos.empty() ? nullptr : c.kpos.data();
    p.segments = c.segs.empty() ? nullptr : c.segs.data();
    p.num_segments = int32_t(c.segs.size());
  }
};

// The same problem in device memory.
struct DevProblem {
  Dev q, k, v, qpos, kpos, segs;
  cpu::AttnProblem p;
  DevProblem(const HostProblem& h, const Case& c)
      : q(h.q), k(h.k), v(h.v), qpos(std::max<size_t>(c.qpos.size(), 1) * 4),
        kpos(std::max<size_t>(c.kpos.size(), 1) * 4), segs(std::max<size_t>(c.segs.size(), 1) * 16) {
    if (!c.qpos.empty()) qpos.up(c.qpos.data(), c.qpos.size() * 4);
    if (!c.kpos.empty()) kpos.up(c.kpos.data(), c.kpos.size() * 4);
    if (!c.segs.empty()) segs.up(c.segs.data(), c.segs.size() * sizeof(cpu::AttnSegment));
    p = h.p;
    p.q = q.p;
    p.k = k.p;
    p.v = v.p;
    p.q_pos = c.qpos.empty() ? nullptr : qpos.as<int32_t>();
    p.k_pos = c.kpos.empty() ? nullptr : kpos.as<int32_t>();
    p.segments = c.segs.empty() ? nullptr : segs.as<cpu::AttnSegment>();
  }
};

// Tile counts the kernel must report, from the same rule on the host.
AttnCudaStats expectedTiles(const Case& c, const AttnCudaPlan& plan) {
  AttnCudaStats s{};
  const cpu::VisibleSpan span = cpu::visibleSpan(c.causal, c.window_left, c.window_right);
  std::vector<cpu::AttnSegment> segs = c.segs;
  if (segs.empty()) segs.push_back({0, c.nq, 0, c.nk});
  for (const auto& g : segs) {
    for (int q0 = g.q_begin; q0 < g.q_end; q0 += plan.block_q) {
      const int q1 = std::min(g.q_end, q0 + plan.block_q);
      int64_t qlo = INT32_MAX, qhi = INT32_MIN;
      if (span.bounded)
        for (int i = q0; i < q1; ++i) qlo = std::min<int64_t>(qlo, c.qpos[i]), qhi = std::max<int64_t>(qhi, c.qpos[i]);
      for (int k0 = g.k_begin; k0 < g.k_end; k0 += plan.block_k) {
        const int k1 = std::min(g.k_end, k0 + plan.block_k);
        int64_t klo = INT32_MAX, khi = INT32_MIN;
        if (span.bounded)
          for (int j = k0; j < k1; ++j) klo = std::min<int64_t>(klo, c.kpos[j]), khi = std::max<int64_t>(khi, c.kpos[j]);
        // Skipped when no key can be seen by any query (by the bounds),
        // full when every key is seen by every query.
        const bool none = klo > qhi + span.hi || khi < qlo - span.lo;
        const bool all = khi <= qlo + span.hi && klo >= qhi - span.lo;
        unsigned long long& slot =
            !span.bounded || all ? s.tiles_full : (none ? s.tiles_skipped : s.tiles_masked);
        slot += unsigned(c.hq);
      }
    }
  }
  return s;
}

// Runs a case on the device, checks it against the double reference and
// the tile counts against the host's prediction.
void checkCase(const Case& c, uint32_t seed = 1, AttnCudaStats* tiles = nullptr) {
  SCOPED_TRACE(c.name());
  HostProblem h(c, seed);
  DevProblem dp(h, c);
  const size_t rows = size_t(c.nq) * c.hq, dv = size_t(c.vdim());
  Dev o(rows * dv * 4 + 4), lse(rows * 4 + 4), stats(sizeof(AttnCudaStats));
  // NaN everywhere first: every row must be written.
  ASSERT_EQ(cudaMemset(o.p, 0xff, o.n), cudaSuccess);
  ASSERT_EQ(cudaMemset(lse.p, 0xff, lse.n), cudaSuccess);
  ASSERT_EQ(cudaMemset(stats.p, 0, stats.n), cudaSuccess);
  AttnCudaExec ex;
  ex.stats = stats.as<AttnCudaStats>();
  ex.force_generic = c.force_generic;
  ex.force_wmma = c.force_wmma;
  ex.key_splits = c.key_splits;
  AttnCudaPlan plan;
  ASSERT_EQ(attentionPlan(dp.p, ex, &plan), attnSuccess);
  ASSERT_EQ(attentionPartial(dp.p, o.as<float>(), lse.as<float>(), ex), attnSuccess);
  sync();
  const auto go = o.down<float>(rows * dv);
  const auto gl = lse.down<float>(rows);
  std::vector<double> ro(rows * dv), rl(rows);
  ASSERT_EQ(cpu::referenceAttention(h.p, ro.data(), rl.data()), attnSuccess);
  const cpu::AttnErrors e = cpu::compareAttention(go.data(), gl.data(), ro.data(), rl.data(), rows, int(dv));
  const double tol = tolerance(c, plan.tensor_cores);
  EXPECT_EQ(e.nan_values, 0);
  EXPECT_EQ(e.empty_mismatch, 0);
  EXPECT_LE(e.max_o_rel, tol) << attnCudaKernelName(plan.kernel);
  EXPECT_LE(e.max_lse_abs, tol);  // an LSE error d is a relative error d of the denominator
  if (c.nq > 0 && c.nk > 0) {
    const auto got = stats.down<AttnCudaStats>(1)[0];
    const AttnCudaStats want = expectedTiles(c, plan);
    EXPECT_EQ(got.tiles_full, want.tiles_full);
    EXPECT_EQ(got.tiles_masked, want.tiles_masked);
    EXPECT_EQ(got.tiles_skipped, want.tiles_skipped);
    if (tiles) *tiles = got;
  }
}

TEST(CudaAttention, ShapesDtypesGqaCausal) {
  REQUIRE_GPU();
  for (attnDataType_t dt : {attnBfloat16, attnFloat16, attnFloat32})
    for (int d : {64, 128, 256})
      for (auto [hq, hkv] : {std::pair{4, 4}, std::pair{8, 2}, std::pair{8, 1}})
        for (bool causal : {false, true})
          for (bool wmma : {false, true}) {
            if (wmma && dt == attnFloat32) continue;  // fp32 runs on SIMT either way
            Case c = selfAttn(131, hq, hkv, d, causal, dt);
            c.force_wmma = wmma;
            checkCase(c);
          }
}

// Which kernel a problem gets: mma.sync for 16-bit inputs and the head
// sizes it is built for, WMMA when asked for, SIMT for fp32, odd head
// sizes, unaligned tensors or when asked for; and the mma kernel's CTA
// shape under GQA.
TEST(CudaAttention, KernelChoice) {
  REQUIRE_GPU();
  int dev = 0, major = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), cudaSuccess);
  if (major < 8) GTEST_SKIP() << "tensor-core kernels need sm_80+";
  auto planOf = [](const Case& c, AttnCudaExec ex, bool misalign = false) {
    HostProblem h(c, 1);
    DevProblem dp(h, c);
    if (misalign) dp.p.k = static_cast<const char*>(dp.p.k) + 2;
    AttnCudaPlan plan{};
    EXPECT_EQ(attentionPlan(dp.p, ex, &plan), attnSuccess);
    return plan.kernel;
  };
  AttnCudaExec plain, wmma, generic;
  wmma.force_wmma = true;
  generic.force_generic = true;
  for (attnDataType_t dt : {attnBfloat16, attnFloat16})
    for (int d : {64, 128}) {
      const Case c = selfAttn(70, 2, 1, d, true, dt);
      EXPECT_EQ(planOf(c, plain), AttnCudaKernel::mma) << c.name();
      EXPECT_EQ(planOf(c, wmma), AttnCudaKernel::wmma) << c.name();
      EXPECT_EQ(planOf(c, generic), AttnCudaKernel::simt) << c.name();
      EXPECT_EQ(planOf(c, plain, true), AttnCudaKernel::simt) << c.name() << " unaligned k";
    }
  EXPECT_EQ(planOf(selfAttn(70, 2, 1, 128, true, attnFloat32), plain), AttnCudaKernel::simt);
  // GQA packing: the group's heads (at most 64) share a CTA's 64 rows.
  for (auto [hq, hkv, heads, rows] : {std::tuple{8, 8, 1, 64}, std::tuple{8, 2, 4, 16},
                                      std::tuple{6, 1, 6, 10}, std::tuple{80, 1, 64, 1}}) {
    const Case c = selfAttn(10, hq, hkv, 64, false, attnBfloat16);
    HostProblem h(c, 1);
    DevProblem dp(h, c);
    AttnCudaPlan plan{};
    ASSERT_EQ(attentionPlan(dp.p, plain, &plan), attnSuccess);
    EXPECT_EQ(plan.heads_per_block, heads) << c.name();
    EXPECT_EQ(plan.block_q, rows) << c.name();
    ASSERT_EQ(attentionPlan(dp.p, wmma, &plan), attnSuccess);
    EXPECT_EQ(plan.heads_per_block, 1) << c.name() << " wmma";
    EXPECT_EQ(plan.block_q, 64) << c.name() << " wmma";
  }
  EXPECT_EQ(planOf(selfAttn(70, 2, 1, 96, true, attnBfloat16), plain), AttnCudaKernel::simt);
}

// GQA groups of any size: the mma kernel packs a group's heads as rows of a
// CTA (64 / group query rows each), so groups that do not divide 64 leave
// rows empty, and a group of more than 64 heads spans two CTAs. Prefill
// rows and decode rows (one per sequence, split-K) of each.
TEST(CudaAttention, GqaGroupsOfAnySize) {
  REQUIRE_GPU();
  for (auto [hq, hkv] : {std::pair{6, 2}, std::pair{5, 1}, std::pair{14, 2}, std::pair{80, 1}}) {
    checkCase(selfAttn(45, hq, hkv, 64, true, attnBfloat16));
    checkCase(decodeStep(hq, hkv, 64, attnFloat16, {700, 90}));
  }
}

TEST(CudaAttention, SimtPathAndOddHeadDims) {
  REQUIRE_GPU();
  for (attnDataType_t dt : {attnBfloat16, attnFloat16}) {
    Case c = selfAttn(97, 4, 2, 128, true, dt);
    c.force_generic = true;
    checkCase(c);
  }
  for (int d : {1, 40, 96, 200, 256})
    for (attnDataType_t dt : {attnFloat32, attnBfloat16}) checkCase(selfAttn(70, 2, 1, d, true, dt));
}

TEST(CudaAttention, QueriesAgainstLongerCache) {
  REQUIRE_GPU();
  // Partial prefill: 100 new tokens at positions 400.. over 500 keys.
  for (attnDataType_t dt : {attnBfloat16, attnFloat32}) {
    Case c;
    c.nq = 100, c.nk = 500, c.hq = 8, c.hkv = 2, c.d = 128, c.causal = true, c.dtype = dt;
    for (int i = 0; i < c.nq; ++i) c.qpos.push_back(400 + i);
    for (int j = 0; j < c.nk; ++j) c.kpos.push_back(j);
    checkCase(c);
  }
}

// Unsorted positions: tiles are skipped by their actual min / max, and a
// query whose position precedes every key sees nothing (O = 0, LSE = -inf).
TEST(CudaAttention, UnsortedPositionsAndFullyMaskedRows) {
  REQUIRE_GPU();
  std::mt19937 rng(7);
  for (attnDataType_t dt : {attnBfloat16, attnFloat16, attnFloat32}) {
    Case c;
    c.nq = 200, c.nk = 300, c.hq = 4, c.hkv = 1, c.d = 64, c.causal = true, c.dtype = dt;
    // Keys: blocks of 64 with disjoint position ranges in shuffled block order.
    std::vector<int> blocks(5);
    std::iota(blocks.begin(), blocks.end(), 0);
    std::shuffle(blocks.begin(), blocks.end(), rng);
    for (int j = 0; j < c.nk; ++j) c.kpos.push_back(100 + blocks[j / 64] * 1000 + (j * 37) % 64);
    // Queries: shuffled positions, some before every key (fully masked rows).
    for (int i = 0; i < c.nq; ++i) c.qpos.push_back(i % 7 == 0 ? i % 50 : int(rng() % 5200));
    std::shuffle(c.qpos.begin() + 64, c.qpos.end(), rng);
    checkCase(c);
    c.force_wmma = true;
    checkCase(c);
    c.force_wmma = false;
    c.force_generic = true;
    checkCase(c);
  }
}

// Packed variable-length batch: empty query and key ranges, rows outside
// every segment, load-balanced shards (two chunks per sequence).
TEST(CudaAttention, VariableLengthSegments) {
  REQUIRE_GPU();
  for (attnDataType_t dt : {attnBfloat16, attnFloat32}) {
    Case c;
    c.hq = 8, c.hkv = 2, c.d = 128, c.causal = true, c.dtype = dt;
    // (q rows, k rows, first q position, first k position)
    const int shape[][4] = {{70, 150, 80, 0}, {0, 40, 0, 0}, {33, 0, 5, 0},
                            {1, 1, 0, 0},     {129, 129, 0, 0}, {5, 300, 2, 10}};
    for (const auto& s : shape) {
      cpu::AttnSegment g{c.nq, c.nq + s[0], c.nk, c.nk + s[1]};
      for (int i = 0; i < s[0]; ++i) c.qpos.push_back(s[2] + i);
      for (int j = 0; j < s[1]; ++j) c.kpos.push_back(s[3] + j);
      c.nq += s[0];
      c.nk += s[1];
      c.segs.push_back(g);
      // 3 rows that belong to no segment between sequences.
      for (int i = 0; i < 3; ++i) c.qpos.push_back(0);
      c.nq += 3;
    }
    checkCase(c);
    c.causal = false;
    checkCase(c);
  }
}

// Split-K (flash-decoding): decode steps of a few sequences, every CTA's
// keys cut into 2, 3 or 5 chunks run apart and merged, and the launcher's
// own choice. Each row equals the reference and the tile counts are those
// of one launch (chunks are cut on key tiles): query rows at the end and
// in the middle of a sequence (later chunks fully masked for them), a
// sequence shorter than a chunk, rows outside every segment, every kernel.
TEST(CudaAttention, SplitKeysMatchTheReference) {
  REQUIRE_GPU();
  for (attnDataType_t dt : {attnBfloat16, attnFloat32})
    for (AttnCudaKernel kernel : {AttnCudaKernel::mma, AttnCudaKernel::wmma, AttnCudaKernel::simt})
      for (int splits : {0, 2, 3, 5}) {
        if (dt == attnFloat32 && kernel == AttnCudaKernel::wmma) continue;  // SIMT either way
        Case c;
        c.hq = 8, c.hkv = 1, c.d = 128, c.causal = true, c.dtype = dt;
        c.force_generic = kernel == AttnCudaKernel::simt;
        c.force_wmma = kernel == AttnCudaKernel::wmma;
        c.key_splits = splits;
        // (query positions, keys): decode rows over their sequence's keys.
        const std::vector<std::pair<std::vector<int>, int>> seqs = {{{1299, 700}, 1300}, {{40}, 41}, {{999}, 1000}};
        for (const auto& [rows, keys] : seqs) {
          c.segs.push_back({c.nq, c.nq + int(rows.size()), c.nk, c.nk + keys});
          for (int q : rows) c.qpos.push_back(q);
          for (int j = 0; j < keys; ++j) c.kpos.push_back(j);
          c.nq += int(rows.size());
          c.nk += keys;
          c.qpos.push_back(0);  // a row outside every segment
          ++c.nq;
        }
        checkCase(c);
      }
}

// Paged K/V (AttnProblem::k_rows): the keys' rows scattered over a larger
// pool in shuffled blocks of 16, every unused pool row NaN (never to be
// read). The result must be bit for bit that of the same keys contiguous,
// and match the reference: decode rows with split-K, a causal prefill
// (the tensor-core kernel where the device has one), head_dim 80 (SIMT).
void checkPagedCase(const Case& c, uint32_t seed) {
  SCOPED_TRACE(c.name());
  HostProblem h(c, seed);
  DevProblem dp(h, c);
  const int block = 16, blocks = (c.nk + block - 1) / block;
  std::vector<int> order(size_t(2 * blocks));
  for (size_t b = 0; b < order.size(); ++b) order[b] = int(b);
  std::mt19937 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int64_t> rows(size_t(c.nk));
  for (int j = 0; j < c.nk; ++j) rows[size_t(j)] = int64_t(order[size_t(j / block)]) * block + j % block;
  const size_t es = dataTypeSize(c.dtype), poolRows = order.size() * block;
  const size_t rowBytes = size_t(c.hkv) * c.d * es, vRowBytes = size_t(c.hkv) * c.vdim() * es;
  std::vector<char> pk(poolRows * rowBytes), pv(poolRows * vRowBytes);
  const std::vector<float> nans(size_t(c.hkv) * std::max(c.d, c.vdim()), std::numeric_limits<float>::quiet_NaN());
  for (size_t r = 0; r < poolRows; ++r) {
    ASSERT_EQ(cpu::convertFromFloat(pk.data() + r * rowBytes, c.dtype, nans.data(), rowBytes / es), attnSuccess);
    ASSERT_EQ(cpu::convertFromFloat(pv.data() + r * vRowBytes, c.dtype, nans.data(), vRowBytes / es), attnSuccess);
  }
  for (int j = 0; j < c.nk; ++j) {
    std::memcpy(pk.data() + size_t(rows[size_t(j)]) * rowBytes, h.k.data() + size_t(j) * rowBytes, rowBytes);
    std::memcpy(pv.data() + size_t(rows[size_t(j)]) * vRowBytes, h.v.data() + size_t(j) * vRowBytes, vRowBytes);
  }
  Dev dk(pk), dv(pv), drows(rows);
  cpu::AttnProblem paged = dp.p;
  paged.k = dk.p;
  paged.v = dv.p;
  paged.k_rows = drows.as<int64_t>();
  const size_t n = size_t(c.nq) * c.hq, vd = size_t(c.vdim());
  Dev o(n * vd * 4), lse(n * 4), po(n * vd * 4), plse(n * 4);
  AttnCudaExec ex;
  ex.force_generic = c.force_generic;
  ex.key_splits = c.key_splits;
  ASSERT_EQ(attentionPartial(dp.p, o.as<float>(), lse.as<float>(), ex), attnSuccess);
  ASSERT_EQ(attentionPartial(paged, po.as<float>(), plse.as<float>(), ex), attnSuccess);
  sync();
  const auto want = o.down<float>(n * vd), got = po.down<float>(n * vd);
  const auto wantL = lse.down<float>(n), gotL = plse.down<float>(n);
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0);
  EXPECT_EQ(std::memcmp(wantL.data(), gotL.data(), wantL.size() * 4), 0);
  std::vector<double> ro(n * vd), rl(n);
  ASSERT_EQ(cpu::referenceAttention(h.p, ro.data(), rl.data()), attnSuccess);
  AttnCudaPlan plan;
  ASSERT_EQ(attentionPlan(dp.p, ex, &plan), attnSuccess);
  const auto e = cpu::compareAttention(got.data(), gotL.data(), ro.data(), rl.data(), n, int(vd));
  EXPECT_EQ(e.nan_values, 0);
  EXPECT_LE(e.max_o_rel, tolerance(c, plan.tensor_cores));
  EXPECT_LE(e.max_lse_abs, tolerance(c, plan.tensor_cores));
}

TEST(CudaAttention, PagedKeysGiveTheBitsOfTheGatheredKeys) {
  REQUIRE_GPU();
  for (attnDataType_t dt : {attnBfloat16, attnFloat32}) {
    checkPagedCase(decodeStep(8, 1, 128, dt, {1000, 300}), 3);  // split-K
    checkPagedCase(selfAttn(150, 4, 1, 128, true, dt), 4);
    Case simt = selfAttn(70, 4, 2, 80, true, dt);
    simt.force_generic = true;
    checkPagedCase(simt, 5);
  }
}

// Folds the case's keys into an accumulator block by block (keys
// [cuts[i], cuts[i+1]) with key_splits splits[i]), then checks it against
// the reference over all of them.
void checkAccumulateInBlocks(const Case& c, uint32_t seed, const std::vector<int>& cuts,
                             const std::vector<int>& splits) {
  SCOPED_TRACE(c.name());
  HostProblem h(c, seed);
  DevProblem dp(h, c);
  const size_t rows = size_t(c.nq) * c.hq, dv = size_t(c.vdim());
  Dev o(rows * dv * 4), lse(rows * 4);
  ASSERT_EQ(initAccumulator(o.as<float>(), lse.as<float>(), c.nq, c.hq, int(dv), nullptr), attnSuccess);
  const size_t krow = size_t(c.hkv) * c.d * dataTypeSize(c.dtype), vrow = size_t(c.hkv) * dv * dataTypeSize(c.dtype);
  for (size_t b = 0; b + 1 < cuts.size(); ++b) {
    cpu::AttnProblem p = dp.p;
    p.nk = cuts[b + 1] - cuts[b];
    p.k = static_cast<const char*>(dp.p.k) + cuts[b] * krow;
    p.v = static_cast<const char*>(dp.p.v) + cuts[b] * vrow;
    p.k_pos = dp.p.k_pos + cuts[b];
    AttnCudaExec ex;
    ex.key_splits = splits[b];
    ex.force_generic = c.force_generic;
    ASSERT_EQ(attentionAccumulate(p, o.as<float>(), lse.as<float>(), ex), attnSuccess);
  }
  sync();
  std::vector<double> ro(rows * dv), rl(rows);
  ASSERT_EQ(cpu::referenceAttention(h.p, ro.data(), rl.data()), attnSuccess);
  const auto go = o.down<float>(rows * dv);
  const auto gl = lse.down<float>(rows);
  const auto e = cpu::compareAttention(go.data(), gl.data(), ro.data(), rl.data(), rows, int(dv));
  const double tol = c.dtype == attnFloat32 ? 2e-5 : 1e-2;
  EXPECT_EQ(e.nan_values, 0);
  EXPECT_EQ(e.empty_mismatch, 0);
  EXPECT_LE(e.max_o_rel, tol);
  EXPECT_LE(e.max_lse_abs, tol);
}

// Split-K folding into an accumulator that already holds the first keys
// (ring attention's second block): one query over 1500 keys.
TEST(CudaAttention, SplitKeysAccumulate) {
  REQUIRE_GPU();
  for (attnDataType_t dt : {attnBfloat16, attnFloat32}) {
    Case c = selfAttn(1, 8, 2, 128, true, dt);
    c.nk = 1500;
    c.kpos.clear();
    for (int j = 0; j < c.nk; ++j) c.kpos.push_back(j);
    c.qpos = {1499};
    checkAccumulateInBlocks(c, 9, {0, 200, 1500}, {1, 3});
  }
}

TEST(CudaAttention, AccumulateMatchesOneCall) {
  REQUIRE_GPU();
  for (attnDataType_t dt : {attnBfloat16, attnFloat32}) {
    Case c = selfAttn(150, 8, 2, 128, true, dt);
    std::shuffle(c.kpos.begin(), c.kpos.end(), std::mt19937(3));  // blocks out of order
    // Three key blocks: [0,64) [64,64) (empty) [64,150).
    checkAccumulateInBlocks(c, 5, {0, 64, 64, 150}, {0, 0, 0});
  }
}

// ---- sliding windows and softcap ------------------------------------------------

// The kernels a problem can be forced onto (fp32 runs on SIMT whatever is asked).
const AttnCudaKernel kAllKernels[] = {AttnCudaKernel::mma, AttnCudaKernel::wmma, AttnCudaKernel::simt};
Case& onKernel(Case& c, AttnCudaKernel k) {
  c.force_generic = k == AttnCudaKernel::simt;
  c.force_wmma = k == AttnCudaKernel::wmma;
  return c;
}
bool skipKernel(attnDataType_t dt, AttnCudaKernel k) { return dt == attnFloat32 && k != AttnCudaKernel::simt; }

// Sliding windows (FlashAttention's convention on global positions): left
// only, right only, both, zero-width, with causal (which caps the right side
// at the query whatever window_right says) and without; every kernel and
// dtype, GQA.
TEST(CudaAttention, SlidingWindows) {
  REQUIRE_GPU();
  const std::tuple<bool, int, int> windows[] = {{true, 20, -1}, {false, 20, -1}, {false, -1, 7}, {false, 33, 70},
                                                {true, 0, -1},  {false, 0, 0},   {true, 45, 9}};
  for (attnDataType_t dt : {attnBfloat16, attnFloat16, attnFloat32})
    for (AttnCudaKernel k : kAllKernels) {
      if (skipKernel(dt, k)) continue;
      for (auto [causal, wl, wr] : windows) {
        Case c = selfAttn(100, 4, 2, 64, causal, dt);
        c.window_left = wl, c.window_right = wr;
        checkCase(onKernel(c, k));
      }
    }
}

// Unsorted positions (duplicates too) under a window: tiles are skipped and
// masked by their actual bounds; queries whose window holds no key see
// nothing (O = 0, LSE = -inf). GQA groups of 8 and 3 (the mma kernel packs
// a group's heads into one CTA).
TEST(CudaAttention, WindowsOnUnsortedPositions) {
  REQUIRE_GPU();
  std::mt19937 rng(21);
  const std::tuple<bool, int, int> windows[] = {{true, 30, -1}, {false, 50, 20}, {false, -1, 0}, {false, 3, 3}};
  for (attnDataType_t dt : {attnBfloat16, attnFloat32})
    for (auto [hq, hkv] : {std::pair{8, 1}, std::pair{6, 2}})
      for (auto [causal, wl, wr] : windows) {
        Case c;
        c.nq = 90, c.nk = 150, c.hq = hq, c.hkv = hkv, c.d = 64, c.causal = causal, c.dtype = dt;
        c.window_left = wl, c.window_right = wr;
        for (int j = 0; j < c.nk; ++j) c.kpos.push_back(int(rng() % 400));
        for (int i = 0; i < c.nq; ++i) c.qpos.push_back(i % 11 == 0 ? 5000 + i : int(rng() % 420));
        for (AttnCudaKernel k : kAllKernels) {
          if (skipKernel(dt, k)) continue;
          checkCase(onKernel(c, k), 2);
        }
      }
}

// Packed variable-length batch under windows: empty ranges, rows outside
// every segment, load-balanced shards.
TEST(CudaAttention, WindowsOverVariableLengthSegments) {
  REQUIRE_GPU();
  for (attnDataType_t dt : {attnBfloat16, attnFloat32}) {
    Case c;
    c.hq = 4, c.hkv = 2, c.d = 64, c.dtype = dt;
    const int shape[][4] = {{70, 150, 80, 0}, {0, 40, 0, 0}, {33, 0, 5, 0}, {1, 1, 0, 0}, {40, 90, 0, 0}, {5, 200, 2, 10}};
    for (const auto& sh : shape) {
      c.segs.push_back({c.nq, c.nq + sh[0], c.nk, c.nk + sh[1]});
      for (int i = 0; i < sh[0]; ++i) c.qpos.push_back(sh[2] + i);
      for (int j = 0; j < sh[1]; ++j) c.kpos.push_back(sh[3] + j);
      c.nq += sh[0];
      c.nk += sh[1];
      for (int i = 0; i < 2; ++i) c.qpos.push_back(0);  // rows of no segment
      c.nq += 2;
    }
    for (auto [causal, wl, wr] : {std::tuple{true, 40, -1}, std::tuple{false, 25, 25}})
      for (AttnCudaKernel k : kAllKernels) {
        if (skipKernel(dt, k)) continue;
        c.causal = causal, c.window_left = wl, c.window_right = wr;
        checkCase(onKernel(c, k), 3);
      }
  }
}

// Decode steps under a sliding window with split-K: chunks wholly outside
// the window are skipped, the rest merged; the launcher's own choice too.
TEST(CudaAttention, WindowedDecodeWithSplitKeys) {
  REQUIRE_GPU();
  for (attnDataType_t dt : {attnBfloat16, attnFloat32})
    for (AttnCudaKernel k : kAllKernels)
      for (int splits : {0, 1, 3}) {
        if (skipKernel(dt, k)) continue;
        Case c = decodeStep(8, 2, 64, dt, {1300, 41, 700});
        c.window_left = 200;
        c.key_splits = splits;
        AttnCudaStats got{};
        checkCase(onKernel(c, k), 4, &got);
        EXPECT_GT(got.tiles_skipped, got.tiles_full + got.tiles_masked) << c.name();
      }
}

// A narrow window over a long cache: almost every key tile is skipped
// without being loaded, the tiles along the window run masked.
TEST(CudaAttention, NarrowWindowSkipsTiles) {
  REQUIRE_GPU();
  for (AttnCudaKernel k : kAllKernels) {
    Case c;
    c.nq = 64, c.nk = 1024, c.hq = 2, c.hkv = 1, c.d = 64, c.causal = true, c.dtype = attnFloat16;
    c.window_left = 32;
    for (int i = 0; i < c.nq; ++i) c.qpos.push_back(960 + i);
    for (int j = 0; j < c.nk; ++j) c.kpos.push_back(j);
    AttnCudaStats got{};
    checkCase(onKernel(c, k), 5, &got);
    SCOPED_TRACE(attnCudaKernelName(k));
    EXPECT_GE(got.tiles_skipped, 5 * (got.tiles_full + got.tiles_masked));  // 14 of 16 64-key tiles
    EXPECT_GT(got.tiles_masked, 0u);
  }
}

// Positions at both ends of int32 with windows as wide as int32 allows:
// the bounds are computed without overflow.
TEST(CudaAttention, WindowsAtTheEndsOfThePositionRange) {
  REQUIRE_GPU();
  for (AttnCudaKernel k : kAllKernels)
    for (bool top : {true, false}) {
      Case c;
      c.nq = 40, c.nk = 70, c.hq = 2, c.hkv = 1, c.d = 64, c.dtype = attnBfloat16;
      // Keys and queries (unsorted, some past the keys) within 80 of the end.
      for (int j = 0; j < c.nk; ++j) c.kpos.push_back(top ? INT32_MAX - j : INT32_MIN + j);
      for (int i = 0; i < c.nq; ++i) c.qpos.push_back(top ? INT32_MAX - (i * 7) % 80 : INT32_MIN + (i * 7) % 80);
      c.window_left = top ? 10 : INT32_MAX;
      c.window_right = top ? INT32_MAX : 6;
      checkCase(onKernel(c, k), 6);
      c.causal = true;  // right side capped at the query
      checkCase(onKernel(c, k), 6);
    }
}

// Softcap (Gemma 2): scaled scores s -> cap * tanh(s / cap) before the
// softmax; a small cap flattens the test's peaked scores, a large one
// hardly changes them. Causal and not, every kernel and dtype, GQA.
TEST(CudaAttention, Softcap) {
  REQUIRE_GPU();
  for (attnDataType_t dt : {attnBfloat16, attnFloat16, attnFloat32})
    for (AttnCudaKernel k : kAllKernels) {
      if (skipKernel(dt, k)) continue;
      for (float cap : {1.5f, 30.0f})
        for (bool causal : {false, true}) {
          Case c = selfAttn(70, 4, 2, 64, causal, dt);
          c.softcap = cap;
          checkCase(onKernel(c, k), 7);
        }
      Case c = selfAttn(40, 2, 2, 128, true, dt);  // another head size
      c.softcap = 2.0f;
      checkCase(onKernel(c, k), 8);
    }
}

// Window and softcap together: one call, split-K decode, and folded into
// an accumulator block by block (keys out of order).
TEST(CudaAttention, WindowAndSoftcapTogether) {
  REQUIRE_GPU();
  for (attnDataType_t dt : {attnBfloat16, attnFloat32})
    for (AttnCudaKernel k : kAllKernels) {
      if (skipKernel(dt, k)) continue;
      Case c = selfAttn(100, 4, 1, 64, true, dt);
      c.window_left = 24, c.softcap = 2.0f;
      checkCase(onKernel(c, k), 9);
      Case d = decodeStep(4, 1, 64, dt, {600, 70});
      d.window_left = 100, d.softcap = 3.0f, d.key_splits = 3;
      checkCase(onKernel(d, k), 10);
    }
  for (attnDataType_t dt : {attnBfloat16, attnFloat32}) {
    Case c = selfAttn(90, 4, 2, 64, false, dt);
    c.window_left = 30, c.window_right = 10, c.softcap = 2.5f;
    std::shuffle(c.kpos.begin(), c.kpos.end(), std::mt19937(4));
    checkAccumulateInBlocks(c, 11, {0, 30, 90}, {0, 2});
  }
}

// ---- MLA heads: V / output head dim != Q / K head dim ---------------------------------

// (head_dim, head_dim_v) pairs and where they run: DeepSeek's 192 / 128 on
// tensor cores (16-bit inputs) and on SIMT; every other pair on SIMT.
Case mla(Case c, int dv) {
  c.dv = dv;
  return c;
}

// Causal prefill of new rows over a longer cache (rows at positions
// 60.. over 100 keys), GQA: 192 / 128 on every kernel, the other pairs and
// fp32 on SIMT.
TEST(CudaAttention, MlaHeadsPrefillOverCachedKeys) {
  REQUIRE_GPU();
  auto prefill = [](int d, int dv, attnDataType_t dt) {
    Case c;
    c.nq = 40, c.nk = 100, c.hq = 4, c.hkv = 2, c.d = d, c.dv = dv, c.causal = true, c.dtype = dt;
    for (int i = 0; i < c.nq; ++i) c.qpos.push_back(60 + i);
    for (int j = 0; j < c.nk; ++j) c.kpos.push_back(j);
    return c;
  };
  for (attnDataType_t dt : {attnBfloat16, attnFloat16, attnFloat32})
    for (AttnCudaKernel k : kAllKernels) {
      if (skipKernel(dt, k)) continue;
      Case c = prefill(192, 128, dt);
      checkCase(onKernel(c, k));
    }
  for (auto [d, dv] : {std::pair{128, 64}, std::pair{64, 128}, std::pair{72, 40}})
    for (attnDataType_t dt : {attnBfloat16, attnFloat32}) checkCase(prefill(d, dv, dt));
}

// Decode steps with split-K forced (the partials' scratch, its
// initialisation and the merge are Dv wide) and chosen by the launcher.
TEST(CudaAttention, MlaHeadsDecodeWithSplitKeys) {
  REQUIRE_GPU();
  for (attnDataType_t dt : {attnBfloat16, attnFloat32})
    for (AttnCudaKernel k : {AttnCudaKernel::mma, AttnCudaKernel::simt})
      for (int splits : {0, 3}) {
        if (skipKernel(dt, k)) continue;
        Case c = mla(decodeStep(8, 1, 192, dt, {700, 90}), 128);
        c.key_splits = splits;
        checkCase(onKernel(c, k), 6);
      }
  Case odd = mla(decodeStep(4, 2, 72, attnFloat32, {600, 50}), 40);
  odd.key_splits = 2;
  checkCase(odd, 7);
}

// A sliding window (tiles skipped and masked) and packed segments with
// rows outside every segment (cleared over Dv).
TEST(CudaAttention, MlaHeadsWindowAndSegments) {
  REQUIRE_GPU();
  for (attnDataType_t dt : {attnBfloat16, attnFloat32})
    for (AttnCudaKernel k : {AttnCudaKernel::mma, AttnCudaKernel::simt}) {
      if (skipKernel(dt, k)) continue;
      Case c = mla(selfAttn(100, 4, 1, 192, true, dt), 128);
      c.window_left = 20;
      checkCase(onKernel(c, k), 8);
    }
  Case c = mla(selfAttn(70, 2, 1, 72, false, attnBfloat16), 40);
  c.window_left = 9, c.window_right = 5;
  c.segs = {{0, 30, 0, 40}, {33, 70, 40, 70}};  // rows 30..32 outside every segment
  checkCase(c, 9);
}

// Folding blocks of keys into an existing accumulator (ring attention),
// one block split-K.
TEST(CudaAttention, MlaHeadsAccumulate) {
  REQUIRE_GPU();
  for (attnDataType_t dt : {attnBfloat16, attnFloat32})
    for (bool simt : {false, true}) {
      if (dt == attnFloat32 && !simt) continue;
      Case c = mla(selfAttn(2, 4, 2, 192, true, dt), 128);
      c.nk = 1200;
      c.kpos.clear();
      for (int j = 0; j < c.nk; ++j) c.kpos.push_back(j);
      c.qpos = {1100, 1199};
      c.force_generic = simt;
      checkAccumulateInBlocks(c, 10, {0, 150, 1200}, {1, 3});
    }
  Case odd = mla(selfAttn(50, 2, 1, 72, true, attnFloat32), 40);
  std::shuffle(odd.kpos.begin(), odd.kpos.end(), std::mt19937(4));
  checkAccumulateInBlocks(odd, 11, {0, 20, 50}, {0, 0});
}

// Paged V rows are Dv wide: the same bits as the gathered keys.
TEST(CudaAttention, MlaHeadsPagedKeys) {
  REQUIRE_GPU();
  for (bool simt : {false, true}) {
    Case c = mla(decodeStep(4, 1, 192, attnBfloat16, {300, 70}), 128);
    c.key_splits = 2;
    c.force_generic = simt;
    checkPagedCase(c, 12);
  }
}

// The kernel an MLA problem gets: 192 / 128 on 16-bit inputs takes mma
// (WMMA when asked for), every other pair SIMT.
TEST(CudaAttention, MlaKernelChoice) {
  REQUIRE_GPU();
  int dev = 0, major = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), cudaSuccess);
  if (major < 8) GTEST_SKIP() << "tensor-core kernels need sm_80+";
  auto planOf = [](int d, int dv, attnDataType_t dt, AttnCudaExec ex) {
    const Case c = mla(selfAttn(70, 4, 2, d, true, dt), dv);
    HostProblem h(c, 1);
    DevProblem dp(h, c);
    AttnCudaPlan plan{};
    EXPECT_EQ(attentionPlan(dp.p, ex, &plan), attnSuccess);
    return plan;
  };
  AttnCudaExec plain, wmma;
  wmma.force_wmma = true;
  for (attnDataType_t dt : {attnBfloat16, attnFloat16}) {
    const AttnCudaPlan p = planOf(192, 128, dt, plain);
    EXPECT_EQ(p.kernel, AttnCudaKernel::mma) << dtName(dt);
    EXPECT_EQ(p.heads_per_block, 2);
    EXPECT_EQ(planOf(192, 128, dt, wmma).kernel, AttnCudaKernel::wmma) << dtName(dt);
  }
  EXPECT_EQ(planOf(192, 128, attnFloat32, plain).kernel, AttnCudaKernel::simt);
  for (auto [d, dv] : {std::pair{72, 40}, std::pair{128, 64}, std::pair{64, 128}, std::pair{192, 192},
                       std::pair{128, 192}, std::pair{256, 128}})
    EXPECT_EQ(planOf(d, dv, attnBfloat16, plain).kernel, AttnCudaKernel::simt) << d << "/" << dv;
  // head_dim_v == head_dim is the plain shape.
  EXPECT_EQ(planOf(128, 128, attnBfloat16, plain).kernel, AttnCudaKernel::mma);
}

// ---- attention sinks ----------------------------------------------------------

// applySinks against the definition in double: random rows, rows that saw
// no key (LSE -inf, NaN garbage in O: O must become 0, with or without a
// sink), a head without a
// sink (-inf), sinks far above and below the LSE; and the CPU version gives
// the same values.
TEST(CudaSinks, MatchTheDefinition) {
  REQUIRE_GPU();
  std::mt19937 rng(12);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const int64_t rows = 37;
  const int heads = 5, d = 70;
  const std::vector<float> sinks = {0.5f, kNegInf, 40.f, -30.f, 2.f};
  std::vector<float> o(size_t(rows) * heads * d), lse(size_t(rows) * heads);
  for (auto& x : o) x = u(rng);
  for (size_t i = 0; i < lse.size(); ++i) {
    lse[i] = nd(rng);
    if (i % 7 == 3) {
      lse[i] = kNegInf;
      for (int c = 0; c < d; ++c) o[i * d + c] = std::numeric_limits<float>::quiet_NaN();
    }
  }
  Dev go(o), gl(lse), gs(sinks);
  ASSERT_EQ(applySinks(go.as<float>(), gl.as<float>(), rows, heads, d, gs.as<float>(), nullptr), attnSuccess);
  sync();
  const auto got_o = go.down<float>(o.size());
  const auto got_l = gl.down<float>(lse.size());
  std::vector<float> cpu_o = o, cpu_l = lse;
  cpu::applySinks(cpu_o.data(), cpu_l.data(), rows, heads, d, sinks.data());
  for (size_t i = 0; i < lse.size(); ++i) {
    const double l = lse[i], sk = sinks[i % heads];
    double want_l, f;
    if (std::isinf(l)) want_l = sk, f = 0.0;
    else if (std::isinf(sk)) want_l = l, f = 1.0;
    else want_l = std::log(std::exp(l) + std::exp(sk)), f = std::exp(l - want_l);
    if (std::isinf(want_l)) {
      EXPECT_EQ(got_l[i], kNegInf) << i;
      EXPECT_EQ(cpu_l[i], kNegInf) << i;
    } else {
      EXPECT_NEAR(got_l[i], want_l, 1e-5 * std::max(1.0, std::fabs(want_l))) << i;
      EXPECT_NEAR(cpu_l[i], want_l, 1e-5 * std::max(1.0, std::fabs(want_l))) << i;
    }
    for (int c = 0; c < d; ++c) {
      const double want = f == 0.0 ? 0.0 : o[i * d + c] * f;
      ASSERT_NEAR(got_o[i * d + c], want, 1e-5 * std::fabs(want) + 1e-30) << i << "," << c;
      ASSERT_NEAR(cpu_o[i * d + c], want, 1e-5 * std::fabs(want) + 1e-30) << i << "," << c;
    }
  }
  EXPECT_EQ(applySinks(go.as<float>(), gl.as<float>(), 0, heads, d, gs.as<float>(), nullptr), attnSuccess);
  EXPECT_EQ(applySinks(go.as<float>(), gl.as<float>(), rows, 0, d, gs.as<float>(), nullptr), attnInvalidArgument);
  EXPECT_EQ(applySinks(go.as<float>(), gl.as<float>(), rows, heads, d, nullptr, nullptr), attnInvalidArgument);
}

// Sinks folded into an attention result equal the reference with the
// sinks in its softmax: a causal window (rows that see no key get LSE =
// their sink, O = 0) and rows outside every segment, every kernel.
TEST(CudaSinks, AfterAttentionMatchTheReference) {
  REQUIRE_GPU();
  for (AttnCudaKernel k : kAllKernels) {
    Case c = selfAttn(70, 4, 2, 64, true, attnBfloat16);
    c.window_left = 10;
    for (int i = 60; i < 70; ++i) c.qpos[size_t(i)] = -100 + i;  // before every key
    c.segs = {{0, 65, 0, 70}};  // rows 65.. outside every segment
    onKernel(c, k);
    SCOPED_TRACE(c.name());
    HostProblem h(c, 13);
    DevProblem dp(h, c);
    const std::vector<float> sinks = {0.5f, kNegInf, 3.0f, -2.0f};
    const size_t rows = size_t(c.nq) * c.hq;
    Dev o(rows * c.d * 4), lse(rows * 4), gs(sinks);
    AttnCudaExec ex;
    ex.force_generic = c.force_generic;
    ex.force_wmma = c.force_wmma;
    ASSERT_EQ(attentionPartial(dp.p, o.as<float>(), lse.as<float>(), ex), attnSuccess);
    ASSERT_EQ(applySinks(o.as<float>(), lse.as<float>(), c.nq, c.hq, c.d, gs.as<float>(), nullptr), attnSuccess);
    sync();
    std::vector<double> ro(rows * c.d), rl(rows);
    ASSERT_EQ(cpu::referenceAttention(h.p, sinks.data(), ro.data(), rl.data()), attnSuccess);
    const auto go = o.down<float>(rows * c.d);
    const auto gl = lse.down<float>(rows);
    const auto e = cpu::compareAttention(go.data(), gl.data(), ro.data(), rl.data(), rows, c.d);
    EXPECT_EQ(e.nan_values, 0);
    EXPECT_EQ(e.empty_mismatch, 0);
    EXPECT_LE(e.max_o_rel, 1e-2);
    EXPECT_LE(e.max_lse_abs, 1e-2);
    for (int i = 60; i < 70; ++i)  // saw no key: the sink alone
      for (int hd = 0; hd < c.hq; ++hd) EXPECT_EQ(gl[size_t(i) * c.hq + hd], sinks[size_t(hd)]) << i << "," << hd;
  }
}

// ---- merge --------------------------------------------------------------------

// Random partials (some rows -inf with NaN garbage in O), merged on the
// device and by kernels/cpu/merge.h.
TEST(CudaMerge, MatchesCpuMerge) {
  REQUIRE_GPU();
  std::mt19937 rng(11);
  for (int nparts : {0, 1, 3, 11})
    for (int d : {128, 37})
      for (bool misalign : {false, true}) {
        SCOPED_TRACE("parts " + std::to_string(nparts) + " d " + std::to_string(d) +
                     (misalign ? " misaligned" : ""));
        const size_t rows = 777;
        std::uniform_real_distribution<float> u(-3, 3);
        auto makeRows = [&](std::vector<float>& o, std::vector<float>& l) {
          o.resize(rows * d);
          l.resize(rows);
          for (auto& x : o) x = u(rng);
          for (size_t r = 0; r < rows; ++r) {
            l[r] = r % 5 == 0 ? kNegInf : u(rng) * 4;
            if (l[r] == kNegInf)
              for (int i = 0; i < d; ++i) o[r * d + i] = std::numeric_limits<float>::quiet_NaN();
          }
        };
        std::vector<float> acc_o, acc_l;
        makeRows(acc_o, acc_l);
        for (size_t r = 0; r < rows; r += 3) acc_l[r] = kNegInf, acc_o[r * d] = 1e30f;
        std::vector<std::vector<char>> host_o(nparts);
        std::vector<std::vector<float>> host_l(nparts);
        std::vector<cpu::AttnPartialRef> cparts(nparts), gparts(nparts);
        std::vector<std::unique_ptr<Dev>> dev;
        const size_t off = misalign ? 4 : 0;
        for (int j = 0; j < nparts; ++j) {
          std::vector<float> of;
          makeRows(of, host_l[j]);
          const attnDataType_t t = j % 3 == 0 ? attnFloat32 : (j % 3 == 1 ? attnBfloat16 : attnFloat16);
          host_o[j].resize(rows * d * dataTypeSize(t));
          ASSERT_EQ(cpu::convertFromFloat(host_o[j].data(), t, of.data(), rows * d), attnSuccess);
          cparts[j] = {host_o[j].data(), t, host_l[j].data()};
          dev.push_back(std::make_unique<Dev>(host_o[j].size()));
          dev.back()->up(host_o[j].data(), host_o[j].size(), off);
          dev.push_back(std::make_unique<Dev>(host_l[j]));
          gparts[j] = {dev[dev.size() - 2]->as<char>(off), t, dev.back()->as<float>()};
        }
        Dev go(rows * d * 4), gl(acc_l);
        go.up(acc_o.data(), rows * d * 4, off);
        ASSERT_EQ(mergePartials(go.as<float>(off), gl.as<float>(), gparts.data(), nparts, rows, d, nullptr),
                  attnSuccess);
        ASSERT_EQ(cpu::mergePartials(acc_o.data(), acc_l.data(), cparts.data(), nparts, rows, d), attnSuccess);
        sync();
        const auto o = go.down<float>(rows * d, off);
        const auto l = gl.down<float>(rows);
        size_t bad = 0;
        for (size_t r = 0; r < rows; ++r) {
          if (std::isnan(l[r]) || (l[r] != acc_l[r] && std::fabs(l[r] - acc_l[r]) > 1e-5f)) ++bad;
          for (int i = 0; i < d; ++i) {
            const float a = o[r * d + i], b = acc_o[r * d + i];
            if (std::isnan(a) || std::fabs(a - b) > 1e-5f * (1 + std::fabs(b))) ++bad;
          }
        }
        EXPECT_EQ(bad, 0u);
      }
}

TEST(CudaMerge, FoldRowsByIndex) {
  REQUIRE_GPU();
  const int heads = 4, d = 64;
  const size_t acc_tokens = 50, ntok = 20;
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> ao(acc_tokens * heads * d), al(acc_tokens * heads), po(ntok * heads * d),
      pl(ntok * heads);
  for (auto& x : ao) x = u(rng);
  for (auto& x : al) x = u(rng);
  for (auto& x : po) x = u(rng);
  for (auto& x : pl) x = u(rng);
  std::vector<int32_t> idx(ntok);
  for (size_t t = 0; t < ntok; ++t) idx[t] = int32_t((t * 7) % acc_tokens);
  Dev gao(ao), gal(al), gpo(po), gpl(pl), gidx(idx);
  // One more token with an index out of range: skipped on the device.
  std::vector<int32_t> idx_bad = idx;
  idx_bad.back() = 1000;
  Dev gidx_bad(idx_bad);
  cpu::AttnPartialRef part{gpo.p, attnFloat32, gpl.as<float>()};
  ASSERT_EQ(foldPartialRows(gao.as<float>(), gal.as<float>(), part, gidx_bad.as<int32_t>(), ntok,
                            acc_tokens, heads, d, nullptr),
            attnSuccess);
  cpu::AttnPartialRef cpart{po.data(), attnFloat32, pl.data()};
  ASSERT_EQ(cpu::foldPartialRows(ao.data(), al.data(), cpart, idx.data(), ntok - 1, heads, d), attnSuccess);
  sync();
  const auto o = gao.down<float>(ao.size());
  const auto l = gal.down<float>(al.size());
  for (size_t i = 0; i < ao.size(); ++i) ASSERT_NEAR(o[i], ao[i], 1e-5f) << i;
  for (size_t i = 0; i < al.size(); ++i) ASSERT_NEAR(l[i], al[i], 1e-5f) << i;
}

// ---- pack -----------------------------------------------------------------------

TEST(CudaPack, GatherScatterMatchCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(4);
  for (size_t row_bytes : {size_t(6), size_t(12), size_t(256), size_t(4096)}) {
    SCOPED_TRACE("row_bytes " + std::to_string(row_bytes));
    const size_t nsrc = 300, n = 123;
    std::vector<unsigned char> src(nsrc * row_bytes);
    for (auto& b : src) b = (unsigned char)rng();
    std::vector<int32_t> idx(n);
    for (auto& i : idx) i = int32_t(rng() % nsrc);
    std::vector<unsigned char> want(n * row_bytes);
    cpu::gatherRows(want.data(), src.data(), idx.data(), n, row_bytes);
    Dev gs(src), gi(idx), gd(n * row_bytes);
    ASSERT_EQ(gatherRows(gd.p, gs.p, gi.as<int32_t>(), n, nsrc, row_bytes, nullptr), attnSuccess);
    sync();
    EXPECT_EQ(gd.down<unsigned char>(want.size()), want);

    // Scatter distinct indices back; an out-of-range index is skipped.
    std::vector<int32_t> perm(nsrc);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    perm.resize(n);
    std::vector<unsigned char> dst(nsrc * row_bytes, 0xab);
    cpu::scatterRows(dst.data(), want.data(), perm.data(), n, row_bytes);
    std::vector<int32_t> perm_bad = perm;
    perm_bad.push_back(-1);
    Dev gp(perm_bad), gdst(std::vector<unsigned char>(nsrc * row_bytes, 0xab)), gsrc(want.size() + row_bytes);
    gsrc.up(want.data(), want.size());
    ASSERT_EQ(scatterRows(gdst.p, gsrc.p, gp.as<int32_t>(), n + 1, nsrc, row_bytes, nullptr), attnSuccess);
    sync();
    EXPECT_EQ(gdst.down<unsigned char>(dst.size()), dst);
  }
}

// The device key table equals the CPU's, for block sizes below, at and
// above one warp (a block of threads walks a block's keys), with a partial
// block between full ones and bad entries that must be skipped.
TEST(CudaPack, KeyTableMatchesCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(6);
  for (int bt : {1, 16, 33, 160}) {
    SCOPED_TRACE("block_tokens " + std::to_string(bt));
    const size_t slots = 40;
    std::vector<int32_t> slotPos(slots * size_t(bt));
    for (auto& p : slotPos) p = int32_t(rng() % 100000);
    std::vector<int32_t> order(slots);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<cpu::KeyBlock> blocks;
    int32_t at = 0;
    for (size_t b = 0; b < 25; ++b) {
      const int32_t tokens = b == 7 ? bt / 2 + 1 : bt;
      blocks.push_back({order[b], at, tokens});
      at += tokens;
    }
    blocks.push_back({int64_t(slots), at, bt});  // out of range
    blocks.push_back({0, at, bt + 1});           // more tokens than a block
    std::vector<int64_t> wantRows(size_t(at) + 8, -1);
    std::vector<int32_t> wantPos(size_t(at) + 8, -1);
    cpu::gatherKeyTable(wantRows.data(), wantPos.data(), blocks.data(), blocks.size(), bt, slotPos.data(), slots);
    Dev gb(blocks), gp(slotPos), gr(wantRows.size() * 8), gq(wantPos.size() * 4);
    gr.up(std::vector<int64_t>(wantRows.size(), -1).data(), wantRows.size() * 8);
    gq.up(std::vector<int32_t>(wantPos.size(), -1).data(), wantPos.size() * 4);
    ASSERT_EQ(gatherKeyTable(gr.as<int64_t>(), gq.as<int32_t>(), gb.as<cpu::KeyBlock>(), blocks.size(), bt,
                             gp.as<int32_t>(), slots, nullptr),
              attnSuccess);
    sync();
    EXPECT_EQ(gr.down<int64_t>(wantRows.size()), wantRows);
    EXPECT_EQ(gq.down<int32_t>(wantPos.size()), wantPos);
  }
}

// ---- reductions --------------------------------------------------------------------

std::vector<char> randomOfType(attnDataType_t t, size_t n, std::mt19937& rng) {
  std::vector<char> b(n * dataTypeSize(t));
  if (t == attnFloat16 || t == attnBfloat16 || t == attnFloat32) return randomBytes(t, n, rng, -4, 4);
  if (t == attnFloat64) {
    std::uniform_real_distribution<double> u(-4, 4);
    for (size_t i = 0; i < n; ++i) {
      const double x = u(rng);
      std::memcpy(b.data() + i * 8, &x, 8);
    }
    return b;
  }
  for (auto& c : b) c = char(rng());  // integers: any bits, wrapping included
  return b;
}

// Equal bits, or both NaN (payloads may differ between CPU and GPU rounding).
bool sameValue(attnDataType_t t, const char* a, const char* b) {
  const size_t s = dataTypeSize(t);
  if (std::memcmp(a, b, s) == 0) return true;
  auto isNan = [&](const char* p) {
    uint16_t h;
    float f;
    double d;
    switch (t) {
      case attnFloat16: std::memcpy(&h, p, 2); return (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
      case attnBfloat16: std::memcpy(&h, p, 2); return (h & 0x7f80) == 0x7f80 && (h & 0x7f);
      case attnFloat32: std::memcpy(&f, p, 4); return std::isnan(f);
      case attnFloat64: std::memcpy(&d, p, 8); return std::isnan(d);
      default: return false;
    }
  };
  return isNan(a) && isNan(b);
}

// Each LSE convention: the value scaled by log2(e) for base 2, the element
// moved to [h, r] for head-major; -inf stays -inf. Grids of one block and
// of several (rows x heads above 256), heads not a power of two.
TEST(CudaLse, EveryConventionFromNatural) {
  REQUIRE_GPU();
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 3.f);
  for (auto [rows, heads] : {std::pair<int64_t, int>{1, 1}, {5, 3}, {300, 7}}) {
    std::vector<float> nat(size_t(rows) * heads);
    for (auto& x : nat) x = nd(rng);
    nat[0] = kNegInf;
    Dev src(nat);
    for (bool base2 : {false, true})
      for (bool hm : {false, true}) {
        SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(heads) + (base2 ? " base2" : " e") +
                     (hm ? " head-major" : " token-major"));
        Dev dst(nat.size() * 4);
        ASSERT_EQ(writeLse(dst.as<float>(), src.as<float>(), rows, heads, base2, hm, nullptr), attnSuccess);
        sync();
        const std::vector<float> got = dst.down<float>(nat.size());
        for (int64_t r = 0; r < rows; ++r)
          for (int h = 0; h < heads; ++h) {
            const float want = nat[size_t(r) * heads + h] * (base2 ? 1.4426950408889634f : 1.f);
            const float g = got[hm ? size_t(h) * rows + r : size_t(r) * heads + h];
            if (std::isinf(want)) EXPECT_TRUE(std::isinf(g) && g < 0) << r << "," << h;
            else EXPECT_FLOAT_EQ(g, want) << r << "," << h;
          }
      }
  }
  // In place is fine token-major, refused head-major.
  Dev buf(std::vector<float>{1.f, 2.f});
  ASSERT_EQ(writeLse(buf.as<float>(), buf.as<float>(), 1, 2, true, false, nullptr), attnSuccess);
  sync();
  EXPECT_FLOAT_EQ(buf.down<float>(2)[1], 2.f * 1.4426950408889634f);
  EXPECT_EQ(writeLse(buf.as<float>(), buf.as<float>(), 1, 2, false, true, nullptr), attnInvalidArgument);
}

TEST(CudaReduce, AllTypesAndOpsMatchCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(9);
  for (int ti = 0; ti < attnNumTypes; ++ti)
    for (int oi = 0; oi < attnNumOps; ++oi)
      for (size_t off_elems : {size_t(0), size_t(1)}) {  // 1: the unaligned (scalar) path
        const auto t = attnDataType_t(ti);
        const auto op = attnRedOp_t(oi);
        SCOPED_TRACE(std::string(dataTypeName(t)) + " " + redOpName(op) + " offset " +
                     std::to_string(off_elems));
        const size_t n = 4099, es = dataTypeSize(t), off = off_elems * es;
        auto a = randomOfType(t, n, rng), b = randomOfType(t, n, rng);
        if (t == attnFloat32) {  // NaN must win max / min on either side
          const float nan = std::numeric_limits<float>::quiet_NaN();
          std::memcpy(a.data() + 4 * 10, &nan, 4);
          std::memcpy(b.data() + 4 * 20, &nan, 4);
        }
        Dev ga(n * es), gb(n * es);
        ga.up(a.data(), n * es, off);
        gb.up(b.data(), n * es, off);
        ASSERT_EQ(reduceInto(ga.as<char>(off), gb.as<char>(off), n, t, op, nullptr), attnSuccess);
        if (op == attnAvg) ASSERT_EQ(divideInPlace(ga.as<char>(off), n, t, 3, nullptr), attnSuccess);
        sync();
        cpu::reduceInto(a.data(), b.data(), n, t, op);
        if (op == attnAvg) cpu::divideInPlace(a.data(), n, t, 3);
        const auto got = ga.down<char>(n * es, off);
        size_t bad = 0;
        for (size_t i = 0; i < n; ++i) bad += !sameValue(t, got.data() + i * es, a.data() + i * es);
        EXPECT_EQ(bad, 0u);
      }
}

TEST(CudaReduce, ConvertRoundTrip) {
  REQUIRE_GPU();
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-70000, 70000);
  const size_t n = 1001;
  std::vector<float> f(n);
  for (auto& x : f) x = u(rng);
  for (attnDataType_t t : {attnFloat16, attnBfloat16, attnFloat32}) {
    std::vector<char> want(n * dataTypeSize(t));
    ASSERT_EQ(cpu::convertFromFloat(want.data(), t, f.data(), n), attnSuccess);
    Dev gf(f), gn(want.size()), gback(n * 4);
    ASSERT_EQ(convertFromFloat(gn.p, t, gf.as<float>(), n, nullptr), attnSuccess);
    ASSERT_EQ(convertToFloat(gback.as<float>(), gn.p, t, n, nullptr), attnSuccess);
    sync();
    EXPECT_EQ(gn.down<char>(want.size()), want) << dataTypeName(t);
    std::vector<float> back(n);
    ASSERT_EQ(cpu::convertToFloat(back.data(), want.data(), t, n), attnSuccess);
    EXPECT_EQ(gback.down<float>(n), back) << dataTypeName(t);
  }
}

// ---- argument checking (host only: runs without a device) ----------------------------

TEST(CudaKernelsArgs, BadInputIsRefusedBeforeAnyLaunch) {
  cpu::AttnProblem p;
  p.nq = p.nk = 4;
  p.num_q_heads = 6;
  p.num_kv_heads = 4;  // not a divisor
  p.head_dim = 64;
  float dummy[4];
  p.q = p.k = p.v = dummy;
  EXPECT_EQ(attentionPartial(p, dummy, dummy, AttnCudaExec{}), attnInvalidArgument);
  p.num_kv_heads = 2;
  p.head_dim = 300;
  EXPECT_EQ(attentionPartial(p, dummy, dummy, AttnCudaExec{}), attnInvalidArgument);
  p.head_dim = 64;
  for (int dv : {-1, 257}) {  // head_dim_v: 0 (head_dim) or 1..256
    p.head_dim_v = dv;
    EXPECT_EQ(attentionPartial(p, dummy, dummy, AttnCudaExec{}), attnInvalidArgument) << dv;
  }
  p.head_dim_v = 0;
  p.dtype = attnInt32;
  EXPECT_EQ(attentionPartial(p, dummy, dummy, AttnCudaExec{}), attnInvalidArgument);
  p.dtype = attnBfloat16;
  p.causal = true;  // no positions
  EXPECT_EQ(attentionPartial(p, dummy, dummy, AttnCudaExec{}), attnInvalidArgument);
  // Windows below -1, a negative, NaN or infinite softcap; a window needs positions.
  p.causal = false;
  const int32_t pos[4] = {};
  p.q_pos = p.k_pos = pos;
  for (auto [wl, wr, cap] : {std::tuple{-2, -1, 0.f}, std::tuple{-1, -5, 0.f}, std::tuple{3, 3, -1.f},
                             std::tuple{-1, -1, std::numeric_limits<float>::quiet_NaN()},
                             std::tuple{-1, -1, std::numeric_limits<float>::infinity()}}) {
    p.window_left = wl, p.window_right = wr, p.softcap = cap;
    EXPECT_EQ(attentionPartial(p, dummy, dummy, AttnCudaExec{}), attnInvalidArgument) << wl << " " << wr << " " << cap;
  }
  p.softcap = 0.0f;
  p.q_pos = p.k_pos = nullptr;
  for (auto [wl, wr] : {std::pair{5, -1}, std::pair{-1, 0}}) {
    p.window_left = wl, p.window_right = wr;
    EXPECT_EQ(attentionPartial(p, dummy, dummy, AttnCudaExec{}), attnInvalidArgument) << wl << " " << wr;
  }
  p.window_left = p.window_right = -1;
  cpu::AttnPartialRef bad{dummy, attnInt8, dummy};
  EXPECT_EQ(mergePartials(dummy, dummy, &bad, 1, 1, 4, nullptr), attnInvalidArgument);
  EXPECT_EQ(reduce2(dummy, dummy, dummy, 4, attnDataType_t(42), attnSum, nullptr), attnInvalidArgument);
  EXPECT_EQ(reduce2(dummy, dummy, dummy, 4, attnFloat32, attnRedOp_t(9), nullptr), attnInvalidArgument);
  EXPECT_EQ(divideInPlace(dummy, 4, attnFloat32, 0, nullptr), attnInvalidArgument);
  EXPECT_EQ(gatherRows(nullptr, dummy, nullptr, 3, 3, 4, nullptr), attnInvalidArgument);
  cpu::KeyBlock kb{0, 0, 1};
  EXPECT_EQ(gatherKeyTable(nullptr, nullptr, &kb, 1, 4, nullptr, 1, nullptr), attnInvalidArgument);
  EXPECT_EQ(gatherKeyTable(reinterpret_cast<int64_t*>(dummy), reinterpret_cast<int32_t*>(dummy), &kb, 1, 0,
                           reinterpret_cast<int32_t*>(dummy), 1, nullptr),
            attnInvalidArgument);
  EXPECT_EQ(convertFromFloat(dummy, attnInt8, dummy, 4, nullptr), attnInvalidArgument);
}

}  // namespace
}  // namespace attn::cuda
