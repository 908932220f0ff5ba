// Attention over a distributed KV cache (Infinite-LLM DistAttention): query
// shipping to the ranks that hold a request's blocks, MicroAttention there,
// merge-on-receive at the owner.
#pragma once

#include <cstdint>
#include <vector>

#include "attncomm.h"
#include "src/attn/kv_pool.h"

namespace attn {

struct KvAttnArgs {
  std::vector<int64_t> reqs;
  std::vector<int32_t> qOffsets;  // [reqs + 1], from 0
  const void* q = nullptr;
  const int32_t* qPos = nullptr;
  void* out = nullptr;
  float* lse = nullptr;
  attnAttnConfig_t cfg{};
};

// Checks the arguments against the pool (the text names what is wrong).
attnResult_t checkKvAttnArgs(KvPool& pool, const KvAttnArgs& a);

// The collective; `localStatus` != success fails it on every rank.
attnResult_t kvAttention(KvPool& pool, const KvAttnArgs& a, attnResult_t localStatus);

}  // namespace attn
