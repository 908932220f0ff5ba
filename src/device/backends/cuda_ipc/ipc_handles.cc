#include "src/device/backends/cuda_ipc/ipc_handles.h"

#include <cuda.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <random>
#include <vector>

#include "src/core/error.h"
#include "src/device/cuda_check.h"
#include "src/device/backends/cuda_ipc/ipc_stats.h"

namespace attn::ipc {

IpcCounters& ipcCounters() {
  static IpcCounters c;
  return c;
}

uint64_t processToken() {
  static std::mutex mu;
  static pid_t owner = 0;
  static uint64_t token = 0;
  std::lock_guard<std::mutex> g(mu);
  if (owner != getpid()) {  // first use, or a forked child
    owner = getpid();
    std::random_device rd;
    token = (uint64_t(rd()) << 32) ^ rd() ^ (uint64_t(owner) << 20) ^
            uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
    if (token == 0) token = 1;
  }
  return token;
}

namespace {

using PointerGetAttributesFn = CUresult (*)(unsigned int, CUpointer_attribute*, void**, CUdeviceptr);

// cuPointerGetAttributes from the driver, found at run time (the library
// does not link libcuda); it alone gives an allocation's start and id.
attnResult_t pointerGetAttributes(PointerGetAttributesFn* out) {
  static PointerGetAttributesFn fn = nullptr;
  static cudaError_t err = cudaSuccess;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    err = cudaGetDriverEntryPointByVersion("cuPointerGetAttributes", &p, 12000, cudaEnableDefault,
                                           &found);
#else
    err = cudaGetDriverEntryPoint("cuPointerGetAttributes", &p, cudaEnableDefault, &found);
#endif
    if (err == cudaSuccess && found == cudaDriverEntryPointSuccess) fn = reinterpret_cast<PointerGetAttributesFn>(p);
  });
  if (!fn)
    return setError(attnUnhandledCudaError, "cuda_ipc: the CUDA driver has no cuPointerGetAttributes (%s)",
                    err != cudaSuccess ? cudaGetErrorString(err) : "symbol not found");
  *out = fn;
  return attnSuccess;
}

}  // namespace

attnResult_t IpcExporter::describe(const void* ptr, size_t bytes, int device, bool needHandle,
                                   IpcBuffer* out, std::string* why) {
  *out = IpcBuffer{};
  std::memset(&out->handle, 0, sizeof(out->handle));
  out->ptr = reinterpret_cast<uint64_t>(ptr);
  out->bytes = bytes;
  if (bytes == 0) {
    out->usable = 1;
    return attnSuccess;
  }
  PointerGetAttributesFn getAttrs = nullptr;
  ATTN_CHECK(pointerGetAttributes(&getAttrs));
  // Booleans are read into wide zeroed words: the driver writes at most that.
  unsigned int memType = 0, isManaged = 0, ipcCapable = 0;
  int ordinal = -1;
  unsigned long long bufferId = 0;
  CUdeviceptr start = 0;
  size_t rangeBytes = 0;
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                 CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                 CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                 CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE};
  void* data[] = {&memType, &isManaged, &ordinal, &bufferId, &start, &rangeBytes, &ipcCapable};
  CUresult r = getAttrs(sizeof(attrs) / sizeof(attrs[0]), attrs, data, reinterpret_cast<CUdeviceptr>(ptr));
  if (r != CUDA_SUCCESS) {
    *why = "cuPointerGetAttributes failed with CUresult " + std::to_string(int(r));
    return attnSuccess;
  }
  const uint64_t p = reinterpret_cast<uint64_t>(ptr);
  if (memType != CU_MEMORYTYPE_DEVICE || isManaged) {
    *why = "the buffer is not device memory (host, managed or unknown to CUDA)";
    return attnSuccess;
  }
  if (ordinal != device) {
    *why = "the buffer is on CUDA device " + std::to_string(ordinal) + ", the communicator on " +
           std::to_string(device);
    return attnSuccess;
  }
  if (start == 0 || p < start || p - start > rangeBytes || bytes > rangeBytes - (p - start)) {
    *why = "the buffer extends past its allocation";
    return attnSuccess;
  }
  out->base = start;
  if (needHandle) {
    if (!ipcCapable) {
      *why = "the allocation cannot be exported with cudaIpcGetMemHandle (stream-ordered pool or "
             "virtual memory management allocation)";
      return attnSuccess;
    }
    auto it = byBufferId_.find(bufferId);
    if (it != byBufferId_.end() && it->second.base == start) {
      ipcCounters().exportHits.fetch_add(1, std::memory_order_relaxed);
    } else {
      Exported e{};
      cudaError_t ce = cudaIpcGetMemHandle(&e.handle, reinterpret_cast<void*>(start));
      if (ce != cudaSuccess) {
        (void)cudaGetLastError();  // not sticky; keep it from surfacing in a later call
        *why = std::string("cudaIpcGetMemHandle failed: ") + cudaGetErrorString(ce);
        return attnSuccess;
      }
      e.base = start;
      // Buffer ids are never reused, so entries of freed buffers are only
      // dead weight: drop them all now and then.
      if (byBufferId_.size() >= 4096) byBufferId_.clear();
      it = byBufferId_.insert_or_assign(bufferId, e).first;
      ipcCounters().exports.fetch_add(1, std::memory_order_relaxed);
    }
    out->handle = it->second.handle;
    out->hasHandle = 1;
  }
  out->usable = 1;
  return attnSuccess;
}

