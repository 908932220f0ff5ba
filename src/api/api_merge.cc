// The merges of partial attention results: attnMergeAttnStates and
// attnMergeAttnStatesLse (local, on host memory or on a CUDA stream, LSEs
// in any convention) and the merge collectives
// (attnMergeAttnReduceScatter / attnMergeAttnAllGather, src/attn/
// merge_collective.h).
#include <limits>
#include <vector>

#include "kernels/cpu/convert.h"
#include "kernels/cpu/merge.h"
#include "src/api/refuse.h"
#include "src/attn/attn_config.h"
#include "src/attn/device/merge_device.h"
#include "src/attn/merge_collective.h"
#include "src/core/api_call.h"
#include "src/device/device_route.h"

using namespace attn;

static attnResult_t mergeStates(int n, const void* const* outs, const float* const* lses, void* out,
                                float* lse, int64_t rows, int heads, int head_dim,
                                attnDataType_t dtype, attnLseBase_t base, attnLseLayout_t layout,
                                attnStream_t stream);

extern "C" attnResult_t attnMergeAttnStates(int n, const void* const* outs, const float* const* lses,
                                            void* out, float* lse, int64_t rows, int heads,
                                            int head_dim, attnDataType_t dtype, attnStream_t stream) {
  return guardedEntry([&] {
    ErrorContext ctx("-");
    return mergeStates(n, outs, lses, out, lse, rows, heads, head_dim, dtype, attnLseNatural,
                       attnLseTokenMajor, stream);
  });
}

extern "C" attnResult_t attnMergeAttnStatesLse(int n, const void* const* outs, const float* const* lses,
                                               void* out, float* lse, int64_t rows, int heads, int head_dim,
                                               attnDataType_t dtype, attnLseBase_t lse_base,
                                               attnLseLayout_t lse_layout, attnStream_t stream) {
  return guardedEntry([&] {
    ErrorContext ctx("-");
    return mergeStates(n, outs, lses, out, lse, rows, heads, head_dim, dtype, lse_base, lse_layout, stream);
  });
}

// Every partial is folded into an fp32 accumulator that starts empty
// (lse -inf), its LSE read in the caller's convention by the merge kernel;
// the merged LSE is written back in it. So the inputs are read once and
// out / lse may alias outs[0] / lses[0].
static attnResult_t mergeStates(int n, const void* const* outs, const float* const* lses, void* out,
                                float* lse, int64_t rows, int heads, int head_dim,
                                attnDataType_t dtype, attnLseBase_t base, attnLseLayout_t layout,
                                attnStream_t stream) {
  clearThreadLastError();
  ATTN_REQUIRE(n >= 1, "n must be >= 1, got %d", n);
  ATTN_REQUIRE(base == attnLseNatural || base == attnLseBase2, "lse_base %d is not attnLseNatural or attnLseBase2",
               int(base));
  ATTN_REQUIRE(layout == attnLseTokenMajor || layout == attnLseHeadMajor,
               "lse_layout %d is not attnLseTokenMajor or attnLseHeadMajor", int(layout));
  ATTN_REQUIRE(rows >= 0 && heads >= 1 && head_dim >= 1, "rows, heads, head_dim must be positive");
  ATTN_REQUIRE(cpu::isAttnFloatType(dtype), "dtype must be attnFloat32, attnFloat16 or attnBfloat16");
  ATTN_REQUIRE(outs && lses, "outs and lses must not be NULL");
  if (rows == 0) return attnSuccess;
  ATTN_REQUIRE(out != nullptr, "out is NULL");
  for (int j = 0; j < n; ++j) ATTN_REQUIRE(outs[j] && lses[j], "outs[%d] or lses[%d] is NULL", j, j);
  size_t r = 0, elems = 0;
  ATTN_REQUIRE(!__builtin_mul_overflow(size_t(rows), size_t(heads), &r) &&
                   !__builtin_mul_overflow(r, size_t(head_dim), &elems) && elems <= (size_t(1) << 56) / sizeof(float),
               "rows %lld x heads %d x head_dim %d is larger than any buffer", (long long)rows, heads, head_dim);
  if (stream != nullptr) {
#if ATTN_HAVE_CUDA
    return mergeStatesOnDevice(n, outs, lses, out, lse, rows, heads, head_dim, dtype, base, layout, stream);
#else
    return setError(attnNotSupported, "a merge on a CUDA stream needs a build with CUDA (this one has none)");
#endif
  }
  std::vector<float> acc(elems), accLse(r, -std::numeric_limits<float>::infinity());
  std::vector<cpu::AttnPartialRef> parts;
  for (int j = 0; j < n; ++j) parts.push_back({outs[j], dtype, lses[j], base, layout, heads});
  ATTN_CHECK(cpu::mergePartials(acc.data(), accLse.data(), parts.data(), n, r, head_dim));
  ATTN_CHECK(cpu::convertFromFloat(out, dtype, acc.data(), acc.size()));
  if (lse) {
    attnAttnConfig_t conv = ATTN_ATTN_CONFIG_INITIALIZER;
    conv.lse_base = base;
    conv.lse_layout = layout;
    writeLse(conv, accLse.data(), lse, rows, heads);
  }
  return attnSuccess;
}

