// The CUDA runtime API functions attncomm and its tests call, on the
// emulated runtime of emu_core.h. Signatures are the toolkit's own
// (cuda_runtime_api.h); behaviour follows the CUDA documentation, strictly
// where that catches mistakes (bounds of device copies, stream handles,
// fork after use, cudaFree waiting for the whole device).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

#include "tests/cuda_emu/emu_core.h"

using namespace attn_emu;

namespace {

#define EMU_ENTER()                               \
  do {                                            \
    cudaError_t emu_e_ = enter();                 \
    if (emu_e_ != cudaSuccess) return fail(emu_e_, "%s: runtime unusable", __func__); \
  } while (0)

// EMU_ENTER for the calls CUDA counts as unsafe during captures.
#define EMU_ENTER_UNSAFE()                                                       \
  do {                                                                           \
    EMU_ENTER();                                                                 \
    if (cudaError_t emu_u_ = unsafeCallAllowed(__func__); emu_u_ != cudaSuccess) return emu_u_; \
  } while (0)

// A stream that captures cannot be waited for or queried from the host.
cudaError_t refuseIfCapturing(const std::shared_ptr<Stream>& st, const char* what) {
  std::shared_ptr<Capture> c = st->capture();
  if (!c) return cudaSuccess;
  c->invalidate();
  return fail(cudaErrorStreamCaptureUnsupported, "%s of a capturing stream (it invalidates the capture)", what);
}

// ---- events -------------------------------------------------------------------

struct EventTable {
  std::mutex mu;
  std::map<cudaEvent_t, std::shared_ptr<Event>> live;
};
EventTable& events() {
  static auto* t = new EventTable();
  return *t;
}

// ---- IPC handles --------------------------------------------------------------

constexpr uint32_t kIpcMagic = 0x41454d55;  // "AEMU"
struct IpcHandleBody {
  uint32_t magic;
  int32_t pid;
  int32_t fd;
  int32_t device;
  uint64_t bytes;
  uint64_t bufferId;
};
static_assert(sizeof(IpcHandleBody) <= CUDA_IPC_HANDLE_SIZE, "IPC handle body too large");

bool isDeviceSide(const void* p, size_t bytes, bool* known) {
  Allocation a;
  *known = findAllocation(p, 0, &a);
  return *known && findAllocation(p, bytes, nullptr);
}

// Checks one side of a copy: a pointer inside an allocation must keep the
// copy inside it; a side the kind calls "device" must be device memory.
cudaError_t checkSide(const void* p, size_t bytes, bool mustBeDevice, const char* side) {
  bool known = false;
  const bool inside = isDeviceSide(p, bytes, &known);
  if (known && !inside)
    return fail(cudaErrorInvalidValue, "copy of %zu bytes runs past the allocation of %s %p", bytes, side, p);
  if (mustBeDevice && !known)
    return fail(cudaErrorInvalidValue, "%s %p of a device copy is not device memory", side, p);
  return cudaSuccess;
}

cudaError_t copyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (!dst || !src) return fail(cudaErrorInvalidValue, "copy with a null pointer");
  const bool dstDev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool srcDev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (cudaError_t e = checkSide(dst, n, dstDev, "destination"); e != cudaSuccess) return e;
  if (cudaError_t e = checkSide(src, n, srcDev, "source"); e != cudaSuccess) return e;
  bool srcKnown = false, dstKnown = false;
  (void)isDeviceSide(src, n, &srcKnown);
  (void)isDeviceSide(dst, n, &dstKnown);
  if (!srcKnown && dstKnown) {
    // From pageable memory the runtime stages the source before returning.
    auto copy = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                    static_cast<const char*>(src) + n);
    return enqueue(s, [dst, copy] { std::memcpy(dst, copy->data(), copy->size()); });
  }
  return enqueue(s, [dst, src, n] { std::memmove(dst, src, n); });
}

}  // namespace

extern "C" {

// ---- errors -------------------------------------------------------------------

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
#define EMU_NAME(x) \
  case x: return #x;
    EMU_NAME(cudaSuccess)
    EMU_NAME(cudaErrorInvalidValue)
    EMU_NAME(cudaErrorMemoryAllocation)
    EMU_NAME(cudaErrorInitializationError)
    EMU_NAME(cudaErrorInvalidDevice)
    EMU_NAME(cudaErrorInvalidResourceHandle)
    EMU_NAME(cudaErrorDeviceUninitialized)
    EMU_NAME(cudaErrorNotReady)
    EMU_NAME(cudaErrorIllegalAddress)
    EMU_NAME(cudaErrorLaunchFailure)
    EMU_NAME(cudaErrorPeerAccessAlreadyEnabled)
    EMU_NAME(cudaErrorInvalidDevicePointer)
    EMU_NAME(cudaErrorMapBufferObjectFailed)
    EMU_NAME(cudaErrorNotSupported)
    EMU_NAME(cudaErrorNoDevice)
#undef EMU_NAME
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorDeviceUninitialized: return "invalid device context";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorPeerAccessAlreadyEnabled: return "peer access is already enabled";
    case cudaErrorMapBufferObjectFailed: return "mapping of buffer object failed";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    default: return "unknown error (emulated runtime)";
  }
}

