#include "kernels/cpu/kv_pack.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/cpu/convert.h"
#include "kernels/cpu/worker_pool.h"
#include "kernels/kernel_types.h"

namespace attn::cpu {
namespace {

float* allocFloats(size_t n) {  // not zeroed: every element is written
  const size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
  return static_cast<float*>(std::aligned_alloc(64, bytes ? bytes : 64));
}

constexpr int32_t kChunkRows = 256;  // keys per packing task

}  // namespace

void PackedKV::Free::operator()(float* p) const { std::free(p); }

PackedKV::PackedKV(const AttnProblem& p, int dvpad, int threads, WorkerPool* pool)
    : k_(allocFloats(size_t(p.nk) * p.num_kv_heads * p.head_dim)),
      v_(allocFloats(size_t(p.nk) * p.num_kv_heads * dvpad)) {
  const int D = p.head_dim, Dv = valueDim(p), H = p.num_kv_heads;
  const size_t esize = kernels::elementSize(p.dtype);
  const int64_t chunks = (p.nk + kChunkRows - 1) / kChunkRows;
  // Tasks walk keys in memory order, all heads of a row together.
  parallelFor(threads, pool, chunks, [&](int, int64_t c) {
    const int32_t k0 = int32_t(c) * kChunkRows, k1 = std::min(p.nk, k0 + kChunkRows);
    for (int32_t j = k0; j < k1; ++j) {
      for (int h = 0; h < H; ++h) {
        const size_t src = keyRow(p, j) * H + h;  // (row, head) of K and of V
        const size_t row = size_t(h) * p.nk + j;
        float* kd = k_.get() + row * D;
        float* vd = v_.get() + row * dvpad;
        (void)convertToFloat(kd, static_cast<const char*>(p.k) + src * D * esize, p.dtype, size_t(D));
        (void)convertToFloat(vd, static_cast<const char*>(p.v) + src * Dv * esize, p.dtype, size_t(Dv));
        std::fill(vd + Dv, vd + dvpad, 0.0f);
      }
    }
  });
}

}  // namespace attn::cpu