IpcImporter::~IpcImporter() {
  while (!open_.empty()) closeOne(open_.begin());
}

void IpcImporter::closeOne(std::map<Key, Mapping>::iterator it) {
  // Teardown path: a failure leaves nothing to undo, the mapping is gone
  // from our books either way.
  if (cudaIpcCloseMemHandle(it->second.base) != cudaSuccess) (void)cudaGetLastError();
  ipcCounters().closes.fetch_add(1, std::memory_order_relaxed);
  open_.erase(it);
}

void IpcImporter::endOp() {
  while (open_.size() > limit_) {
    auto oldest = open_.end();
    for (auto it = open_.begin(); it != open_.end(); ++it)
      if (it->second.lastUse < epoch_ && (oldest == open_.end() || it->second.lastUse < oldest->second.lastUse))
        oldest = it;
    if (oldest == open_.end()) {
      if (limit_ != 0) return;  // every mapping is this operation's
      // limit 0: close everything now that the copies completed
      while (!open_.empty()) closeOne(open_.begin());
      return;
    }
    closeOne(oldest);
  }
}

attnResult_t IpcImporter::map(int peer, bool sameProcess, const IpcBuffer& buf, const char** out) {
  *out = nullptr;
  if (buf.bytes == 0) return attnSuccess;
  if (sameProcess) {
    *out = reinterpret_cast<const char*>(buf.ptr);
    return attnSuccess;
  }
  if (!buf.hasHandle || buf.ptr < buf.base)
    return setError(attnInternalError, "cuda_ipc: rank %d described a buffer without a usable handle", peer);
  Key key{};
  key.peer = peer;
  std::memcpy(key.handle, &buf.handle, sizeof(key.handle));
  auto it = open_.find(key);
  if (it != open_.end()) {
    ipcCounters().openHits.fetch_add(1, std::memory_order_relaxed);
  } else {
    void* base = nullptr;
    cudaError_t e = cudaIpcOpenMemHandle(&base, buf.handle, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return setError(attnUnhandledCudaError,
                      "cuda_ipc: cudaIpcOpenMemHandle of rank %d's buffer failed: %s (%s); are the "
                      "ranks really on one host (ATTN_HOSTID)?",
                      peer, cudaGetErrorString(e), cudaGetErrorName(e));
    }
    ipcCounters().opens.fetch_add(1, std::memory_order_relaxed);
    it = open_.emplace(key, Mapping{base, 0}).first;
  }
  it->second.lastUse = epoch_;
  *out = static_cast<const char*>(it->second.base) + (buf.ptr - buf.base);
  return attnSuccess;
}

}  // namespace attn::ipc
