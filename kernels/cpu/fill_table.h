// Builds one KernelTable from the templates in reduce_impl.h and
// attention_impl.h; included by each isa_*.cc after its target pragma.
#pragma once

#include "kernels/cpu/attention_impl.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/reduce_impl.h"

namespace {

using attn::cpu::KernelTable;
using attn::cpu::ReduceFn;

template <class Op, int F>
ReduceFn reduceFor(attnDataType_t t) {
  switch (t) {
    case attnInt8: return reduceNative<int8_t, Op, F>;
    case attnUint8: return reduceNative<uint8_t, Op, F>;
    case attnInt32: return reduceNative<int32_t, Op, F>;
    case attnInt64: return reduceNative<int64_t, Op, F>;
    case attnFloat16: return reduceHalf<Fp16Tag, Op, F>;
    case attnFloat32: return reduceNative<float, Op, F>;
    case attnFloat64: return reduceNative<double, Op, F>;
    case attnBfloat16: return reduceHalf<Bf16Tag, Op, F>;
    default: return nullptr;
  }
}

template <class Op>
void fillOp(KernelTable& k, int op) {
  for (int t = 0; t < attnNumTypes; ++t) {
    const auto type = static_cast<attnDataType_t>(t);
    k.reduce[t][op][attn::cpu::kFormInto] = reduceFor<Op, attn::cpu::kFormInto>(type);
    k.reduce[t][op][attn::cpu::kFormRev] = reduceFor<Op, attn::cpu::kFormRev>(type);
    k.reduce[t][op][attn::cpu::kFormOut] = reduceFor<Op, attn::cpu::kFormOut>(type);
  }
}

template <class Tag>
void widenAll(float* d, const void* s, size_t n) {
  widenRow(d, static_cast<const uint16_t*>(s), n, Tag{});
}
template <class Tag>
void narrowAll(void* d, const float* s, size_t n) {
  narrowRow(static_cast<uint16_t*>(d), s, n, Tag{});
}

template <class Simd>
KernelTable makeTable(attn::cpu::Isa isa) {
  KernelTable k{};
  k.isa = isa;
  fillOp<SumOp>(k, attnSum);
  fillOp<ProdOp>(k, attnProd);
  fillOp<MaxOp>(k, attnMax);
  fillOp<MinOp>(k, attnMin);
  k.divide[attnInt8] = divideNative<int8_t>;
  k.divide[attnUint8] = divideNative<uint8_t>;
  k.divide[attnInt32] = divideNative<int32_t>;
  k.divide[attnInt64] = divideNative<int64_t>;
  k.divide[attnFloat16] = divideHalf<Fp16Tag>;
  k.divide[attnFloat32] = divideNative<float>;
  k.divide[attnFloat64] = divideNative<double>;
  k.divide[attnBfloat16] = divideHalf<Bf16Tag>;
  k.widen_fp16 = widenAll<Fp16Tag>;
  k.widen_bf16 = widenAll<Bf16Tag>;
  k.narrow_fp16 = narrowAll<Fp16Tag>;
  k.narrow_bf16 = narrowAll<Bf16Tag>;
  k.attention = attentionTask<Simd>;
  k.attn_tile_rows = Simd::kRows;
  k.attn_row_align = Simd::W;
  return k;
}

}  // namespace
