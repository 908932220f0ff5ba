// kernels/cuda's launchers (cuda_kernels.h) for the emulated runtime: each
// checks at the call that every buffer the kernel would touch is memory the
// device can reach (a host pointer handed to a kernel is the bug this build
// exists to catch), then runs the kernels/cpu twin on the stream's thread.
// The numerics are the CPU kernels'; the CUDA kernels themselves are tested
// on a GPU only (test_cuda_kernels).
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/merge.h"
#include "kernels/cpu/pack.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/sinks.h"
#include "kernels/cuda/cuda_kernels.h"
#include "src/core/datatype.h"
#include "src/core/error.h"
#include "tests/cuda_emu/emu_core.h"

namespace attn::cuda {
namespace {

struct Region {
  const void* p;
  size_t bytes;
  const char* name;
};

// Enqueues `body` on `stream` after checking `regions`; a region the device
// cannot reach, or a body that fails, is a device fault (sticky, printed).
attnResult_t launch(const char* kernel, cudaStream_t stream, std::vector<Region> regions,
                    std::function<attnResult_t()> body) {
  if (cudaError_t e = attn_emu::enter(); e != cudaSuccess) return cudaResult(e, kernel);
  for (const Region& r : regions)
    if (r.bytes && !attn_emu::deviceAccessible(r.p, r.bytes)) {
      attn_emu::stickyFault(cudaErrorIllegalAddress,
                            std::string(kernel) + ": " + r.name + " (" + std::to_string(r.bytes) +
                                " bytes at " + std::to_string(reinterpret_cast<uintptr_t>(r.p)) +
                                ") is not memory the device can reach");
      return attnSuccess;  // the fault surfaces asynchronously, as on a GPU
    }
  std::string name(kernel);
  cudaError_t e = attn_emu::enqueue(stream, [name, body = std::move(body)] {
    if (body() != attnSuccess)
      attn_emu::stickyFault(cudaErrorLaunchFailure, name + ": " + attn::threadLastError());
  });
  return cudaResult(e, kernel);
}

size_t eltBytes(attnDataType_t t) { return dataTypeSize(t); }

attnResult_t attention(const char* kernel, const cpu::AttnProblem& p, float* o, float* lse,
                       const AttnCudaExec& ex, bool accumulate) {
  ATTN_REQUIRE(p.nq >= 0 && p.nk >= 0 && p.num_q_heads > 0 && p.num_kv_heads > 0 &&
                   p.num_q_heads % p.num_kv_heads == 0 && p.head_dim >= 1 &&
                   p.head_dim <= cpu::kAttnMaxHeadDim && p.head_dim_v >= 0 &&
                   p.head_dim_v <= cpu::kAttnMaxHeadDim,
               "cuda attention: bad shape (nq %d, nk %d, heads %d/%d, head_dim %d, head_dim_v %d)", p.nq,
               p.nk, p.num_q_heads, p.num_kv_heads, p.head_dim, p.head_dim_v);
  ATTN_REQUIRE(p.dtype == attnFloat32 || p.dtype == attnFloat16 || p.dtype == attnBfloat16,
               "cuda attention: dtype %d is not fp32, fp16 or bf16", int(p.dtype));
  if (p.nq == 0) return attnSuccess;
  // V and O rows are valueDim(p) wide (MLA heads); p, head_dim_v included, goes to the CPU twin.
  const size_t e = eltBytes(p.dtype), d = size_t(p.head_dim), dv = size_t(cpu::valueDim(p));
  const size_t qRows = size_t(p.nq) * p.num_q_heads, kRows = size_t(p.nk) * p.num_kv_heads;
  std::vector<Region> regions = {{p.q, qRows * d * e, "q"},       {p.k, kRows * d * e, "k"},
                                 {p.v, kRows * dv * e, "v"},      {o, qRows * dv * 4, "o"},
                                 {lse, qRows * 4, "lse"}};
  if (p.causal) {
    regions.push_back({p.q_pos, size_t(p.nq) * 4, "q_pos"});
    regions.push_back({p.k_pos, size_t(p.nk) * 4, "k_pos"});
  }
  if (p.segments) regions.push_back({p.segments, size_t(p.num_segments) * sizeof(cpu::AttnSegment), "segments"});
  return launch(kernel, ex.stream, std::move(regions), [p, o, lse, accumulate] {
    return accumulate ? cpu::attentionAccumulate(p, o, lse) : cpu::attentionPartial(p, o, lse);
  });
}

std::vector<Region> partRegions(const cpu::AttnPartialRef* parts, int nparts, size_t rows, int d) {
  std::vector<Region> r;
  for (int j = 0; j < nparts; ++j) {
    r.push_back({parts[j].o, rows * size_t(d) * eltBytes(parts[j].o_dtype), "partial o"});
    r.push_back({parts[j].lse, rows * 4, "partial lse"});
  }
  return r;
}

}  // namespace

attnResult_t attentionPlan(const cpu::AttnProblem&, const AttnCudaExec&, AttnCudaPlan* plan) {
  ATTN_REQUIRE(plan != nullptr, "cuda attention: null plan");
  *plan = AttnCudaPlan{AttnCudaKernel::simt, false, 64, 64, 1};  // the CPU twin: fp32 throughout
  return attnSuccess;
}

attnResult_t attentionPartial(const cpu::AttnProblem& p, float* o, float* lse, const AttnCudaExec& ex) {
  return attention("attentionPartial", p, o, lse, ex, false);
}

attnResult_t attentionAccumulate(const cpu::AttnProblem& p, float* o, float* lse, const AttnCudaExec& ex) {
  return attention("attentionAccumulate", p, o, lse, ex, true);
}

attnResult_t initAccumulator(float* o, float* lse, int64_t rows, int heads, int head_dim,
                             cudaStream_t stream) {
  ATTN_REQUIRE(rows >= 0 && heads > 0 && head_dim > 0, "cuda initAccumulator: bad shape");
  const size_t n = size_t(rows) * heads;
  return launch("initAccumulator", stream, {{o, n * head_dim * 4, "o"}, {lse, n * 4, "lse"}},
                [=] {
                  cpu::initAccumulator(o, lse, rows, heads, head_dim);
                  return attnSuccess;
                });
}

attnResult_t mergePartials(float* o_acc, float* lse_acc, const cpu::AttnPartialRef* parts,
                           int nparts, size_t rows, int head_dim, cudaStream_t stream) {
  ATTN_REQUIRE(nparts >= 0 && head_dim > 0 && (nparts == 0 || parts), "cuda merge: bad arguments");
  std::vector<Region> regions = partRegions(parts, nparts, rows, head_dim);
  regions.push_back({o_acc, rows * head_dim * 4, "o_acc"});
  regions.push_back({lse_acc, rows * 4, "lse_acc"});
  std::vector<cpu::AttnPartialRef> copy(parts, parts + nparts);  // the array is the caller's
  return launch("mergePartials", stream, std::move(regions), [=] {
    return cpu::mergePartials(o_acc, lse_acc, copy.data(), nparts, rows, head_dim);
  });
}

attnResult_t foldPartial(float* o_acc, float* lse_acc, const cpu::AttnPartialRef& part, size_t rows,
                         int head_dim, cudaStream_t stream) {
  return mergePartials(o_acc, lse_acc, &part, 1, rows, head_dim, stream);
}

attnResult_t foldPartialRows(float* o_acc, float* lse_acc, const cpu::AttnPartialRef& part,
                             const int32_t* acc_rows, size_t ntokens, size_t acc_tokens, int heads,
                             int head_dim, cudaStream_t stream) {
  ATTN_REQUIRE(heads > 0 && head_dim > 0 && (ntokens == 0 || acc_rows), "cuda foldPartialRows: bad arguments");
  std::vector<Region> regions = partRegions(&part, 1, ntokens * heads, head_dim);
  regions.push_back({acc_rows, ntokens * 4, "acc_rows"});
  regions.push_back({o_acc, acc_tokens * heads * head_dim * 4, "o_acc"});
  regions.push_back({lse_acc, acc_tokens * heads * 4, "lse_acc"});
  return launch("foldPartialRows", stream, std::move(regions), [=] {
    // Token by token, skipping indices outside the accumulator (as the kernel).
    const size_t oTok = size_t(heads) * head_dim * eltBytes(part.o_dtype);
    for (size_t t = 0; t < ntokens; ++t) {
      const int32_t row = acc_rows[t];
      if (row < 0 || size_t(row) >= acc_tokens) continue;
      cpu::AttnPartialRef one{static_cast<const char*>(part.o) + t * oTok, part.o_dtype,
                              part.lse + t * heads};
      const int32_t zero = 0;
      ATTN_CHECK(cpu::foldPartialRows(o_acc + size_t(row) * heads * head_dim, lse_acc + size_t(row) * heads,
                                      one, &zero, 1, heads, head_dim));
    }
    return attnSuccess;
  });
}

namespace {

attnResult_t rows(const char* kernel, bool scatter, void* dst, const void* src, const int32_t* idx,
                  size_t n, size_t bound, size_t rowBytes, cudaStream_t stream) {
  if (n == 0 || rowBytes == 0) return attnSuccess;
  ATTN_REQUIRE(dst && src && idx, "%s: null pointer", kernel);
  const size_t dstRows = scatter ? bound : n, srcRows = scatter ? n : bound;
  return launch(kernel, stream,
                {{dst, dstRows * rowBytes, "dst"}, {src, srcRows * rowBytes, "src"}, {idx, n * 4, "idx"}},
                [=] {
                  for (size_t i = 0; i < n; ++i) {
                    const int32_t j = idx[i];
                    if (j < 0 || size_t(j) >= bound) continue;
                    const size_t di = scatter ? size_t(j) : i, si = scatter ? i : size_t(j);
                    std::memcpy(static_cast<char*>(dst) + di * rowBytes,
                                static_cast<const char*>(src) + si * rowBytes, rowBytes);
                  }
                  return attnSuccess;
                });
}

}  // namespace

attnResult_t gatherRows(void* dst, const void* src, const int32_t* idx, size_t n, size_t bound,
                        size_t row_bytes, cudaStream_t stream) {
  return rows("gatherRows", false, dst, src, idx, n, bound, row_bytes, stream);
}

attnResult_t scatterRows(void* dst, const void* src, const int32_t* idx, size_t n, size_t bound,
                         size_t row_bytes, cudaStream_t stream) {
  return rows("scatterRows", true, dst, src, idx, n, bound, row_bytes, stream);
}

attnResult_t gatherKeyTable(int64_t* rows, int32_t* pos, const cpu::KeyBlock* blocks, size_t nblocks,
                            int block_tokens, const int32_t* slot_pos, size_t slot_bound, cudaStream_t stream) {
  if (nblocks == 0) return attnSuccess;
  ATTN_REQUIRE(rows && pos && blocks && slot_pos, "cuda gatherKeyTable: null pointer");
  ATTN_REQUIRE(block_tokens > 0, "cuda gatherKeyTable: block_tokens = %d", block_tokens);
  // The table's extent is in the blocks (device memory): checked when it runs.
  return launch("gatherKeyTable", stream,
                {{blocks, nblocks * sizeof(cpu::KeyBlock), "blocks"},
                 {slot_pos, slot_bound * size_t(block_tokens) * 4, "slot_pos"}},
                [=] {
                  size_t entries = 0;
                  for (size_t b = 0; b < nblocks; ++b) {
                    const cpu::KeyBlock& k = blocks[b];
                    if (k.slot >= 0 && size_t(k.slot) < slot_bound && k.tokens > 0 && k.tokens <= block_tokens)
                      entries = std::max(entries, size_t(k.at) + size_t(k.tokens));
                  }
                  if (entries && (!attn_emu::deviceAccessible(rows, entries * 8) ||
                                  !attn_emu::deviceAccessible(pos, entries * 4)))
                    return setError(attnInvalidArgument, "gatherKeyTable: rows or pos (%zu entries) is not device memory",
                                    entries);
                  cpu::gatherKeyTable(rows, pos, blocks, nblocks, block_tokens, slot_pos, slot_bound);
                  return attnSuccess;
                });
}

attnResult_t reduce2(void* dst, const void* a, const void* b, size_t count, attnDataType_t type,
                     attnRedOp_t op, cudaStream_t stream) {
  ATTN_REQUIRE(validDataType(type) && validRedOp(op), "cuda reduce: bad type %d or op %d", int(type), int(op));
  const size_t bytes = count * dataTypeSize(type);
  return launch("reduce2", stream, {{dst, bytes, "dst"}, {a, bytes, "a"}, {b, bytes, "b"}}, [=] {
    cpu::reduce2(dst, a, b, count, type, op);
    return attnSuccess;
  });
}

attnResult_t reduceInto(void* dst, const void* src, size_t count, attnDataType_t type, attnRedOp_t op,
                        cudaStream_t stream) {
  ATTN_REQUIRE(validDataType(type) && validRedOp(op), "cuda reduce: bad type %d or op %d", int(type), int(op));
  const size_t bytes = count * dataTypeSize(type);
  return launch("reduceInto", stream, {{dst, bytes, "dst"}, {src, bytes, "src"}}, [=] {
    cpu::reduceInto(dst, src, count, type, op);
    return attnSuccess;
  });
}

attnResult_t divideInPlace(void* dst, size_t count, attnDataType_t type, int n, cudaStream_t stream) {
  ATTN_REQUIRE(validDataType(type) && n > 0, "cuda divideInPlace: bad type %d or divisor %d", int(type), n);
  return launch("divideInPlace", stream, {{dst, count * dataTypeSize(type), "dst"}}, [=] {
    cpu::divideInPlace(dst, count, type, n);
    return attnSuccess;
  });
}

attnResult_t convertToFloat(float* dst, const void* src, attnDataType_t type, size_t count,
                            cudaStream_t stream) {
  ATTN_REQUIRE(cpu::isAttnFloatType(type), "cuda convertToFloat: type %d", int(type));
  return launch("convertToFloat", stream, {{dst, count * 4, "dst"}, {src, count * dataTypeSize(type), "src"}},
                [=] { return cpu::convertToFloat(dst, src, type, count); });
}

attnResult_t convertFromFloat(void* dst, attnDataType_t type, const float* src, size_t count,
                              cudaStream_t stream) {
  ATTN_REQUIRE(cpu::isAttnFloatType(type), "cuda convertFromFloat: type %d", int(type));
  return launch("convertFromFloat", stream, {{dst, count * dataTypeSize(type), "dst"}, {src, count * 4, "src"}},
                [=] { return cpu::convertFromFloat(dst, type, src, count); });
}

attnResult_t writeLse(float* dst, const float* natural, int64_t rows, int heads, bool base2, bool head_major,
                      cudaStream_t stream) {
  if (rows == 0 || heads == 0) return attnSuccess;
  ATTN_REQUIRE(dst && natural, "cuda writeLse: null pointer");
  ATTN_REQUIRE(rows > 0 && heads > 0, "cuda writeLse: %lld rows, %d heads", (long long)rows, heads);
  ATTN_REQUIRE(!head_major || dst != natural, "cuda writeLse: head-major needs distinct buffers");
  const size_t n = size_t(rows) * size_t(heads);
  return launch("writeLse", stream, {{dst, n * 4, "dst"}, {natural, n * 4, "natural"}}, [=] {
    const float scale = base2 ? 1.4426950408889634f : 1.0f;
    for (size_t i = 0; i < n; ++i) {
      const size_t r = i / size_t(heads), h = i % size_t(heads);
      dst[head_major ? h * size_t(rows) + r : i] = natural[i] * scale;
    }
    return attnSuccess;
  });
}

attnResult_t applySinks(float* o, float* lse, int64_t rows, int heads, int head_dim, const float* sinks,
                        cudaStream_t stream) {
  ATTN_REQUIRE(rows >= 0 && heads > 0 && head_dim > 0, "cuda applySinks: %lld rows, %d heads, head_dim %d",
               (long long)rows, heads, head_dim);
  if (rows == 0) return attnSuccess;
  ATTN_REQUIRE(o && lse && sinks, "cuda applySinks: null pointer");
  const size_t n = size_t(rows) * size_t(heads);
  return launch("applySinks", stream,
                {{o, n * size_t(head_dim) * 4, "o"}, {lse, n * 4, "lse"}, {sinks, size_t(heads) * 4, "sinks"}},
                [=] {
                  cpu::applySinks(o, lse, rows, heads, head_dim, sinks);
                  return attnSuccess;
                });
}

}  // namespace attn::cuda
