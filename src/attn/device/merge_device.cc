#include "src/attn/device/merge_device.h"

#include <cuda_runtime_api.h>

#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "src/core/comm.h"
#include "src/core/datatype.h"
#include "src/core/error.h"
#include "src/device/cuda_check.h"
#include "src/device/device_route.h"
#include "src/device/device_scope.h"
#include "src/device/device_state.h"

namespace attn {
namespace {

// The device `p` lives on; fails unless the GPU can read it (device or
// managed memory).
attnResult_t deviceOf(const void* p, const char* what, int* device) {
  cudaPointerAttributes a{};
  const cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess || (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)) {
    (void)cudaGetLastError();
    return setError(attnInvalidArgument, "%s (%p) is not device memory: a merge on a stream needs device buffers",
                    what, p);
  }
  *device = a.device;
  return attnSuccess;
}

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

attnResult_t mergeStatesOnDevice(int n, const void* const* outs, const float* const* lses, void* out, float* lse,
                                 int64_t rows, int heads, int headDim, attnDataType_t dtype, attnLseBase_t base,
                                 attnLseLayout_t layout, attnStream_t stream) {
  int device = -1, other = -1;
  ATTN_CHECK(deviceOf(out, "out", &device));
  for (int j = 0; j < n; ++j) {
    ATTN_CHECK(deviceOf(outs[j], "outs[j]", &other));
    ATTN_CHECK(deviceOf(lses[j], "lses[j]", &other));
  }
  if (lse) ATTN_CHECK(deviceOf(lse, "lse", &other));
  DeviceScope scope;
  ATTN_CHECK(scope.enter(device));
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  const size_t cells = size_t(rows) * size_t(heads), elems = cells * size_t(headDim);
  // The fp32 accumulator, stream-ordered: freed once the merge has run.
  char* scratch = nullptr;
  ATTN_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&scratch), align256(elems * sizeof(float)) +
                                                                         cells * sizeof(float), s));
  float* acc = reinterpret_cast<float*>(scratch);
  float* accLse = reinterpret_cast<float*>(scratch + align256(elems * sizeof(float)));
  // Every partial folds into an empty accumulator, its LSE read in the
  // caller's convention by the merge kernel (no conversion pass).
  attnResult_t r = cuda::initAccumulator(acc, accLse, rows, heads, headDim, s);
  std::vector<cpu::AttnPartialRef> parts;
  for (int j = 0; j < n; ++j) parts.push_back({outs[j], dtype, lses[j], base, layout, heads});
  if (r == attnSuccess) r = cuda::mergePartials(acc, accLse, parts.data(), n, cells, headDim, s);
  if (r == attnSuccess) r = cuda::convertFromFloat(out, dtype, acc, elems, s);
  if (r == attnSuccess && lse) {
    if (base == attnLseNatural && layout == attnLseTokenMajor) {
      if (cudaMemcpyAsync(lse, accLse, cells * sizeof(float), cudaMemcpyDeviceToDevice, s) != cudaSuccess)
        r = setError(attnUnhandledCudaError, "merge: copying the merged lse failed");
    } else {
      r = cuda::writeLse(lse, accLse, rows, heads, base == attnLseBase2, layout == attnLseHeadMajor, s);
    }
  }
  (void)cudaFreeAsync(scratch, s);
  return r;
}

attnResult_t enqueueMergeCollective(attnComm* comm, attnStream_t stream, bool allGather, const MergeShape& s,
                                    const void* outPart, const float* lsePart, void* out, float* lse) {
  return deviceEnqueueWork(comm, stream, [=]() -> attnResult_t {
    ErrorContext ctx(comm->prefix);
    DeviceState& dev = *comm->device;
    cudaStream_t copy = dev.bridge->copyStream();
    const size_t cells = size_t(s.rows) * size_t(s.heads);
    const size_t oBytes = cells * size_t(s.headDim) * dataTypeSize(s.dtype), lBytes = cells * sizeof(float);
    const int n = comm->nranks;
    const int h0 = mergeHeadBegin(comm->rank, s.heads, n), mine = mergeHeadBegin(comm->rank + 1, s.heads, n) - h0;
    const size_t outCells = allGather ? cells : size_t(s.rows) * size_t(mine);
    const size_t outO = outCells * size_t(s.headDim) * dataTypeSize(s.dtype), outL = outCells * sizeof(float);
    // Pinned staging: the partial, then the result.
    ATTN_CHECK(dev.arena.reserve(align256(oBytes) + align256(lBytes) + align256(outO) + outL));
    char* base = dev.arena.base();
    char* hostO = base;
    float* hostL = reinterpret_cast<float*>(base + align256(oBytes));
    char* resO = base + align256(oBytes) + align256(lBytes);
    float* resL = reinterpret_cast<float*>(resO + align256(outO));
    if (oBytes) ATTN_CUDA_CHECK(cudaMemcpyAsync(hostO, outPart, oBytes, cudaMemcpyDefault, copy));
    if (lBytes) ATTN_CUDA_CHECK(cudaMemcpyAsync(hostL, lsePart, lBytes, cudaMemcpyDefault, copy));
    ATTN_CUDA_CHECK(cudaStreamSynchronize(copy));
    ATTN_CHECK(allGather ? mergeAllGather(comm, s, hostO, hostL, resO, resL)
                         : mergeReduceScatter(comm, s, hostO, hostL, resO, resL));
    if (outO) ATTN_CUDA_CHECK(cudaMemcpyAsync(out, resO, outO, cudaMemcpyDefault, copy));
    if (lse && outL) ATTN_CUDA_CHECK(cudaMemcpyAsync(lse, resL, outL, cudaMemcpyDefault, copy));
    ATTN_CUDA_CHECK(cudaStreamSynchronize(copy));
    return attnSuccess;
  });
}

}  // namespace attn
