// Kernels compiled for AVX-512 as isa_avx512.cc, plus AVX512_BF16 for the
// bf16 decode scores (simd_traits.h, SimdAvx512Bf16); chosen at run time
// (cpu_isa.h).
#include "kernels/cpu/isa_common_includes.h"

#if defined(__x86_64__)
// gcc takes a target for the rest of the unit; clang an attribute on each
// function declared until the pop.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma,f16c")
#endif
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC PR 105593, as isa_avx512.cc
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#define ATTN_KERNEL_AVX512 1
#define ATTN_KERNEL_AVX512_BF16 1
#include "kernels/cpu/fill_table.h"

namespace attn::cpu {

const KernelTable& avx512Bf16Kernels() {
  static const KernelTable table = makeTable<SimdAvx512Bf16>(Isa::kAvx512Bf16);
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
const KernelTable& avx512Bf16Kernels() { return genericKernels(); }
}  // namespace attn::cpu
#endif