namespace {

// The merge collectives' argument checks: what every rank refuses alike.
attnResult_t checkMergeArgs(attnComm* comm, const void* outPart, const float* lsePart, const void* out,
                            int64_t rows, int heads, int headDim, attnDataType_t dtype, attnStream_t stream) {
  ATTN_REQUIRE(stream == nullptr || deviceRoute(comm),
               "a host-memory communicator takes a NULL stream (got %p)", (void*)stream);
  ATTN_REQUIRE(rows >= 0 && heads >= 1 && headDim >= 1,
               "rows (%lld) must be >= 0, heads (%d) and head_dim (%d) >= 1", (long long)rows, heads, headDim);
  ATTN_REQUIRE(cpu::isAttnFloatType(dtype), "dtype must be attnFloat32, attnFloat16 or attnBfloat16");
  size_t cells = 0, elems = 0;
  ATTN_REQUIRE(!__builtin_mul_overflow(size_t(rows), size_t(heads), &cells) &&
                   !__builtin_mul_overflow(cells, size_t(headDim), &elems) &&
                   elems <= (size_t(1) << 56) / sizeof(float),
               "rows %lld x heads %d x head_dim %d is larger than any buffer", (long long)rows, heads, headDim);
  ATTN_REQUIRE(rows == 0 || (outPart && lsePart), "out_part or lse_part is NULL with %lld rows", (long long)rows);
  ATTN_REQUIRE(rows == 0 || out, "out is NULL with %lld rows", (long long)rows);
  return attnSuccess;
}

attnResult_t mergeCollective(bool allGather, const void* outPart, const float* lsePart, void* out, float* lse,
                             int64_t rows, int heads, int headDim, attnDataType_t dtype, attnComm_t comm,
                             attnStream_t stream) {
  ApiCall call(comm);
  ATTN_CHECK(call.finish(call.check()));
  const CollKind kind = allGather ? CollKind::kMergeAllGather : CollKind::kMergeReduceScatter;
  if (attnResult_t r = checkMergeArgs(comm, outPart, lsePart, out, rows, heads, headDim, dtype, stream);
      r != attnSuccess)
    return call.finish(refuseCollective(comm, stream, kind, r));
  const MergeShape s{rows, heads, headDim, dtype};
  if (deviceRoute(comm)) {
#if ATTN_HAVE_CUDA
    return call.finish(enqueueMergeCollective(comm, stream, allGather, s, outPart, lsePart, out, lse));
#endif
  }
  // The whole shape in the signature's count (ATTN_CHECK): ranks whose
  // rows, heads or head_dim differ fail together.
  const CollSignature sig{static_cast<uint32_t>(kind), dtype, -1, -1,
                          uint64_t(rows) * uint64_t(heads) * uint64_t(headDim)};
  return call.finish(dispatch(comm, allGather ? "MergeAttnAllGather" : "MergeAttnReduceScatter", [=] {
    ATTN_CHECK(checkSignature(comm, sig));
    return allGather ? mergeAllGather(comm, s, outPart, lsePart, out, lse)
                     : mergeReduceScatter(comm, s, outPart, lsePart, out, lse);
  }));
}

}  // namespace

extern "C" attnResult_t attnMergeAttnReduceScatter(const void* out_part, const float* lse_part, void* out,
                                                   float* lse, int64_t rows, int heads, int head_dim,
                                                   attnDataType_t dtype, attnComm_t comm, attnStream_t stream) {
  return guardedEntry([&] {
    return mergeCollective(false, out_part, lse_part, out, lse, rows, heads, head_dim, dtype, comm, stream);
  });
}

extern "C" attnResult_t attnMergeAttnAllGather(const void* out_part, const float* lse_part, void* out, float* lse,
                                               int64_t rows, int heads, int head_dim, attnDataType_t dtype,
                                               attnComm_t comm, attnStream_t stream) {
  return guardedEntry([&] {
    return mergeCollective(true, out_part, lse_part, out, lse, rows, heads, head_dim, dtype, comm, stream);
  });
}
