// The tensor-core instructions kernels reach through inline PTX
// (kernels/cuda/mma_ptx.cuh): ldmatrix and mma.sync m16n8k16, with the
// layouts the PTX ISA documents. Each is a warp collective: the lanes'
// operands meet in the warp's exchange buffer behind one barrier, as the
// instruction waits for the whole warp on a GPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>

#include "tests/cuda_emu/simt/simt.h"

namespace attn_simt {
namespace {

float fromBits(uint16_t bits, bool bf16) {
  if (bf16) {
    const uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}

// Element `half` (0: low, 1: high) of a register of two 16-bit values.
uint16_t halfOf(uint32_t r, int half) { return uint16_t(half ? r >> 16 : r & 0xffffu); }

}  // namespace

void loadMatrices(uint32_t* r, int count, bool trans, const void* row) {
  if (count != 1 && count != 2 && count != 4) trap("ldmatrix: .x1, .x2 or .x4 only");
  if (reinterpret_cast<uintptr_t>(row) % 16) trap("ldmatrix: a row address is not 16-byte aligned");
  unsigned char* ex = warpExchange();
  const unsigned lane = ids().lane;
  std::memcpy(ex + lane * sizeof(void*), &row, sizeof(void*));
  warpBarrier();
  auto rowOf = [&](int m, int i) {  // row i of matrix m
    const uint16_t* p;
    std::memcpy(&p, ex + unsigned(8 * m + i) * sizeof(void*), sizeof(void*));
    return p;
  };
  const int g = int(lane / 4), t = int(lane % 4);
  for (int m = 0; m < count; ++m) {
    uint16_t e[2];
    for (int k = 0; k < 2; ++k) e[k] = trans ? rowOf(m, 2 * t + k)[g] : rowOf(m, g)[2 * t + k];
    r[m] = uint32_t(e[0]) | uint32_t(e[1]) << 16;
  }
}

void mmaM16N8K16(float* d, const uint32_t* a, const uint32_t* b, bool bf16) {
  struct Operands {
    uint32_t a[4], b[2];
  };
  unsigned char* ex = warpExchange();
  const unsigned lane = ids().lane;
  const Operands mine{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}};
  std::memcpy(ex + lane * sizeof(Operands), &mine, sizeof(Operands));
  warpBarrier();
  const Operands* ops = reinterpret_cast<const Operands*>(ex);
  // A (r, k) sits in lane 4 (r % 8) + (k % 8) / 2, register r / 8 + 2 (k / 8);
  // B (k, n) in lane 4 n + (k % 8) / 2, register k / 8; half k % 2 for both.
  auto A = [&](int r, int k) {
    return fromBits(halfOf(ops[4 * (r % 8) + (k % 8) / 2].a[r / 8 + 2 * (k / 8)], k % 2), bf16);
  };
  auto B = [&](int k, int n) { return fromBits(halfOf(ops[4 * n + (k % 8) / 2].b[k / 8], k % 2), bf16); };
  const int g = int(lane / 4), t = int(lane % 4);
  float rows[2][16], cols[2][16];  // A's rows g, g + 8; B's columns 2t, 2t + 1
  for (int k = 0; k < 16; ++k) {
    rows[0][k] = A(g, k);
    rows[1][k] = A(g + 8, k);
    cols[0][k] = B(k, 2 * t);
    cols[1][k] = B(k, 2 * t + 1);
  }
  for (int i = 0; i < 4; ++i) {
    float s = d[i];
    for (int k = 0; k < 16; ++k) s += rows[i / 2][k] * cols[i % 2][k];
    d[i] = s;
  }
}

}  // namespace attn_simt