cudaError_t cudaGetLastError(void) {
  cudaError_t e = lastError();
  lastError() = cudaSuccess;
  if (e == cudaSuccess) e = enter();
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  return lastError() != cudaSuccess ? lastError() : enter();
}

// ---- devices ------------------------------------------------------------------

cudaError_t cudaGetDeviceCount(int* count) {
  EMU_ENTER();
  if (!count) return fail(cudaErrorInvalidValue, "cudaGetDeviceCount(null)");
  *count = deviceCount();
  if (*count == 0) return fail(cudaErrorNoDevice, "ATTN_CUDA_EMU_DEVICES=0");
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  EMU_ENTER();
  if (!device) return fail(cudaErrorInvalidValue, "cudaGetDevice(null)");
  *device = currentDevice();
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  EMU_ENTER();
  if (device < 0 || device >= deviceCount())
    return fail(cudaErrorInvalidDevice, "cudaSetDevice(%d) of %d devices", device, deviceCount());
  currentDevice() = device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  EMU_ENTER();
  if (!prop || device < 0 || device >= deviceCount())
    return fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties(%d)", device);
  std::memset(prop, 0, sizeof(*prop));
  snprintf(prop->name, sizeof(prop->name), "attncomm emulated CUDA device %d", device);
  for (int i = 0; i < 16; ++i) prop->uuid.bytes[i] = char(0xa0 + i * 7 + device);
  prop->totalGlobalMem = size_t(16) << 30;
  prop->sharedMemPerBlock = kSharedMemoryDefault;
  prop->sharedMemPerBlockOptin = kSharedMemoryOptin;
  prop->sharedMemPerMultiprocessor = 228 << 10;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 4;
  prop->pciBusID = device + 1;
  prop->unifiedAddressing = 1;
  prop->canMapHostMemory = 1;
  prop->concurrentKernels = 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  EMU_ENTER();
  if (!value || device < 0 || device >= deviceCount())
    return fail(cudaErrorInvalidDevice, "cudaDeviceGetAttribute on device %d", device);
  cudaDeviceProp p;
  (void)cudaGetDeviceProperties(&p, device);
  switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = int(p.sharedMemPerBlockOptin); break;
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrMemoryPoolsSupported: *value = 1; break;
    default: *value = 0; break;
  }
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  EMU_ENTER();
  if (func == nullptr) return fail(cudaErrorInvalidDeviceFunction, "cudaFuncSetAttribute(null)");
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
    return cudaSuccess;  // the other attributes are hints the emulation has no use for
  if (value < 0 || size_t(value) > kSharedMemoryOptin)
    return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: %d bytes of shared memory (opt-in limit %zu)",
                value, kSharedMemoryOptin);
  setMaxDynamicSharedMemory(func, size_t(value));
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  EMU_ENTER_UNSAFE();
  synchronizeDevice(currentDevice());
  return enter();
}

cudaError_t cudaDeviceCanAccessPeer(int* can, int device, int peer) {
  EMU_ENTER();
  if (!can || device < 0 || peer < 0 || device >= deviceCount() || peer >= deviceCount())
    return fail(cudaErrorInvalidDevice, "cudaDeviceCanAccessPeer(%d, %d)", device, peer);
  *can = device != peer;  // as CUDA: a device is not its own peer
  return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  EMU_ENTER();
  static std::mutex mu;
  static std::map<std::pair<int, int>, bool>* enabled = new std::map<std::pair<int, int>, bool>();
  if (peer < 0 || peer >= deviceCount() || peer == currentDevice() || flags != 0)
    return fail(cudaErrorInvalidDevice, "cudaDeviceEnablePeerAccess(%d) from %d", peer, currentDevice());
  std::lock_guard<std::mutex> g(mu);
  bool& on = (*enabled)[{currentDevice(), peer}];
  if (on) return fail(cudaErrorPeerAccessAlreadyEnabled, "peer access %d -> %d", currentDevice(), peer);
  on = true;
  return cudaSuccess;
}

// ---- memory -------------------------------------------------------------------

