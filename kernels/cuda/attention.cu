// Host side of the device attention: checks the problem, picks the kernel
// (tensor cores through mma.sync or WMMA, or SIMT), and launches it on the
// caller's stream.
#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/attention_simt.cuh"
#include "kernels/cuda/attention_wmma.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/kernel_status.h"

namespace attn::cuda {
namespace {

__global__ void initAccKernel(float* o, float* lse, size_t rows, int d) {
  const size_t n = rows * size_t(d);
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    o[i] = 0.0f;
    if (i < rows) lse[i] = -INFINITY;
  }
}

attnResult_t checkProblem(const cpu::AttnProblem& p, const float* o, const float* lse) {
  KERNEL_REQUIRE(p.dtype == attnFloat32 || p.dtype == attnFloat16 || p.dtype == attnBfloat16,
               "cuda attention: dtype %d is not fp32, fp16 or bf16", int(p.dtype));
  KERNEL_REQUIRE(p.nq >= 0 && p.nk >= 0, "cuda attention: negative row count (nq %d, nk %d)",
               p.nq, p.nk);
  KERNEL_REQUIRE(p.num_q_heads > 0 && p.num_kv_heads > 0 && p.num_q_heads % p.num_kv_heads == 0,
               "cuda attention: %d query heads are not a multiple of %d kv heads",
               p.num_q_heads, p.num_kv_heads);
  KERNEL_REQUIRE(p.head_dim >= 1 && p.head_dim <= cpu::kAttnMaxHeadDim,
               "cuda attention: head_dim %d outside 1..%d", p.head_dim, cpu::kAttnMaxHeadDim);
  KERNEL_REQUIRE(p.head_dim_v >= 0 && p.head_dim_v <= cpu::kAttnMaxHeadDim,
               "cuda attention: head_dim_v %d outside 1..%d (0: head_dim)", p.head_dim_v,
               cpu::kAttnMaxHeadDim);
  KERNEL_REQUIRE(std::isfinite(p.scale), "cuda attention: scale is not finite");
  KERNEL_REQUIRE(p.num_segments >= 0 && (p.num_segments == 0 || p.segments != nullptr),
               "cuda attention: %d segments but no segment array", p.num_segments);
  KERNEL_REQUIRE(p.nq == 0 || (p.q && o && lse), "cuda attention: null q, o or lse");
  KERNEL_REQUIRE(p.nk == 0 || (p.k && p.v), "cuda attention: null k or v");
  KERNEL_REQUIRE(p.window_left >= -1 && p.window_right >= -1,
               "cuda attention: window (%d, %d) below -1", p.window_left, p.window_right);
  KERNEL_REQUIRE(std::isfinite(p.softcap) && p.softcap >= 0.0f,
               "cuda attention: softcap %g is not a finite value >= 0", double(p.softcap));
  KERNEL_REQUIRE(!cpu::visibleSpan(p).bounded || ((p.nq == 0 || p.q_pos) && (p.nk == 0 || p.k_pos)),
               "cuda attention: causal or windowed attention needs q_pos and k_pos");
  // Grid: head slots x query tiles in one dimension. SIMT's 32-row tiles of
  // one head give the most CTAs; mma's packed GQA grids have no more.
  const long long tiles = (long long)p.nq / 32 + 1 + p.num_segments;
  KERNEL_REQUIRE(tiles * p.num_q_heads < (1ll << 31) - 1,
               "cuda attention: %d rows x %d heads is too large for one launch", p.nq,
               p.num_q_heads);
  return attnSuccess;
}

// What decides between the kernels on the current device.
struct DeviceLimits {
  int cc = 0;                // compute capability, e.g. 90
  size_t smemOptin = 0;      // largest dynamic shared memory a block may opt in to
  int sms = 1;               // multiprocessors
};

attnResult_t deviceLimits(DeviceLimits* lim) {
  int dev = 0, major = 0, minor = 0, optin = 0;
  KERNEL_CHECK(cudaResult(cudaGetDevice(&dev), "cudaGetDevice"));
  KERNEL_CHECK(cudaResult(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev),
                        "cudaDeviceGetAttribute(compute capability)"));
  (void)cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  KERNEL_CHECK(cudaResult(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
                        "cudaDeviceGetAttribute(shared memory per block, opt-in)"));
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) sms = 1;
  lim->cc = major * 10 + minor;
  lim->smemOptin = static_cast<size_t>(optin);
  lim->sms = sms > 0 ? sms : 1;
  return attnSuccess;
}

