// attnMergeAttnStates: the local N-way merge of partial attention results.
#include <cstring>
#include <vector>

#include "kernels/cpu/convert.h"
#include "kernels/cpu/merge.h"
#include "src/core/api_call.h"

using namespace attn;

static attnResult_t mergeStates(int n, const void* const* outs, const float* const* lses, void* out,
                                float* lse, int64_t rows, int heads, int head_dim,
                                attnDataType_t dtype, attnStream_t stream);

extern "C" attnResult_t attnMergeAttnStates(int n, const void* const* outs, const float* const* lses,
                                            void* out, float* lse, int64_t rows, int heads,
                                            int head_dim, attnDataType_t dtype, attnStream_t stream) {
  return guardedEntry([&] {
    ErrorContext ctx("-");
    return mergeStates(n, outs, lses, out, lse, rows, heads, head_dim, dtype, stream);
  });
}

static attnResult_t mergeStates(int n, const void* const* outs, const float* const* lses, void* out,
                                float* lse, int64_t rows, int heads, int head_dim,
                                attnDataType_t dtype, attnStream_t stream) {
  clearThreadLastError();
  ATTN_REQUIRE(n >= 1, "n must be >= 1, got %d", n);
  ATTN_REQUIRE(rows >= 0 && heads >= 1 && head_dim >= 1, "rows, heads, head_dim must be positive");
  ATTN_REQUIRE(cpu::isAttnFloatType(dtype), "dtype must be attnFloat32, attnFloat16 or attnBfloat16");
  ATTN_REQUIRE(stream == nullptr, "host merges take a NULL stream");
  ATTN_REQUIRE(outs && lses, "outs and lses must not be NULL");
  if (rows == 0) return attnSuccess;
  ATTN_REQUIRE(out != nullptr, "out is NULL");
  for (int j = 0; j < n; ++j) ATTN_REQUIRE(outs[j] && lses[j], "outs[%d] or lses[%d] is NULL", j, j);
  size_t r = 0, elems = 0;
  ATTN_REQUIRE(!__builtin_mul_overflow(size_t(rows), size_t(heads), &r) &&
                   !__builtin_mul_overflow(r, size_t(head_dim), &elems) && elems <= (size_t(1) << 56) / sizeof(float),
               "rows %lld x heads %d x head_dim %d is larger than any buffer", (long long)rows, heads, head_dim);
  std::vector<float> acc(elems), accLse(r);
  ATTN_CHECK(cpu::convertToFloat(acc.data(), outs[0], dtype, acc.size()));
  std::memcpy(accLse.data(), lses[0], r * sizeof(float));
  std::vector<cpu::AttnPartialRef> parts;
  for (int j = 1; j < n; ++j) parts.push_back({outs[j], dtype, lses[j]});
  if (!parts.empty())
    ATTN_CHECK(cpu::mergePartials(acc.data(), accLse.data(), parts.data(), n - 1, r, head_dim));
  ATTN_CHECK(cpu::convertFromFloat(out, dtype, acc.data(), acc.size()));
  if (lse) std::memcpy(lse, accLse.data(), r * sizeof(float));
  return attnSuccess;
}
