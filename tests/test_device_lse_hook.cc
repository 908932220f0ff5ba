// LSE conventions on the device: attnMergeAttnStatesLse on a CUDA stream in
// every convention x fp32 / fp16 / bf16, in place and not, equals the host
// merge; an engine's kernel registered with attnCommSetAttnKernelEx that
// writes bf16 / fp16 partials and base-2 / head-major LSEs on the compute
// stream gives the exact result in every mode of a device communicator.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attncomm.h"
#include "kernels/cpu/convert.h"
#include "kernels/cuda/cuda_kernels.h"
#include "support/attn_fixtures.h"
#include "support/device_attn.h"
#include "support/gpu.h"
#include "support/lse_conventions.h"
#include "support/multirank.h"

namespace attn_test {
namespace {

constexpr int64_t kRows = 9;
constexpr int kHeads = 6, kD = 16, kParts = 3;
constexpr size_t kCells = size_t(kRows) * kHeads;

template <class T>
T* ToDevice(const std::vector<T>& h, cudaStream_t s) {
  T* d = nullptr;
  EXPECT_EQ(cudaMallocAsync(reinterpret_cast<void**>(&d), h.size() * sizeof(T) + 1, s), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice, s), cudaSuccess);
  return d;
}

template <class T>
std::vector<T> ToHost(const T* d, size_t n, cudaStream_t s) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpyAsync(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  return h;
}

std::vector<float> AsFloat(const std::vector<uint8_t>& bytes, attnDataType_t t) {
  std::vector<float> f(kCells * kD);
  EXPECT_EQ(attn::cpu::convertToFloat(f.data(), bytes.data(), t, f.size()), attnSuccess);
  return f;
}

TEST(DeviceLse, MergeOnAStreamEqualsTheHostMergeInEveryConvention) {
  REQUIRE_GPU();
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  std::mt19937 g(17);
  std::uniform_real_distribution<float> u(-2.f, 2.f), l(-6.f, 6.f);
  for (attnDataType_t t : {attnFloat32, attnFloat16, attnBfloat16}) {
    const size_t esz = t == attnFloat32 ? 4 : 2;
    std::vector<std::vector<uint8_t>> o(kParts, std::vector<uint8_t>(kCells * kD * esz));
    std::vector<std::vector<float>> natural(kParts, std::vector<float>(kCells));
    for (int j = 0; j < kParts; ++j) {
      std::vector<float> f(kCells * kD);
      for (float& x : f) x = u(g);
      ASSERT_EQ(attn::cpu::convertFromFloat(o[j].data(), t, f.data(), f.size()), attnSuccess);
      for (size_t c = 0; c < kCells; ++c) natural[j][c] = c == 2 || (c + j) % 5 == 0 ? -INFINITY : l(g);
    }
    for (attnLseBase_t base : kLseBases) {
      for (attnLseLayout_t layout : kLseLayouts) {
        for (bool inPlace : {false, true}) {
          const std::string what = std::string(AttnDtypeName(t)) + ", " + LseConventionName(base, layout) +
                                   (inPlace ? ", in place" : "");
          std::vector<std::vector<float>> lse(kParts, std::vector<float>(kCells));
          std::vector<const void*> ho, dO;
          std::vector<const float*> hl, dl;
          for (int j = 0; j < kParts; ++j) {
            ToLseConvention(natural[j].data(), lse[j].data(), kRows, kHeads, base, layout);
            ho.push_back(o[j].data());
            hl.push_back(lse[j].data());
            dO.push_back(ToDevice(o[j], s));
            dl.push_back(ToDevice(lse[j], s));
          }
          std::vector<uint8_t> wantO(o[0].size());
          std::vector<float> wantL(kCells);
          ASSERT_EQ(attnMergeAttnStatesLse(kParts, ho.data(), hl.data(), wantO.data(), wantL.data(), kRows, kHeads,
                                           kD, t, base, layout, nullptr),
                    attnSuccess)
              << what;
          void* outD = inPlace ? const_cast<void*>(dO[0]) : ToDevice(std::vector<uint8_t>(o[0].size()), s);
          float* lseD = inPlace ? const_cast<float*>(dl[0]) : ToDevice(std::vector<float>(kCells), s);
          ASSERT_EQ(attnMergeAttnStatesLse(kParts, dO.data(), dl.data(), outD, lseD, kRows, kHeads, kD, t, base,
                                           layout, reinterpret_cast<attnStream_t>(s)),
                    attnSuccess)
              << what << ": " << attnGetLastError(nullptr);
          const std::vector<float> gotO = AsFloat(ToHost(static_cast<uint8_t*>(outD), o[0].size(), s), t);
          const std::vector<float> gotL = ToHost(lseD, kCells, s);
          const std::vector<float> want = AsFloat(wantO, t);
          const double tol = t == attnFloat32 ? 1e-5 : t == attnFloat16 ? 2e-3 : 1.6e-2;
          for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(gotO[i], want[i], tol) << what << ", " << i;
          for (size_t c = 0; c < kCells; ++c) {
            if (std::isinf(wantL[c])) EXPECT_TRUE(std::isinf(gotL[c]) && gotL[c] < 0) << what << ", lse " << c;
            else EXPECT_NEAR(gotL[c], wantL[c], 1e-5) << what << ", lse " << c;
          }
          for (int j = 0; j < kParts; ++j) {
            cudaFreeAsync(const_cast<void*>(dO[j]), s);
            cudaFreeAsync(const_cast<float*>(dl[j]), s);
          }
          if (!inPlace) {
            cudaFreeAsync(outD, s);
            cudaFreeAsync(lseD, s);
          }
          ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
        }
      }
    }
  }
  cudaStreamDestroy(s);
}

// Ranks as threads sharing GPU 0.
RunOptions OnGpu0(attnConfig_t* cfg) {
  *cfg = ATTN_CONFIG_INITIALIZER;
  cfg->device = 0;
  RunOptions o;
  o.config = cfg;
  return o;
}

std::atomic<int> gDeviceCalls{0}, gMismatches{0};

struct Native {
  attnDataType_t out;
  attnLseBase_t base;
  attnLseLayout_t layout;
};

// The library's CUDA kernel into fp32 scratch on the compute stream, then
// written as an engine's kernel would: out in args->out_dtype, lse in its
// convention (stream-ordered throughout; attncomm.h).
attnResult_t DeviceNativeKernel(const attnAttnKernelArgs_t* a, void* user_data, attnStream_t stream) {
  const Native& want = *static_cast<const Native*>(user_data);
  if (a->out_dtype != want.out || a->lse_base != want.base || a->lse_layout != want.layout) gMismatches.fetch_add(1);
  const attnAttnConfig_t& cfg = *a->cfg;
  const int S = a->num_seqs;
  if (stream == nullptr) {  // AUTO's timing run: host pointers
    std::vector<int32_t> none;
    const int64_t rows = S ? a->q_offsets[S] : 0;
    std::vector<float> o(size_t(rows) * cfg.num_q_heads * cfg.head_dim + 1), l(size_t(rows) * cfg.num_q_heads + 1);
    attnAttnKernelArgs_t f = *a;
    f.out = o.data();
    f.lse = l.data();
    if (attnResult_t r = LoopAttentionKernel(&f, nullptr, nullptr); r != attnSuccess) return r;
    if (attn::cpu::convertFromFloat(a->out, a->out_dtype, o.data(), o.size() - 1) != attnSuccess)
      return attnInvalidArgument;
    ToLseConvention(l.data(), a->lse, rows, cfg.num_q_heads, a->lse_base, a->lse_layout);
    return attnSuccess;
  }
  gDeviceCalls.fetch_add(1);
  const cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  std::vector<int32_t> qo(S + 1), ko(S + 1);
  if (cudaMemcpyAsync(qo.data(), a->q_offsets, qo.size() * 4, cudaMemcpyDeviceToHost, s) != cudaSuccess ||
      cudaMemcpyAsync(ko.data(), a->kv_offsets, ko.size() * 4, cudaMemcpyDeviceToHost, s) != cudaSuccess ||
      cudaStreamSynchronize(s) != cudaSuccess)
    return attnUnhandledCudaError;
  const int64_t rows = qo[S];
  const size_t cells = size_t(rows) * cfg.num_q_heads;
  std::vector<attn::cpu::AttnSegment> segs(S);
  for (int i = 0; i < S; ++i) segs[i] = {qo[i], qo[i + 1], ko[i], ko[i + 1]};
  char* scratch = nullptr;
  const size_t oBytes = (cells * cfg.head_dim * 4 + 255) / 256 * 256, lBytes = (cells * 4 + 255) / 256 * 256;
  if (cudaMallocAsync(reinterpret_cast<void**>(&scratch), oBytes + lBytes + sizeof(segs[0]) * S + 16, s) !=
      cudaSuccess)
    return attnUnhandledCudaError;
  float* o = reinterpret_cast<float*>(scratch);
  float* l = reinterpret_cast<float*>(scratch + oBytes);
  auto* dsegs = reinterpret_cast<attn::cpu::AttnSegment*>(scratch + oBytes + lBytes);
  attnResult_t r = attnUnhandledCudaError;
  if (cudaMemcpyAsync(dsegs, segs.data(), sizeof(segs[0]) * S, cudaMemcpyHostToDevice, s) == cudaSuccess) {
    attn::cpu::AttnProblem p;
    p.q = a->q;
    p.k = a->k;
    p.v = a->v;
    p.dtype = cfg.dtype;
    p.nq = qo[S];
    p.nk = ko[S];
    p.num_q_heads = cfg.num_q_heads;
    p.num_kv_heads = cfg.num_kv_heads;
    p.head_dim = cfg.head_dim;
    p.scale = cfg.softmax_scale;
    p.causal = cfg.causal != 0;
    p.q_pos = a->q_pos;
    p.k_pos = a->kv_pos;
    p.segments = dsegs;
    p.num_segments = S;
    attn::cuda::AttnCudaExec ex;
    ex.stream = s;
    r = rows == 0 ? attnSuccess : attn::cuda::attentionPartial(p, o, l, ex);
    if (r == attnSuccess && cells) r = attn::cuda::convertFromFloat(a->out, a->out_dtype, o, cells * cfg.head_dim, s);
    if (r == attnSuccess && cells) {
      if (a->lse_base == attnLseNatural && a->lse_layout == attnLseTokenMajor)
        r = cudaMemcpyAsync(a->lse, l, cells * 4, cudaMemcpyDeviceToDevice, s) == cudaSuccess ? attnSuccess
                                                                                   : attnUnhandledCudaError;
      else
        r = attn::cuda::writeLse(a->lse, l, rows, cfg.num_q_heads, a->lse_base == attnLseBase2,
                                 a->lse_layout == attnLseHeadMajor, s);
    }
  }
  if (cudaFreeAsync(scratch, s) != cudaSuccess) r = attnUnhandledCudaError;
  return r;
}

TEST(DeviceLse, NativeKernelInEveryModeOnADeviceCommunicator) {
  REQUIRE_GPU();
  const std::vector<int32_t> newLens = {70, 23}, cachedLens = {30, 0};
  for (const auto& [dtype, native] :
       {std::pair{attnBfloat16, Native{attnBfloat16, attnLseBase2, attnLseHeadMajor}},
        std::pair{attnFloat16, Native{attnFloat16, attnLseNatural, attnLseHeadMajor}},
        std::pair{attnBfloat16, Native{attnFloat32, attnLseBase2, attnLseTokenMajor}}}) {
    const attnAttnConfig_t acfg = ATTN_ATTN_CONFIG(8, 2, 32, dtype, 0.f, 1);
    const AttnCase c = MakeCase("device-native", PrefillSpec(acfg, newLens, cachedLens), 7);
    const std::string name = std::string(AttnDtypeName(dtype)) + " call, " + AttnDtypeName(native.out) +
                             " partial, " + LseConventionName(native.base, native.layout);
    for (attnAttnMode_t mode : {attnModePassKV, attnModePassQ, attnModeShipQ, attnModeHeadParallel, attnModeAuto}) {
      gDeviceCalls = 0;
      gMismatches = 0;
      attnConfig_t cfg;
      RunThreads(3, [&](int rank, int nranks, attnComm_t& comm) {
        Native mine = native;
        const attnAttnKernel_t k = ATTN_ATTN_KERNEL(DeviceNativeKernel, &mine, native.out, native.base,
                                                    native.layout);
        ASSERT_EQ(attnCommSetAttnKernelEx(comm, &k), attnSuccess);
        const Placement pl = RandomPlacement(c, nranks, 3, -1);
        const RankShard sh = GatherShard(c, pl, rank);
        const DeviceRun r = RunOnDevice(c, sh, comm, mode, true);
        ExpectExact(r, acfg.dtype, name + ", " + ModeName(mode));
        EXPECT_EQ(r.stats.nan_rows, 0);
        EXPECT_EQ(r.stats.empty_mismatch, 0);
      }, OnGpu0(&cfg));
      EXPECT_GT(gDeviceCalls.load(), 0) << name << ", " << ModeName(mode);
      EXPECT_EQ(gMismatches.load(), 0) << name << ", " << ModeName(mode);
    }
  }
}

// fp16 partials for a bf16 call on a device communicator: the call is
// refused naming out_dtype, at the call (before anything is enqueued).
TEST(DeviceLse, AnOutputDtypeThatIsNotTheCallsIsRefusedAtTheCall) {
  REQUIRE_GPU();
  const attnAttnConfig_t acfg = ATTN_ATTN_CONFIG(4, 2, 16, attnBfloat16, 0.f, 1);
  const AttnCase c = MakeCase("device-bad-dtype", PrefillSpec(acfg, {20}, {}), 8);
  gDeviceCalls = 0;
  attnConfig_t cfg;
  RunThreads(1, [&](int rank, int nranks, attnComm_t& comm) {
    Native mine{attnFloat16, attnLseNatural, attnLseTokenMajor};
    const attnAttnKernel_t k = ATTN_ATTN_KERNEL(DeviceNativeKernel, &mine, attnFloat16, attnLseNatural,
                                                attnLseTokenMajor);
    ASSERT_EQ(attnCommSetAttnKernelEx(comm, &k), attnSuccess);
    const RankShard sh = GatherShard(c, RandomPlacement(c, nranks, 3, -1), rank);
    const DeviceRun r = RunOnDevice(c, sh, comm, attnModePassKV, true);
    EXPECT_EQ(r.rc, attnInvalidArgument) << "the call was not refused";
    EXPECT_NE(r.error.find("out_dtype"), std::string::npos) << r.error;
  }, OnGpu0(&cfg));
  EXPECT_EQ(gDeviceCalls.load(), 0);
}

}  // namespace
}  // namespace attn_test
