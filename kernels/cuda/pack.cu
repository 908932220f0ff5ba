// Gather / scatter of whole rows by a device index list (contract of
// kernels/cpu/pack.h, plus a bound so a bad index is skipped, not a fault).
// Each row is copied by a group of threads in the widest unit that the row
// size and both pointers allow (16, 4 or 1 bytes). And the key table of
// paged K/V, expanded on the device from one entry per block, so the host
// uploads a few bytes per block instead of 12 per key.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/kernel_status.h"

namespace attn::cuda {
namespace {

template <class U, bool kScatter>
__global__ void rowsKernel(unsigned char* dst, const unsigned char* src, const int32_t* idx,
                           size_t n, size_t bound, size_t units_per_row) {
  for (size_t r = blockIdx.x; r < n; r += gridDim.x) {  // a block per row: no division
    const int32_t k = idx[r];
    if (k < 0 || size_t(k) >= bound) continue;
    const size_t dr = kScatter ? size_t(k) : r, sr = kScatter ? r : size_t(k);
    U* d = reinterpret_cast<U*>(dst) + dr * units_per_row;
    const U* s = reinterpret_cast<const U*>(src) + sr * units_per_row;
    for (size_t u = threadIdx.x; u < units_per_row; u += blockDim.x) d[u] = s[u];
  }
}

template <bool kScatter>
attnResult_t rows(void* dst, const void* src, const int32_t* idx, size_t n, size_t bound,
                  size_t row_bytes, cudaStream_t stream) {
  const char* what = kScatter ? "cuda scatterRows" : "cuda gatherRows";
  if (n == 0 || row_bytes == 0) return attnSuccess;
  KERNEL_REQUIRE(dst && src && idx, "%s: null pointer", what);
  auto* d = static_cast<unsigned char*>(dst);
  auto* s = static_cast<const unsigned char*>(src);
  auto go = [&](auto unit) {
    using U = decltype(unit);
    const size_t upr = row_bytes / sizeof(U);
    return launchKernel(kScatter ? "scatterRows launch" : "gatherRows launch", rowsKernel<U, kScatter>,
                        gridFor(n, 1, 1u << 20), 128, 0, stream, d, s, idx, n, bound, upr);
  };
  auto fits = [&](size_t a) { return row_bytes % a == 0 && aligned(dst, a) && aligned(src, a); };
  if (fits(16)) return go(uint4{});
  if (fits(4)) return go(uint32_t{});
  return go((unsigned char)0);
}

__global__ void keyTableKernel(int64_t* rows, int32_t* pos, const cpu::KeyBlock* blocks, size_t nblocks,
                               int block_tokens, const int32_t* slot_pos, size_t slot_bound) {
  for (size_t b = blockIdx.x; b < nblocks; b += gridDim.x) {
    const cpu::KeyBlock k = blocks[b];
    if (k.slot < 0 || size_t(k.slot) >= slot_bound || k.tokens < 0 || k.tokens > block_tokens) continue;
    const int64_t row0 = k.slot * block_tokens;
    for (int32_t t = int32_t(threadIdx.x); t < k.tokens; t += int32_t(blockDim.x)) {
      rows[k.at + t] = row0 + t;
      pos[k.at + t] = slot_pos[row0 + t];
    }
  }
}

}  // namespace

attnResult_t gatherKeyTable(int64_t* rows, int32_t* pos, const cpu::KeyBlock* blocks, size_t nblocks,
                            int block_tokens, const int32_t* slot_pos, size_t slot_bound, cudaStream_t stream) {
  if (nblocks == 0) return attnSuccess;
  KERNEL_REQUIRE(rows && pos && blocks && slot_pos, "cuda gatherKeyTable: null pointer");
  KERNEL_REQUIRE(block_tokens > 0, "cuda gatherKeyTable: block_tokens = %d", block_tokens);
  const unsigned threads = block_tokens >= 128 ? 128u : unsigned((block_tokens + 31) / 32 * 32);
  return launchKernel("gatherKeyTable launch", keyTableKernel, gridFor(nblocks, 1, 1u << 20), threads, 0, stream,
                      rows, pos, blocks, nblocks, block_tokens, slot_pos, slot_bound);
}

attnResult_t gatherRows(void* dst, const void* src, const int32_t* idx, size_t n, size_t bound,
                        size_t row_bytes, cudaStream_t stream) {
  return rows<false>(dst, src, idx, n, bound, row_bytes, stream);
}

attnResult_t scatterRows(void* dst, const void* src, const int32_t* idx, size_t n, size_t bound,
                         size_t row_bytes, cudaStream_t stream) {
  return rows<true>(dst, src, idx, n, bound, row_bytes, stream);
}

}  // namespace attn::cuda
