// Fixtures of the distributed KV cache tests (host and device pools):
// request tokens from a seed, the queries of a check, and the comparison of
// attnKvAttention's result with exact attention over all of a request's
// tokens (double-precision reference).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attncomm.h"

namespace attn_test {

constexpr int kKvHeads = 2, kKvDim = 16;

size_t KvElemSize(attnDataType_t t);
// Values in the dtype, from a seed per element.
std::vector<uint8_t> KvValues(attnDataType_t t, size_t count, uint64_t seed);

// Request `req` of rank `owner`: tokens [0, len) at positions base + i.
struct KvTokens {
  std::vector<uint8_t> k, v;
  std::vector<int32_t> pos;
};
KvTokens RequestTokens(attnDataType_t t, int owner, int64_t req, int len, int base = 0);

attnKvPoolConfig_t PoolCfg(int blockTokens, int64_t capacity, attnDataType_t t = attnFloat32);

// A request this rank owns and what the test asks of it.
struct Req {
  int64_t id;
  int len;    // tokens in the pool
  int qRows;  // queries: the last qRows positions
};

// The queries of one attnKvAttention check of `reqs` on `rank`.
struct KvQueries {
  attnAttnConfig_t cfg = ATTN_ATTN_CONFIG_INITIALIZER;
  std::vector<int64_t> ids;
  std::vector<int32_t> offs, qpos;
  std::vector<uint8_t> q;
  int rows = 0;
};
KvQueries MakeKvQueries(int rank, const std::vector<Req>& reqs, attnDataType_t t, bool causal, int hq = 4);

struct AttnCheck {
  attnResult_t rc = attnSuccess;
  std::string error;
  double maxORel = 0, maxLse = 0;
  int64_t nans = 0, emptyMismatch = 0;
};
// out / lse (host copies of the call's result) against the reference.
AttnCheck CompareKvAttention(const KvQueries& qs, int rank, const std::vector<Req>& reqs, attnDataType_t t,
                             bool causal, const uint8_t* out, const float* lse);
void ExpectExact(const AttnCheck& c, attnDataType_t t, const std::string& what);

}  // namespace attn_test
