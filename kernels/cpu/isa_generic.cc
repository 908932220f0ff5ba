// Kernels for the baseline instruction set (SSE2 on x86-64).
#include "kernels/cpu/isa_common_includes.h"

#include "kernels/cpu/fill_table.h"

namespace attn::cpu {

const KernelTable& genericKernels() {
  static const KernelTable table = makeTable<SimdGeneric>(Isa::kGeneric);
  return table;
}

}  // namespace attn::cpu
