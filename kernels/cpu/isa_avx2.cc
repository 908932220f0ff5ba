// Kernels compiled for AVX2 + FMA + F16C; chosen at run time (cpu_isa.h).
#include "kernels/cpu/isa_common_includes.h"

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define ATTN_KERNEL_AVX2 1
#include "kernels/cpu/fill_table.h"

namespace attn::cpu {

const KernelTable& avx2Kernels() {
  static const KernelTable table = makeTable<SimdAvx2>(Isa::kAvx2);
  return table;
}

}  // namespace attn::cpu
#pragma GCC pop_options
#else
namespace attn::cpu {
const KernelTable& avx2Kernels() { return genericKernels(); }
}  // namespace attn::cpu
#endif
