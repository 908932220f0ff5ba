// The warp-level tensor-core instructions of the mma attention kernel, as
// inline PTX. Their fragment layouts are documented by the PTX ISA (unlike
// WMMA's), so a kernel may keep scores and weights in registers and move
// them from one instruction to the next without shared memory. Lane l,
// g = l / 4, t = l % 4; a register holds two 16-bit elements, the first in
// its low half:
//
//   mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: D (16x8, fp32) += A (16x16) B (16x8)
//     A: a[0] = (row g, cols 2t, 2t+1)  a[1] = (g+8, 2t..)  a[2] = (g, 2t+8..)  a[3] = (g+8, 2t+8..)
//     B: b[0] = (rows 2t, 2t+1, col g)  b[1] = (rows 2t+8, 2t+9, col g)
//     D: d[0], d[1] = (g, 2t), (g, 2t+1)   d[2], d[3] = (g+8, 2t), (g+8, 2t+1)
//   ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16: lanes 8i..8i+7 give
//     the row addresses of 8x8 matrix i (16 bytes, 16-byte aligned);
//     r[i] = row g, elements 2t and 2t+1 of matrix i (.trans: of its transpose).
//
// Built for the SIMT simulator (tests/cuda_emu/simt), the same calls run
// on simulated warps with these layouts.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace attn::cuda::ptx {

// Four 8x8 matrices of 16-bit elements from shared memory; `row` is this
// lane's row address.
__device__ inline void ldmatrixX4(uint32_t (&r)[4], const void* row) {
#if defined(ATTN_CUDA_SIMT)
  attn_simt::loadMatrices(r, 4, false, row);
#elif defined(__CUDA_ARCH__)
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
#endif
}

// The same, each matrix transposed on the way (B operands from row-major V).
__device__ inline void ldmatrixX4Trans(uint32_t (&r)[4], const void* row) {
#if defined(ATTN_CUDA_SIMT)
  attn_simt::loadMatrices(r, 4, true, row);
#elif defined(__CUDA_ARCH__)
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
#endif
}

// d += a b (m16n8k16, fp32 accumulate); T is __nv_bfloat16 or __half.
template <class T>
__device__ inline void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>, "bf16 or fp16");
#if defined(ATTN_CUDA_SIMT)
  const uint32_t b[2] = {b0, b1};
  attn_simt::mmaM16N8K16(d, a, b, std::is_same_v<T, __nv_bfloat16>);
#elif defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Two fp32 values rounded (to nearest even) into one register of T, `lo`
// in the low half; `rlo` / `rhi` return the rounded values as fp32.
template <class T>
__device__ inline uint32_t pack2(float lo, float hi, float& rlo, float& rhi) {
  uint32_t r;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    rlo = __low2float(h);
    rhi = __high2float(h);
    std::memcpy(&r, &h, 4);
  } else {
    const __half2 h = __floats2half2_rn(lo, hi);
    rlo = __low2float(h);
    rhi = __high2float(h);
    std::memcpy(&r, &h, 4);
  }
  return r;
}

}  // namespace attn::cuda::ptx
