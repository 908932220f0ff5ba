// Kernels compiled for AVX-512 (F, BW, DQ, VL) + FMA + F16C; chosen at run
// time (cpu_isa.h).
#include "kernels/cpu/isa_common_includes.h"

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")
// GCC 12's AVX-512 intrinsics warn about their own _mm512_undefined_*()
// operands (GCC PR 105593, fixed in 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define ATTN_KERNEL_AVX512 1
#include "kernels/cpu/fill_table.h"

namespace attn::cpu {

const KernelTable& avx512Kernels() {
  static const KernelTable table = makeTable<SimdAvx512>(Isa::kAvx512);
  return table;
}

}  // namespace attn::cpu
#pragma GCC pop_options
#else
namespace attn::cpu {
const KernelTable& avx512Kernels() { return genericKernels(); }
}  // namespace attn::cpu
#endif
