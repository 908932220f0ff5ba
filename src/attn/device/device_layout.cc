#include "src/attn/device/device_layout.h"

#include <cuda_runtime_api.h>

#include <cstring>

#include "src/core/comm.h"
#include "src/core/error.h"
#include "src/device/cuda_check.h"
#include "src/device/device_state.h"

namespace attn {
namespace {

// Whether the GPU reads `p` where it is (device, managed, pinned host);
// false for pageable host memory. *pinned: host memory the CPU reads too.
bool gpuReadable(const void* p, bool* pinned) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // older runtimes fail on pageable memory
    return false;
  }
  *pinned = a.type == cudaMemoryTypeHost;
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged || a.type == cudaMemoryTypeHost;
}

}  // namespace

attnResult_t checkDeviceSinks(const attnAttnConfig_t& cfg) {
  bool pinned = false;
  ATTN_REQUIRE(cfg.sinks == nullptr || gpuReadable(cfg.sinks, &pinned),
               "cfg.sinks is pageable host memory: a device communicator reads the sinks on the GPU when the call "
               "runs; pass device, managed or pinned memory");
  return attnSuccess;
}

namespace {

struct Array {
  const char* name;
  const int32_t* p;
};

// Copies n ints from `src` (device, managed or pinned) to `dst` (host) on
// `stream` and waits: the stream is the proxy's own, idle between calls.
attnResult_t readInts(int32_t* dst, const int32_t* src, size_t n, cudaStream_t stream) {
  if (n == 0) return attnSuccess;
  bool pinned = false;
  if (gpuReadable(src, &pinned) && pinned) {
    std::memcpy(dst, src, n * sizeof(int32_t));
    return attnSuccess;
  }
  ATTN_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(int32_t), cudaMemcpyDefault, stream));
  ATTN_CUDA_CHECK(cudaStreamSynchronize(stream));
  return attnSuccess;
}

}  // namespace

attnResult_t DeviceCallLayout::capture(const void* q, const void* k, const void* v, const void* out,
                                       const attnSeqLayout_t& lay, const attnAttnConfig_t& cfg, int64_t* qRows,
                                       int64_t* kvRows) {
  user_ = lay;
  q_ = q, k_ = k, v_ = v, out_ = out;
  causal_ = cfg.causal;
  windowLeft_ = cfg.window_left;
  windowRight_ = cfg.window_right;
  const Array arrays[] = {{"q_offsets", lay.q_offsets}, {"q_pos", lay.q_pos}, {"kv_offsets", lay.kv_offsets},
                          {"kv_pos", lay.kv_pos}};
  const Array* onGpu = nullptr;
  const Array* onHost = nullptr;
  for (const Array& a : arrays) {
    if (!a.p || (lay.num_seqs == 0 && (a.p == lay.q_offsets || a.p == lay.kv_offsets))) continue;
    bool pinned = false;
    (gpuReadable(a.p, &pinned) ? onGpu : onHost) = &a;
  }
  if (onGpu && onHost)
    return setError(attnInvalidArgument,
                    "layout.%s is where the GPU reads it but layout.%s is pageable host memory: a device "
                    "communicator reads a layout at the call (every array in pageable host memory) or when the "
                    "call runs (every array in device, managed or pinned memory)",
                    onGpu->name, onHost->name);
  atRun_ = onGpu != nullptr;
  if (atRun_) {
    copy_ = std::make_shared<LayoutCopy>();
    *qRows = *kvRows = -1;
    return attnSuccess;
  }
  ATTN_CHECK(checkLayoutRows(q, k, v, out, lay, cfg, &qRows_, &kvRows_));
  *qRows = qRows_;
  *kvRows = kvRows_;
  copy_ = std::const_pointer_cast<LayoutCopy>(copyLayout(lay, qRows_, kvRows_));
  return attnSuccess;
}

attnResult_t DeviceCallLayout::resolve(attnComm* comm, const attnSeqLayout_t** layout, int64_t* qRows,
                                       int64_t* kvRows) const {
  LayoutCopy& lc = *copy_;
  if (!atRun_) {
    *layout = &lc.layout;
    *qRows = qRows_;
    *kvRows = kvRows_;
    return attnSuccess;
  }
  DeviceAttnState& R = comm->device->attn;
  ATTN_CHECK(R.prepare(0));
  const int S = user_.num_seqs;
  const size_t offs = size_t(S) + 1;
  lc.qOff.assign(offs, 0);
  lc.kvOff.assign(offs, 0);
  if (S > 0) {
    ATTN_REQUIRE(user_.q_offsets && user_.kv_offsets, "layout.q_offsets or layout.kv_offsets is NULL");
    ATTN_CHECK(readInts(lc.qOff.data(), user_.q_offsets, offs, R.compute));
    ATTN_CHECK(readInts(lc.kvOff.data(), user_.kv_offsets, offs, R.compute));
  }
  // Offsets first: they say how many positions there are.
  attnSeqLayout_t counted{S, lc.qOff.data(), user_.q_pos, lc.kvOff.data(), user_.kv_pos};
  attnAttnConfig_t shape = ATTN_ATTN_CONFIG_INITIALIZER;
  shape.causal = causal_;  // what decides whether positions are needed
  shape.window_left = windowLeft_;
  shape.window_right = windowRight_;
  ATTN_CHECK(checkLayoutRows(q_, k_, v_, out_, counted, shape, qRows, kvRows));
  lc.qPos.resize(size_t(*qRows));
  lc.kvPos.resize(size_t(*kvRows));
  if (user_.q_pos) ATTN_CHECK(readInts(lc.qPos.data(), user_.q_pos, lc.qPos.size(), R.compute));
  if (user_.kv_pos) ATTN_CHECK(readInts(lc.kvPos.data(), user_.kv_pos, lc.kvPos.size(), R.compute));
  lc.layout = {S, lc.qOff.data(), user_.q_pos ? lc.qPos.data() : nullptr, lc.kvOff.data(),
               user_.kv_pos ? lc.kvPos.data() : nullptr};
  *layout = &lc.layout;
  return attnSuccess;
}

}  // namespace attn
