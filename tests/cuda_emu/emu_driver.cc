// The driver functions attncomm looks up at run time
// (cudaGetDriverEntryPoint): stream memory waits and writes, and pointer
// attributes.
#include <cuda.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "tests/cuda_emu/emu_core.h"

using namespace attn_emu;

namespace {

CUresult waitValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  if (enter() != cudaSuccess) return CUDA_ERROR_NOT_INITIALIZED;
  auto* word = reinterpret_cast<volatile uint32_t*>(addr);
  if (!deviceAccessible(const_cast<uint32_t*>(word), sizeof(uint32_t))) return CUDA_ERROR_INVALID_VALUE;
  if ((flags & 0x3) != CU_STREAM_WAIT_VALUE_GEQ && (flags & 0x3) != CU_STREAM_WAIT_VALUE_EQ)
    return CUDA_ERROR_NOT_SUPPORTED;
  const bool geq = (flags & 0x3) == CU_STREAM_WAIT_VALUE_GEQ;
  cudaError_t e = enqueue(reinterpret_cast<cudaStream_t>(stream), [word, value, geq] {
    // The GPU polls the word over the bus; so do we, gently.
    for (int spins = 0;; ++spins) {
      const uint32_t v = __atomic_load_n(word, __ATOMIC_ACQUIRE);
      if (geq ? int32_t(v - value) >= 0 : v == value) return;
      if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  });
  return e == cudaSuccess ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult writeValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  if (enter() != cudaSuccess) return CUDA_ERROR_NOT_INITIALIZED;
  auto* word = reinterpret_cast<volatile uint32_t*>(addr);
  if (!deviceAccessible(const_cast<uint32_t*>(word), sizeof(uint32_t))) return CUDA_ERROR_INVALID_VALUE;
  if (flags != CU_STREAM_WRITE_VALUE_DEFAULT) return CUDA_ERROR_NOT_SUPPORTED;
  cudaError_t e = enqueue(reinterpret_cast<cudaStream_t>(stream),
                          [word, value] { __atomic_store_n(word, value, __ATOMIC_RELEASE); });
  return e == cudaSuccess ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult pointerGetAttributes(unsigned int n, CUpointer_attribute* attrs, void** data, CUdeviceptr ptr) {
  if (enter() != cudaSuccess) return CUDA_ERROR_NOT_INITIALIZED;
  Allocation a;
  const bool known = findAllocation(reinterpret_cast<void*>(ptr), 0, &a);
  // Unknown pointers get zero / null values, not an error (as the driver).
  for (unsigned int i = 0; i < n; ++i) {
    switch (attrs[i]) {
      case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *static_cast<unsigned int*>(data[i]) =
            !known ? 0 : a.kind == MemKind::kPinned ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
        break;
      case CU_POINTER_ATTRIBUTE_IS_MANAGED: *static_cast<unsigned int*>(data[i]) = 0; break;
      case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *static_cast<int*>(data[i]) = known ? a.device : -2; break;
      case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        *static_cast<unsigned long long*>(data[i]) = known ? a.bufferId : 0;
        break;
      case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *static_cast<CUdeviceptr*>(data[i]) = known ? CUdeviceptr(a.base) : 0;
        break;
      case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *static_cast<size_t*>(data[i]) = known ? a.bytes : 0; break;
      case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        *static_cast<unsigned int*>(data[i]) = known && a.kind == MemKind::kDevice;
        break;
      default: return CUDA_ERROR_INVALID_VALUE;
    }
  }
  return CUDA_SUCCESS;
}

cudaError_t lookup(const char* symbol, void** fn, cudaDriverEntryPointQueryResult* status) {
  if (cudaError_t e = enter(); e != cudaSuccess) return e;
  if (!symbol || !fn) return cudaErrorInvalidValue;
  *fn = nullptr;
  if (std::strcmp(symbol, "cuStreamWaitValue32") == 0) *fn = reinterpret_cast<void*>(&waitValue32);
  if (std::strcmp(symbol, "cuStreamWriteValue32") == 0) *fn = reinterpret_cast<void*>(&writeValue32);
  if (std::strcmp(symbol, "cuPointerGetAttributes") == 0) *fn = reinterpret_cast<void*>(&pointerGetAttributes);
  if (status) *status = *fn ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}

}  // namespace

extern "C" {

cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** fn, unsigned long long flags,
                                    cudaDriverEntryPointQueryResult* status) {
  return lookup(symbol, fn, status);
}

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int version,
                                             unsigned long long flags,
                                             cudaDriverEntryPointQueryResult* status) {
  return lookup(symbol, fn, status);
}

}  // extern "C"
