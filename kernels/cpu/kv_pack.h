// Head-major fp32 copies of K and V for one attention call. In THD layout
// the rows of one kv head sit Hkv*D elements apart; when many query tiles
// read the same keys, streaming those scattered rows again per tile is
// memory-latency bound, so the call first converts them once into
// contiguous per-head arrays ([kv head][key][dim]; V rows, of valueDim(p),
// padded to dvpad).
#pragma once

#include <cstdint>
#include <memory>

#include "kernels/cpu/attention.h"

namespace attn::cpu {

class WorkerPool;

class PackedKV {
 public:
  // Packs p.k / p.v with `threads` threads (on `pool` if given).
  PackedKV(const AttnProblem& p, int dvpad, int threads, WorkerPool* pool);
  const float* k() const { return k_.get(); }
  const float* v() const { return v_.get(); }

 private:
  struct Free {
    void operator()(float* p) const;
  };
  std::unique_ptr<float, Free> k_, v_;
};

}  // namespace attn::cpu
