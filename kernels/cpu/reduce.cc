// Public reductions: pick the ISA's loop for (type, op, aliasing form).
#include "kernels/cpu/reduce.h"

#include "kernels/cpu/kernel_table.h"

namespace attn::cpu {
namespace {

bool valid(attnDataType_t type, attnRedOp_t op) {
  return type >= 0 && type < attnNumTypes && op >= 0 && op < attnNumOps;
}

int combineOp(attnRedOp_t op) { return op == attnAvg ? attnSum : op; }

}  // namespace

void reduceInto(void* dst, const void* src, size_t count, attnDataType_t type,
                attnRedOp_t op) {
  if (count == 0 || !valid(type, op)) return;
  activeKernels().reduce[type][combineOp(op)][kFormInto](dst, nullptr, src, count);
}

// dst must equal a, equal b, or overlap neither (the loops assume no aliasing).
void reduce2(void* dst, const void* a, const void* b, size_t count, attnDataType_t type,
             attnRedOp_t op) {
  if (count == 0 || !valid(type, op)) return;
  const auto* row = activeKernels().reduce[type][combineOp(op)];
  if (dst == a)
    row[kFormInto](dst, nullptr, b, count);
  else if (dst == b)
    row[kFormRev](dst, nullptr, a, count);
  else
    row[kFormOut](dst, a, b, count);
}

void divideInPlace(void* dst, size_t count, attnDataType_t type, int n) {
  if (count == 0 || n == 0 || type < 0 || type >= attnNumTypes) return;
  activeKernels().divide[type](dst, count, n);
}

}  // namespace attn::cpu