// The (head_dim, head_dim_v) pairs the tensor-core kernels are built for:
// 64, 128, 256 for both, and MLA's 192 / 128 (DeepSeek). Others run on SIMT.
bool tensorCoreShape(int d, int dv) {
  return (d == dv && (d == 64 || d == 128 || d == 256)) || (d == 192 && dv == 128);
}

// Shared memory of a tensor-core tile layout S<D, Dv> for a built shape.
template <template <int, int> class S>
size_t tileSmemBytes(int d, int dv) {
  if (d != dv) return S<192, 128>::kBytes;
  return d == 64 ? S<64, 64>::kBytes : d == 128 ? S<128, 128>::kBytes : S<256, 256>::kBytes;
}

// The tensor-core kernels need sm_80+, 16-bit inputs, a head shape they were
// built for, 16-byte aligned tensors, and their tiles in shared memory
// (D = 256 does not fit on parts with ~100 KiB per block, e.g. sm_86/89).
AttnCudaKernel chooseKernel(const cpu::AttnProblem& p, const AttnCudaExec& ex, const DeviceLimits& lim,
                            const float* o) {
  const int d = p.head_dim, dv = cpu::valueDim(p);
  const bool tc = !ex.force_generic && lim.cc >= 80 && (p.dtype == attnFloat16 || p.dtype == attnBfloat16) &&
                  tensorCoreShape(d, dv) && aligned(p.q, 16) && aligned(p.k, 16) &&
                  aligned(p.v, 16) && aligned(o, 16);
  if (tc && !ex.force_wmma && tileSmemBytes<MmaSmem>(d, dv) <= lim.smemOptin) return AttnCudaKernel::mma;
  if (tc && tileSmemBytes<WmmaSmem>(d, dv) <= lim.smemOptin) return AttnCudaKernel::wmma;
  return AttnCudaKernel::simt;
}

// Lets `kern` launch with `bytes` of dynamic shared memory on the current
// device. The attribute stays set per kernel and device, so the driver is
// asked only when a launch needs more than the largest allowed so far (not
// on every launch: pass-KV launches once per ring step).
attnResult_t allowSharedMemory(const void* kern, size_t bytes) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, size_t> allowed;
  int device = -1;
  KERNEL_CHECK(cudaResult(cudaGetDevice(&device), "cudaGetDevice"));
  const std::pair<const void*, int> key{kern, device};
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = allowed.find(key);
    if (it != allowed.end() && it->second >= bytes) return attnSuccess;
  }
  KERNEL_CHECK(cudaResult(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
                        "cudaFuncSetAttribute(attention shared memory)"));
  std::lock_guard<std::mutex> lock(mu);
  size_t& a = allowed[key];
  if (a < bytes) a = bytes;
  return attnSuccess;
}

// The grid: head slots (q heads, or kv heads x chunks of their group when
// the mma kernel packs GQA) x query tiles in x, key chunks (split-K) in y.
dim3 gridOf(const AttnArgs& a) { return dim3(unsigned(a.tiles) * unsigned(a.head_slots), unsigned(a.splits)); }

// One attention kernel instance: its shared memory allowed, then launched.
attnResult_t launchWith(const char* name, void (*kern)(AttnArgs), size_t bytes, int threads, const AttnArgs& a,
                        cudaStream_t s) {
  KERNEL_CHECK(allowSharedMemory(reinterpret_cast<const void*>(kern), bytes));
  return launchKernel(name, kern, gridOf(a), threads, bytes, s, a);
}

template <class T, int D, int Dv = D>
attnResult_t launchTensorCores(AttnCudaKernel k, const AttnArgs& a, cudaStream_t s) {
  if (k == AttnCudaKernel::mma)
    return launchWith("attention (mma) launch", attnMmaKernel<T, D, Dv>, MmaSmem<D, Dv>::kBytes, kMmaThreads, a,
                      s);
  return launchWith("attention (wmma) launch", attnWmmaKernel<T, D, Dv>, WmmaSmem<D, Dv>::kBytes, kWmmaThreads,
                    a, s);
}

template <class T>
attnResult_t launchTensorCoresD(AttnCudaKernel k, const AttnArgs& a, cudaStream_t s) {
  if (a.d != a.dv) return launchTensorCores<T, 192, 128>(k, a, s);  // the one MLA shape built
  switch (a.d) {
    case 64: return launchTensorCores<T, 64>(k, a, s);
    case 128: return launchTensorCores<T, 128>(k, a, s);
    default: return launchTensorCores<T, 256>(k, a, s);
  }
}

template <class T>
attnResult_t launchSimt(const AttnArgs& a, cudaStream_t s) {
  return launchWith("attention (simt) launch", attnSimtKernel<T>, simtSmemBytes(a.d, a.dv), kSimtThreads, a, s);
}

