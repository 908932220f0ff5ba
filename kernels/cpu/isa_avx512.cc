// Kernels compiled for AVX-512 (F, BW, DQ, VL) + FMA + F16C; chosen at run
// time (cpu_isa.h).
#include "kernels/cpu/isa_common_includes.h"

#if defined(__x86_64__)
// gcc takes a target for the rest of the unit; clang an attribute on each
// function declared until the pop.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")
#endif
// GCC 12's AVX-512 intrinsics warn about their own _mm512_undefined_*()
// operands (GCC PR 105593, fixed in 13).
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"  // the same, where GCC proves it
#endif
#define ATTN_KERNEL_AVX512 1
#include "kernels/cpu/fill_table.h"

namespace attn::cpu {

const KernelTable& avx512Kernels() {
  static const KernelTable table = makeTable<SimdAvx512>(Isa::kAvx512);
  return table;
}

}  // namespace attn::cpu
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#else
namespace attn::cpu {
const KernelTable& avx512Kernels() { return genericKernels(); }
}  // namespace attn::cpu
#endif
