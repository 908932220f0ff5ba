// An engine's kernel registered with attnCommSetAttnKernelEx in its native
// form (bf16 / fp16 / fp32 output, base-2 and / or head-major LSE): every
// mode of the ring (ranks as threads) gives the exact result within the
// call dtype's bounds, the kernel is told its dtype and convention, and bad
// descriptors are refused (at registration, or at the call for an output
// dtype that is not the call's).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attncomm.h"
#include "kernels/cpu/convert.h"
#include "tests/support/attn_fixtures.h"
#include "tests/support/lse_conventions.h"
#include "tests/support/multirank.h"

namespace attn_test {
namespace {

// What the kernel was registered with, and what it saw.
struct NativeKernel {
  attnDataType_t out = attnFloat32;
  attnLseBase_t base = attnLseNatural;
  attnLseLayout_t layout = attnLseTokenMajor;
  std::atomic<int64_t> calls{0}, mismatches{0};
};

// The loop kernel into fp32 scratch, then written as an engine's kernel
// would: out in args->out_dtype, lse in args' convention.
attnResult_t NativeLoopKernel(const attnAttnKernelArgs_t* a, void* user_data, attnStream_t stream) {
  auto* k = static_cast<NativeKernel*>(user_data);
  k->calls.fetch_add(1);
  if (a->out_dtype != k->out || a->lse_base != k->base || a->lse_layout != k->layout) k->mismatches.fetch_add(1);
  const attnAttnConfig_t& cfg = *a->cfg;
  const int64_t rows = a->num_seqs ? a->q_offsets[a->num_seqs] - a->q_offsets[0] : 0;
  const size_t cells = size_t(rows) * cfg.num_q_heads;
  std::vector<float> o(cells * cfg.head_dim + 1), l(cells + 1);
  attnAttnKernelArgs_t f = *a;
  f.out = o.data();
  f.lse = l.data();
  if (attnResult_t r = LoopAttentionKernel(&f, nullptr, stream); r != attnSuccess) return r;
  if (attn::cpu::convertFromFloat(a->out, a->out_dtype, o.data(), cells * cfg.head_dim) != attnSuccess)
    return attnInvalidArgument;
  ToLseConvention(l.data(), a->lse, rows, cfg.num_q_heads, a->lse_base, a->lse_layout);
  return attnSuccess;
}

struct NativeCase {
  attnDataType_t dtype;  // of the call
  attnDataType_t out;    // of the kernel's partial
  attnLseBase_t base;
  attnLseLayout_t layout;
};

std::string NameOf(const NativeCase& k) {
  return std::string(AttnDtypeName(k.dtype)) + " call, " + AttnDtypeName(k.out) + " partial, " +
         LseConventionName(k.base, k.layout);
}

TEST(KernelHookNative, EveryModeEqualsExactAttention) {
  const int n = 3;
  std::vector<int32_t> T = {17, 4}, P = {9, 3};
  for (const NativeCase& k : {NativeCase{attnBfloat16, attnBfloat16, attnLseBase2, attnLseHeadMajor},
                              NativeCase{attnFloat16, attnFloat16, attnLseNatural, attnLseHeadMajor},
                              NativeCase{attnBfloat16, attnFloat32, attnLseBase2, attnLseTokenMajor},
                              NativeCase{attnFloat32, attnFloat32, attnLseBase2, attnLseHeadMajor}}) {
    const attnAttnConfig_t cfg = AttnCfg(8, 2, 16, k.dtype, true);
    auto c = std::make_shared<AttnCase>(MakeCase(NameOf(k), PrefillSpec(cfg, T, P), 91));
    Placement pl = PlannerPlacement(*c, T, P, n);
    std::vector<NativeKernel> kernels(n);
    RunThreads(n, [&](int rank, int, attnComm_t& comm) {
      NativeKernel& mine = kernels[rank];
      mine.out = k.out;
      mine.base = k.base;
      mine.layout = k.layout;
      const attnAttnKernel_t desc = ATTN_ATTN_KERNEL(NativeLoopKernel, &mine, k.out, k.base, k.layout);
      ATTN_ASSERT_OK(comm, attnCommSetAttnKernelEx(comm, &desc));
      for (attnAttnMode_t m : kAllModes) {
        const int64_t before = mine.calls.load();
        ExpectRingAttentionExact(*c, pl, rank, comm, m, true, NameOf(k) + ", " + ModeName(m));
        EXPECT_GT(mine.calls.load(), before) << NameOf(k) << ", " << ModeName(m) << ": the kernel was not called";
      }
      EXPECT_EQ(mine.mismatches.load(), 0) << NameOf(k) << ": args named another dtype or convention";
    }, AttnRunOptions());
  }
}

// attnCommSetAttnKernel is the fp32, natural, token-major case, and says so.
TEST(KernelHookNative, TheOldEntryPassesFp32NaturalTokenMajor) {
  const attnAttnConfig_t cfg = AttnCfg(4, 2, 8, attnBfloat16, true);
  std::vector<int32_t> T = {9};
  auto c = std::make_shared<AttnCase>(MakeCase("old entry", PrefillSpec(cfg, T, {}), 92));
  Placement pl = PlannerPlacement(*c, T, {}, 2);
  std::vector<NativeKernel> kernels(2);
  RunThreads(2, [&](int rank, int, attnComm_t& comm) {
    ATTN_ASSERT_OK(comm, attnCommSetAttnKernel(comm, NativeLoopKernel, &kernels[rank]));
    for (attnAttnMode_t m : kAllModes) ExpectRingAttentionExact(*c, pl, rank, comm, m, true, ModeName(m));
    EXPECT_GT(kernels[rank].calls.load(), 0);
    EXPECT_EQ(kernels[rank].mismatches.load(), 0);
  }, AttnRunOptions());
}

TEST(KernelHookNative, BadDescriptorsAreRefused) {
  const attnAttnConfig_t cfg = AttnCfg(2, 1, 8, attnBfloat16, false);
  std::vector<int32_t> T = {5};
  auto c = std::make_shared<AttnCase>(MakeCase("bad descriptors", PrefillSpec(cfg, T, {}), 93));
  Placement pl = PlannerPlacement(*c, T, {}, 1);
  NativeKernel k;
  const attnAttnKernel_t good = ATTN_ATTN_KERNEL(NativeLoopKernel, &k, attnFloat32, attnLseNatural, attnLseTokenMajor);
  EXPECT_EQ(attnCommSetAttnKernelEx(nullptr, &good), attnInvalidArgument);
  RunThreads(1, [&](int rank, int, attnComm_t& comm) {
    auto refused = [&](attnAttnKernel_t d, const char* names, const char* what) {
      EXPECT_EQ(attnCommSetAttnKernelEx(comm, &d), attnInvalidArgument) << what;
      const std::string why = attnGetLastError(comm);
      EXPECT_NE(why.find(names), std::string::npos) << what << ": " << why;
    };
    attnAttnKernel_t d = good;
    d.magic = 0;
    refused(d, "ATTN_ATTN_KERNEL_INITIALIZER", "bad magic");
    d = good;
    d.size = 8;
    refused(d, "size", "too small");
    d = good;
    d.out_dtype = attnInt32;
    refused(d, "out_dtype", "integer output");
    d = good;
    d.lse_base = static_cast<attnLseBase_t>(3);
    refused(d, "lse_base", "bad base");
    d = good;
    d.lse_layout = static_cast<attnLseLayout_t>(-2);
    refused(d, "lse_layout", "bad layout");
    // A refused descriptor changed nothing: the built-in kernel still runs.
    ExpectRingAttentionExact(*c, pl, rank, comm, attnModePassKV, true, "after refusals");
    EXPECT_EQ(k.calls.load(), 0);

    // fp16 partials for a bf16 call: registered, refused at the call,
    // naming the dtypes.
    k.out = attnFloat16;
    const attnAttnKernel_t fp16 = ATTN_ATTN_KERNEL(NativeLoopKernel, &k, attnFloat16, attnLseNatural, attnLseTokenMajor);
    ATTN_ASSERT_OK(comm, attnCommSetAttnKernelEx(comm, &fp16));
    for (attnAttnMode_t m : {attnModePassKV, attnModePassQ, attnModeShipQ, attnModeHeadParallel}) {
      RankRun run = RunRingAttentionRank(*c, pl, rank, comm, m, true);
      EXPECT_EQ(run.rc, attnInvalidArgument) << ModeName(m);
      EXPECT_NE(run.error.find("out_dtype"), std::string::npos) << ModeName(m) << ": " << run.error;
    }
    EXPECT_EQ(k.calls.load(), 0) << "the kernel ran with a dtype it cannot write";
    // NULL restores the built-in kernel.
    ATTN_ASSERT_OK(comm, attnCommSetAttnKernelEx(comm, nullptr));
    ExpectRingAttentionExact(*c, pl, rank, comm, attnModeShipQ, true, "NULL restored");
    const attnAttnKernel_t none = ATTN_ATTN_KERNEL_INITIALIZER;
    ATTN_ASSERT_OK(comm, attnCommSetAttnKernelEx(comm, &none));
    ExpectRingAttentionExact(*c, pl, rank, comm, attnModePassQ, true, "INITIALIZER restored");
    EXPECT_EQ(k.calls.load(), 0);
  }, AttnRunOptions());
}

}  // namespace
}  // namespace attn_test