attnResult_t makePlan(const cpu::AttnProblem& p, const AttnCudaExec& ex, const float* o,
                      AttnCudaPlan* plan, DeviceLimits* limits = nullptr) {
  DeviceLimits lim;
  KERNEL_CHECK(deviceLimits(&lim));
  switch (chooseKernel(p, ex, lim, o)) {
    case AttnCudaKernel::mma: {
      // GQA packing: the group's heads (up to 64) and 64 / that many query
      // rows fill the CTA's 64 rows, so one K/V tile serves every head of
      // the group (a decode step reads each key once per kv head, not once
      // per q head).
      const int heads = std::min(p.num_q_heads / p.num_kv_heads, kMmaBQ);
      *plan = {AttnCudaKernel::mma, true, kMmaBQ / heads, kMmaBK, heads};
      break;
    }
    case AttnCudaKernel::wmma: *plan = {AttnCudaKernel::wmma, true, kWmmaBQ, kWmmaBK, 1}; break;
    case AttnCudaKernel::simt: *plan = {AttnCudaKernel::simt, false, kSimtBQ, kSimtBK, 1}; break;
  }
  if (limits) *limits = lim;
  return attnSuccess;
}

// Split-K (flash-decoding): a decode step has a query tile per sequence, so
// a grid of tiles x head slots CTAs can leave most multiprocessors idle while
// each CTA walks every key of its sequence. Then each CTA's keys are cut
// into chunks run by CTAs of their own (enough for two waves), whose
// partials are merged afterwards. A chunk keeps at least kMinSplitKeys
// keys of an average segment: below that the merge costs more than the
// parallelism gains. ex.key_splits overrides the choice.
constexpr int kMinSplitKeys = 512;
constexpr int kMaxSplits = 32;

int keySplits(const AttnArgs& a, const AttnCudaExec& ex, const DeviceLimits& lim) {
  if (ex.key_splits > 0) return std::min(ex.key_splits, kMaxSplits);
  const long long ctas = (long long)a.tiles * a.head_slots;
  if (ctas >= lim.sms || a.nk == 0) return 1;
  const long long keysPerSeg = a.nk / std::max(1, a.segs ? a.nseg : 1);
  const long long byKeys = keysPerSeg / kMinSplitKeys;
  const long long byGrid = (2ll * lim.sms + ctas - 1) / ctas;
  return int(std::max(1ll, std::min({byKeys, byGrid, (long long)kMaxSplits})));
}

// The launch for the chosen kernel.
attnResult_t launch(const AttnArgs& a, const AttnCudaPlan& plan, attnDataType_t dtype, cudaStream_t s) {
  if (plan.tensor_cores) {
    if (dtype == attnFloat16) return launchTensorCoresD<__half>(plan.kernel, a, s);
    return launchTensorCoresD<__nv_bfloat16>(plan.kernel, a, s);
  }
  switch (dtype) {
    case attnFloat16: return launchSimt<__half>(a, s);
    case attnBfloat16: return launchSimt<__nv_bfloat16>(a, s);
    default: return launchSimt<float>(a, s);
  }
}

// Split-K: every chunk's partial into a slice of a scratch buffer (rows no
// chunk reaches stay O = 0, LSE = -inf there), then merged into (o, lse):
// a fresh result, or folded into the accumulator. O rows are dv wide.
attnResult_t launchSplit(AttnArgs a, const AttnCudaPlan& plan, attnDataType_t dtype, cudaStream_t s) {
  const size_t rows = size_t(a.nq) * size_t(a.hq), slices = size_t(a.splits), dv = size_t(a.dv);
  float* o = a.o;
  float* lse = a.lse;
  void* scratch = nullptr;
  KERNEL_CHECK(cudaResult(cudaMallocAsync(&scratch, slices * rows * (dv + 1) * sizeof(float), s),
                        "cudaMallocAsync(split-K partials)"));
  float* po = static_cast<float*>(scratch);
  float* pl = po + slices * rows * dv;
  attnResult_t r = initAccumulator(po, pl, int64_t(slices) * a.nq, a.hq, a.dv, s);
  // A fresh result starts empty (with segments run() has cleared it).
  if (r == attnSuccess && !a.accumulate && !a.segs) r = initAccumulator(o, lse, a.nq, a.hq, a.dv, s);
  if (r == attnSuccess) {
    a.o = po;
    a.lse = pl;
    a.accumulate = false;
    r = launch(a, plan, dtype, s);
  }
  if (r == attnSuccess) {
    std::vector<cpu::AttnPartialRef> parts(slices);
    for (size_t j = 0; j < slices; ++j) parts[j] = {po + j * rows * dv, attnFloat32, pl + j * rows};
    r = mergePartials(o, lse, parts.data(), int(slices), rows, a.dv, s);
  }
  // Freed in stream order after the merge, or at once after a failed enqueue.
  const attnResult_t f = cudaResult(cudaFreeAsync(scratch, s), "cudaFreeAsync(split-K partials)");
  return r != attnSuccess ? r : f;
}