cudaError_t cudaMalloc(void** p, size_t bytes) {
  EMU_ENTER_UNSAFE();
  if (!p) return fail(cudaErrorInvalidValue, "cudaMalloc(null)");
  return allocate(MemKind::kDevice, bytes, p);
}

cudaError_t cudaFree(void* p) {
  EMU_ENTER_UNSAFE();
  // cudaFree waits for the whole device, as the real one does (the trap the
  // README warns of for ranks sharing a GPU shows up here too).
  synchronizeDevice(currentDevice());
  return release(p, MemKind::kDevice);
}

cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t s) {
  EMU_ENTER();
  if (!p) return fail(cudaErrorInvalidValue, "cudaMallocAsync(null)");
  if (!resolve(s)) return fail(cudaErrorInvalidResourceHandle, "cudaMallocAsync on stream %p", (void*)s);
  return allocate(MemKind::kPool, bytes, p);
}

cudaError_t cudaFreeAsync(void* p, cudaStream_t s) {
  EMU_ENTER();
  if (!p) return cudaSuccess;
  Allocation a;
  if (!findAllocation(p, 0, &a) || a.base != reinterpret_cast<uintptr_t>(p) ||
      (a.kind != MemKind::kPool && a.kind != MemKind::kDevice))
    return fail(cudaErrorInvalidValue, "cudaFreeAsync(%p): not a device allocation", p);
  return enqueue(s, [p] { (void)release(p, MemKind::kDevice); });
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int flags) {
  EMU_ENTER_UNSAFE();
  if (!p) return fail(cudaErrorInvalidValue, "cudaHostAlloc(null)");
  return allocate(MemKind::kPinned, bytes, p);
}

cudaError_t cudaMallocHost(void** p, size_t bytes) { return cudaHostAlloc(p, bytes, 0); }

cudaError_t cudaFreeHost(void* p) {
  EMU_ENTER_UNSAFE();
  synchronizeDevice(currentDevice());
  return release(p, MemKind::kPinned);
}

cudaError_t cudaHostGetDevicePointer(void** dev, void* host, unsigned int flags) {
  EMU_ENTER();
  Allocation a;
  if (!dev || !findAllocation(host, 0, &a) || a.kind != MemKind::kPinned)
    return fail(cudaErrorInvalidValue, "cudaHostGetDevicePointer(%p): not pinned host memory", host);
  *dev = host;  // unified addressing
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* at, const void* p) {
  EMU_ENTER();
  if (!at) return fail(cudaErrorInvalidValue, "cudaPointerGetAttributes(null)");
  std::memset(at, 0, sizeof(*at));
  Allocation a;
  if (!findAllocation(p, 0, &a)) {
    at->type = cudaMemoryTypeUnregistered;
    at->device = -2;
    at->hostPointer = const_cast<void*>(p);
    return cudaSuccess;
  }
  at->type = a.kind == MemKind::kPinned ? cudaMemoryTypeHost : cudaMemoryTypeDevice;
  at->device = a.device;
  at->devicePointer = const_cast<void*>(p);
  if (a.kind == MemKind::kPinned) at->hostPointer = const_cast<void*>(p);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t s) {
  EMU_ENTER();
  return copyAsync(dst, src, n, kind, s);
}

// Row by row: the same bytes in the same stream order as one 2D copy.
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                              size_t height, cudaMemcpyKind kind, cudaStream_t s) {
  EMU_ENTER();
  if (width > dpitch || width > spitch)
    return fail(cudaErrorInvalidPitchValue, "2D copy of %zu-byte rows with pitches %zu and %zu", width, dpitch, spitch);
  for (size_t r = 0; r < height && width; ++r)
    if (cudaError_t e = copyAsync(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch,
                                  width, kind, s);
        e != cudaSuccess)
      return e;
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  EMU_ENTER_UNSAFE();
  if (cudaError_t e = copyAsync(dst, src, n, kind, nullptr); e != cudaSuccess) return e;
  (void)synchronizeStream(nullptr);
  return enter();
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t n, cudaStream_t s) {
  EMU_ENTER();
  if (n == 0) return cudaSuccess;
  if (!deviceAccessible(p, n))
    return fail(cudaErrorInvalidValue, "cudaMemset of %zu bytes at %p: not (all) device memory", n, p);
  return enqueue(s, [p, value, n] { std::memset(p, value, n); });
}

cudaError_t cudaMemset(void* p, int value, size_t n) {
  EMU_ENTER_UNSAFE();
  if (cudaError_t e = cudaMemsetAsync(p, value, n, nullptr); e != cudaSuccess) return e;
  (void)synchronizeStream(nullptr);
  return enter();
}

