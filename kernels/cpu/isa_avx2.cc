// Kernels compiled for AVX2 + FMA + F16C; chosen at run time (cpu_isa.h).
#include "kernels/cpu/isa_common_includes.h"

#if defined(__x86_64__)
// gcc takes a target for the rest of the unit; clang an attribute on each
// function declared until the pop.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
#define ATTN_KERNEL_AVX2 1
#include "kernels/cpu/fill_table.h"

namespace attn::cpu {

const KernelTable& avx2Kernels() {
  static const KernelTable table = makeTable<SimdAvx2>(Isa::kAvx2);
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
const KernelTable& avx2Kernels() { return genericKernels(); }
}  // namespace attn::cpu
#endif