attnResult_t run(const cpu::AttnProblem& p, float* o, float* lse, const AttnCudaExec& ex,
                 bool accumulate) {
  KERNEL_CHECK(checkProblem(p, o, lse));
  if (p.nq == 0) return attnSuccess;
  AttnCudaPlan plan;
  DeviceLimits lim;
  KERNEL_CHECK(makePlan(p, ex, o, &plan, &lim));
  const bool segs = p.segments != nullptr;
  // Rows outside every segment are never visited by a CTA: clear them first.
  if (!accumulate && segs)
    KERNEL_CHECK(initAccumulator(o, lse, p.nq, p.num_q_heads, cpu::valueDim(p), ex.stream));
  if (segs && p.num_segments == 0) return attnSuccess;

  AttnArgs a{};
  a.q = p.q;
  a.k = p.k;
  a.v = p.v;
  a.q_pos = p.q_pos;
  a.k_pos = p.k_pos;
  a.k_rows = p.k_rows;
  a.segs = p.segments;
  a.nseg = p.num_segments;
  a.nq = p.nq;
  a.nk = p.nk;
  a.hq = p.num_q_heads;
  a.hkv = p.num_kv_heads;
  a.d = p.head_dim;
  a.dv = cpu::valueDim(p);
  const float scale = p.scale != 0.0f ? p.scale : 1.0f / std::sqrt(float(p.head_dim));
  a.scale_log2 = scale * 1.4426950408889634f;
  if (p.softcap > 0.0f) {
    a.cap = p.softcap * 1.4426950408889634f;
    a.cap_in = scale / p.softcap;
    a.cap_inv = 1.0f / a.cap;
    KERNEL_REQUIRE(std::isfinite(a.cap_in) && std::isfinite(a.cap_inv),
                   "cuda attention: softcap %g too small for scale %g", double(p.softcap), double(scale));
  }
  const cpu::VisibleSpan span = cpu::visibleSpan(p);
  a.bounded = span.bounded;
  a.span_lo = span.lo;
  a.span_hi = span.hi;
  a.accumulate = accumulate;
  a.o = o;
  a.lse = lse;
  a.stats = ex.stats;
  // With segments each one starts a new tile: sum ceil(len / bq) <= nq / bq + nseg.
  a.tiles = (p.nq + plan.block_q - 1) / plan.block_q + (segs ? p.num_segments : 0);
  const int group = p.num_q_heads / p.num_kv_heads;
  a.heads_per_cta = plan.heads_per_block;
  a.head_slots = p.num_kv_heads * ((group + a.heads_per_cta - 1) / a.heads_per_cta);
  a.splits = keySplits(a, ex, lim);
  if (a.splits > 1) return launchSplit(a, plan, p.dtype, ex.stream);
  return launch(a, plan, p.dtype, ex.stream);
}

}  // namespace

attnResult_t attentionPlan(const cpu::AttnProblem& p, const AttnCudaExec& ex,
                           AttnCudaPlan* plan) {
  KERNEL_REQUIRE(plan != nullptr, "cuda attention: null plan");
  // As if o were 16-byte aligned (cudaMalloc's is): an unaligned o falls
  // back to the SIMT kernel at launch.
  return makePlan(p, ex, reinterpret_cast<const float*>(256), plan);
}

attnResult_t attentionPartial(const cpu::AttnProblem& p, float* o, float* lse,
                              const AttnCudaExec& ex) {
  return run(p, o, lse, ex, false);
}

attnResult_t attentionAccumulate(const cpu::AttnProblem& p, float* o_acc, float* lse_acc,
                                 const AttnCudaExec& ex) {
  return run(p, o_acc, lse_acc, ex, true);
}

attnResult_t initAccumulator(float* o, float* lse, int64_t rows, int heads, int head_dim,
                             cudaStream_t stream) {
  KERNEL_REQUIRE(rows >= 0 && heads > 0 && head_dim > 0, "cuda initAccumulator: bad shape");
  const size_t nrows = size_t(rows) * size_t(heads);
  if (nrows == 0) return attnSuccess;
  KERNEL_REQUIRE(o && lse, "cuda initAccumulator: null o or lse");
  return launchKernel("initAccumulator launch", initAccKernel, gridFor(nrows * head_dim, 256), 256, 0,
                      stream, o, lse, nrows, head_dim);
}

}  // namespace attn::cuda