// ---- streams ------------------------------------------------------------------

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  EMU_ENTER();
  if (!s) return fail(cudaErrorInvalidValue, "cudaStreamCreate(null)");
  *s = createStream((flags & cudaStreamNonBlocking) == 0);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  EMU_ENTER();
  return destroyStream(s);
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  EMU_ENTER_UNSAFE();
  if (std::shared_ptr<Stream> st = resolve(s))
    if (cudaError_t e = refuseIfCapturing(st, "cudaStreamSynchronize"); e != cudaSuccess) return e;
  if (cudaError_t e = synchronizeStream(s); e != cudaSuccess) return e;
  return enter();
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
  EMU_ENTER();
  std::shared_ptr<Stream> st = resolve(s);
  if (!st) return fail(cudaErrorInvalidResourceHandle, "cudaStreamQuery(%p)", (void*)s);
  if (cudaError_t e = refuseIfCapturing(st, "cudaStreamQuery"); e != cudaSuccess) return e;
  return st->reached(st->mark()) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned int flags) {
  EMU_ENTER();
  std::shared_ptr<Event> e = eventOf(ev);
  if (!e) return fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent on event %p", (void*)ev);
  std::shared_ptr<Stream> st = resolve(s);
  if (!st) return fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent on stream %p", (void*)s);
  uint64_t gen;
  std::shared_ptr<Capture> captured;
  Capture::Wait wait{};
  {
    std::lock_guard<std::mutex> g(e->mu);
    gen = e->recorded;  // the most recent record at the time of the call
    captured = e->captured;
    wait.from = e->capturedOn;
    wait.fromNodes = e->capturedNodes;
  }
  const std::shared_ptr<Capture> mine = st->capture();
  wait.to = st.get();
  if (captured) {
    if (captured == mine) {  // the capture is in order already
      wait.toNodes = mine->nodesOf(st.get());
      mine->addWait(wait);
      return cudaSuccess;
    }
    if (mine) {
      captured->invalidate();
      mine->invalidate();
      return fail(cudaErrorStreamCaptureIsolation, "cudaStreamWaitEvent joins two different captures");
    }
    // A fork: this stream's work now goes into the capture too.
    wait.toNodes = 0;
    captured->addWait(wait);
    {
      std::lock_guard<std::mutex> g(captured->mu);
      captured->forked.push_back(st);
    }
    st->setCapture(captured);
    return cudaSuccess;
  }
  if (mine && gen != 0) {
    mine->invalidate();
    return fail(cudaErrorStreamCaptureIsolation,
                "cudaStreamWaitEvent in a capture on an event recorded outside it");
  }
  if (gen == 0) return cudaSuccess;
  return enqueue(s, [e, gen] {
    std::unique_lock<std::mutex> g(e->mu);
    e->cv.wait(g, [&] { return e->completed >= gen; });
  });
}

// ---- events -------------------------------------------------------------------

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* ev, unsigned int flags) {
  EMU_ENTER();
  if (!ev) return fail(cudaErrorInvalidValue, "cudaEventCreate(null)");
  auto e = std::make_shared<Event>();
  e->timing = (flags & cudaEventDisableTiming) == 0;
  *ev = reinterpret_cast<cudaEvent_t>(e.get());
  std::lock_guard<std::mutex> g(events().mu);
  events().live[*ev] = std::move(e);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* ev) { return cudaEventCreateWithFlags(ev, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t ev) {
  EMU_ENTER();
  std::lock_guard<std::mutex> g(events().mu);
  if (events().live.erase(ev) == 0)
    return fail(cudaErrorInvalidResourceHandle, "cudaEventDestroy(%p): not a live event", (void*)ev);
  return cudaSuccess;  // pending records and waits hold their own reference
}

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s) {
  EMU_ENTER();
  std::shared_ptr<Event> e = eventOf(ev);
  if (!e) return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord(%p)", (void*)ev);
  std::shared_ptr<Stream> st = resolve(s);
  if (!st) return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord on stream %p", (void*)s);
  if (std::shared_ptr<Capture> c = st->capture()) {
    // A node of the graph: later waits in the capture are ordered anyway
    // (the nodes before it are remembered, for the joins).
    const uint64_t before = c->nodesOf(st.get());
    std::lock_guard<std::mutex> g(e->mu);
    e->captured = std::move(c);
    e->capturedOn = st.get();
    e->capturedNodes = before;
    return cudaSuccess;
  }
  uint64_t gen;
  {
    std::lock_guard<std::mutex> g(e->mu);
    gen = ++e->recorded;
    e->captured = nullptr;
  }
  return enqueue(s, [e, gen] {
    {
      std::lock_guard<std::mutex> g(e->mu);
      if (gen > e->completed) e->completed = gen;
      e->completedAtMs = nowMs();
    }
    e->cv.notify_all();
  });
}

cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
  EMU_ENTER();
  std::shared_ptr<Event> e = eventOf(ev);
  if (!e) return fail(cudaErrorInvalidResourceHandle, "cudaEventSynchronize(%p)", (void*)ev);
  if (cudaError_t u = unsafeCallAllowed("cudaEventSynchronize"); u != cudaSuccess) return u;
  {
    std::unique_lock<std::mutex> g(e->mu);
    if (e->captured) return fail(cudaErrorCapturedEvent, "cudaEventSynchronize on an event recorded in a capture");
    const uint64_t gen = e->recorded;
    e->cv.wait(g, [&] { return e->completed >= gen; });
  }
  return enter();
}

cudaError_t cudaEventQuery(cudaEvent_t ev) {
  EMU_ENTER();
  std::shared_ptr<Event> e = eventOf(ev);
  if (!e) return fail(cudaErrorInvalidResourceHandle, "cudaEventQuery(%p)", (void*)ev);
  std::lock_guard<std::mutex> g(e->mu);
  if (e->captured) return fail(cudaErrorCapturedEvent, "cudaEventQuery on an event recorded in a capture");
  return e->completed >= e->recorded ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  EMU_ENTER();
  std::shared_ptr<Event> ea = eventOf(a), eb = eventOf(b);
  if (!ms || !ea || !eb) return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime");
  if (!ea->timing || !eb->timing) return fail(cudaErrorInvalidResourceHandle, "event without timing");
  std::lock_guard<std::mutex> ga(ea->mu);
  if (ea->recorded == 0 || ea->completed < ea->recorded) return cudaErrorNotReady;
  std::lock_guard<std::mutex> gb(eb->mu);
  if (eb->recorded == 0 || eb->completed < eb->recorded) return cudaErrorNotReady;
  *ms = float(eb->completedAtMs - ea->completedAtMs);
  return cudaSuccess;
}

// ---- IPC ----------------------------------------------------------------------

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* h, void* p) {
  EMU_ENTER();
  Allocation a;
  if (!h || !findAllocation(p, 0, &a) || a.base != reinterpret_cast<uintptr_t>(p))
    return fail(cudaErrorInvalidValue, "cudaIpcGetMemHandle(%p): not the start of an allocation", p);
  if (a.kind != MemKind::kDevice)
    return fail(cudaErrorInvalidValue, "cudaIpcGetMemHandle(%p): only cudaMalloc memory can be exported", p);
  std::memset(h, 0, sizeof(*h));
  IpcHandleBody b{kIpcMagic, int32_t(getpid()), a.fd, a.device, a.bytes, a.bufferId};
  std::memcpy(h->reserved, &b, sizeof(b));
  return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void** p, cudaIpcMemHandle_t h, unsigned int flags) {
  EMU_ENTER();
  IpcHandleBody b;
  std::memcpy(&b, h.reserved, sizeof(b));
  if (!p || b.magic != kIpcMagic) return fail(cudaErrorInvalidValue, "cudaIpcOpenMemHandle: not a handle");
  if (b.pid == getpid())
    return fail(cudaErrorDeviceUninitialized, "cudaIpcOpenMemHandle: the handle was made by this process");
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/fd/%d", b.pid, b.fd);
  const int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return fail(cudaErrorMapBufferObjectFailed, "cudaIpcOpenMemHandle: cannot open %s", path);
  void* m = mmap(nullptr, b.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return fail(cudaErrorMapBufferObjectFailed, "cudaIpcOpenMemHandle: mmap failed");
  Allocation a;
  a.base = reinterpret_cast<uintptr_t>(m);
  a.bytes = b.bytes;
  a.kind = MemKind::kIpcMapped;
  a.device = b.device;
  a.bufferId = b.bufferId;
  registerMapping(a);
  *p = m;
  return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void* p) {
  EMU_ENTER();
  Allocation a;
  if (!unregisterMapping(reinterpret_cast<uintptr_t>(p), &a))
    return fail(cudaErrorInvalidValue, "cudaIpcCloseMemHandle(%p): not an opened handle", p);
  munmap(p, a.bytes);
  return cudaSuccess;
}

}  // extern "C"

namespace attn_emu {

std::shared_ptr<Event> eventOf(cudaEvent_t e) {
  std::lock_guard<std::mutex> g(events().mu);
  auto it = events().live.find(e);
  return it == events().live.end() ? nullptr : it->second;
}

}  // namespace attn_emu
