// One table of kernel entry points per instruction set (filled by isa_*.cc),
// so the public functions dispatch with one indexed load per call.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attncomm.h"
#include "kernels/cpu/attention_task.h"
#include "kernels/cpu/cpu_isa.h"

namespace attn::cpu {

// How a reduction's destination relates to its operands.
enum ReduceForm : int {
  kFormInto = 0,  // d = d op y
  kFormRev = 1,   // d = y op d
  kFormOut = 2,   // d = x op y, no overlap
  kNumForms = 3,
};
constexpr int kNumCombineOps = 4;  // sum, prod, max, min (avg combines as sum)

using ReduceFn = void (*)(void* d, const void* x, const void* y, size_t n);
using DivideFn = void (*)(void* d, size_t n, int by);
using WidenFn = void (*)(float* d, const void* s, size_t n);
using NarrowFn = void (*)(void* d, const float* s, size_t n);

struct KernelTable {
  Isa isa;
  ReduceFn reduce[attnNumTypes][kNumCombineOps][kNumForms];
  DivideFn divide[attnNumTypes];
  WidenFn widen_fp16, widen_bf16;
  NarrowFn narrow_fp16, narrow_bf16;
  AttnTaskFn attention;
  int attn_tile_rows;  // stacked query rows per attention tile (<= kAttnMaxTileRows)
  int attn_row_align;  // rows per vector: a head's block in a multi-head tile rounds to it
};

const KernelTable& genericKernels();
const KernelTable& avx2Kernels();    // generic where the build is not x86-64
const KernelTable& avx512Kernels();  // likewise
const KernelTable& avx512Bf16Kernels();  // likewise

inline const KernelTable& kernelsFor(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Bf16: return avx512Bf16Kernels();
    case Isa::kAvx512: return avx512Kernels();
    case Isa::kAvx2: return avx2Kernels();
    default: return genericKernels();
  }
}
inline const KernelTable& activeKernels() { return kernelsFor(activeIsa()); }

}  // namespace attn::cpu
