#include "src/device/stream_bridge.h"

#include <cuda.h>

#include <chrono>
#include <mutex>
#include <vector>

#include "src/core/log.h"
#include "src/device/cuda_check.h"
#include "src/device/parked_streams.h"

namespace attn {
namespace {

std::atomic<int> liveCaptured{0};  // StreamBridge::capturedAlive

// cuStreamWaitValue32 and cuStreamWriteValue32 have this signature.
using StreamValue32Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

// A stream memory operation from the driver, found at run time so the
// library does not link libcuda (absent on machines without a GPU driver).
attnResult_t findStreamValue32(const char* name, void** fn) {
  cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
  cudaError_t e = cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &found);
#else
  cudaError_t e = cudaGetDriverEntryPoint(name, fn, cudaEnableDefault, &found);
#endif
  if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || *fn == nullptr)
    return setError(attnUnhandledCudaError,
                    "the CUDA driver has no %s (%s): device communicators need stream memory operations",
                    name, e != cudaSuccess ? cudaGetErrorString(e) : "symbol not found");
  return attnSuccess;
}

// The bridges' counter words: pinned, mapped host memory that is never
// freed. cudaFreeHost waits for the whole device, and the streams of other
// ranks sharing the GPU may be parked on their proxies, waiting for this
// thread's next call (destroying a split communicator while the parent's
// collectives are queued hung that way). A destroyed bridge's word is
// reused by the next one, which counts on from the word's value: a stream
// may not yet have passed its last wait on the word (waits are "value >=
// seq", cyclic), and resetting it would stall that stream. One word per
// 64-byte line.
class CounterWords {
 public:
  attnResult_t take(volatile uint32_t** word) {
    for (;;) {
      {
        std::lock_guard<std::mutex> g(mu_);
        if (!free_.empty()) {
          *word = free_.back();
          free_.pop_back();
          return attnSuccess;
        }
      }
      // The page is allocated outside the lock: give() runs in a graph's
      // user-object destructor, on CUDA's side of a call that may hold
      // CUDA's own locks, so this lock is never held across a CUDA call
      // (TSan found the cycle on the emulated runtime).
      void* page = nullptr;
      ATTN_CUDA_CHECK(cudaHostAlloc(&page, kPage, cudaHostAllocMapped | cudaHostAllocPortable));
      std::lock_guard<std::mutex> g(mu_);
      for (size_t off = 0; off < kPage; off += kLine)
        free_.push_back(reinterpret_cast<volatile uint32_t*>(static_cast<char*>(page) + off));
    }
  }
  void give(volatile uint32_t* word) {
    std::lock_guard<std::mutex> g(mu_);
    free_.push_back(word);
  }

 private:
  static constexpr size_t kPage = 4096, kLine = 64;
  std::mutex mu_;
  std::vector<volatile uint32_t*> free_;
};

// Set on every bridge's proxy thread: waiting for the bridge from there
// would wait for itself (deviceWaitIdle).
thread_local bool tlsOnProxy = false;

CounterWords& counterWords() {
  static CounterWords* words = new CounterWords();  // outlives every bridge
  return *words;
}

// The calling thread in relaxed capture mode for the scope: allocations it
// makes for the library (pinned flag words) then never break the capture
// the thread itself is making.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { (void)cudaThreadExchangeStreamCaptureMode(&saved_); }
  ~RelaxedCaptureMode() { (void)cudaThreadExchangeStreamCaptureMode(&saved_); }

 private:
  cudaStreamCaptureMode saved_ = cudaStreamCaptureModeRelaxed;
};

// Makes `device` current for the scope, restoring the caller's device.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&saved_) != cudaSuccess) saved_ = -1;
    if (saved_ != device) err_ = cudaSetDevice(device);
  }
  ~DeviceScope() {
    if (saved_ >= 0) (void)cudaSetDevice(saved_);
  }
  cudaError_t error() const { return err_; }

 private:
  int saved_ = -1;
  cudaError_t err_ = cudaSuccess;
};

}  // namespace

bool StreamBridge::onProxyThread() { return tlsOnProxy; }

attnResult_t StreamBridge::create(int device, OnError onError, std::unique_ptr<StreamBridge>* out) {
  std::unique_ptr<StreamBridge> b(new StreamBridge());
  ATTN_CHECK(b->start(device, std::move(onError)));
  *out = std::move(b);
  return attnSuccess;
}

attnResult_t StreamBridge::start(int device, OnError onError) {
  int count = 0;
  ATTN_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (device < 0 || device >= count)
    return setError(attnInvalidArgument, "CUDA device %d does not exist (this process sees %d)",
                    device, count);
  device_ = device;
  onError_ = std::move(onError);
  link_ = std::make_shared<CaptureLink>();
  link_->bridge = this;
  DeviceScope scope(device);
  ATTN_CUDA_CHECK(scope.error());
  ATTN_CHECK(findStreamValue32("cuStreamWaitValue32", &waitValue32_));
  ATTN_CUDA_CHECK(cudaStreamCreateWithFlags(&copyStream_, cudaStreamNonBlocking));
  ATTN_CHECK(counterWords().take(&counter_));
  const uint32_t base = __atomic_load_n(const_cast<uint32_t*>(counter_), __ATOMIC_SEQ_CST);
  issued_.store(base);
  completed_.store(base);
  ATTN_CUDA_CHECK(cudaHostGetDevicePointer(&counterDev_, const_cast<uint32_t*>(counter_), 0));
  proxy_ = std::thread([this] { proxyLoop(); });
  parked::add(this);
  ATTN_INFO(kLogInit, "device communicator on CUDA device %d: stream-ordered through a proxy thread",
            device);
  return attnSuccess;
}

StreamBridge::~StreamBridge() {
  if (link_) {
    std::lock_guard<std::mutex> g(link_->mu);
    link_->bridge = nullptr;  // graphs that outlive us run nothing
  }
  {
    std::lock_guard<std::mutex> g(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (proxy_.joinable()) proxy_.join();
  parked::remove(this);  // drained: none of its streams is parked any more
  DeviceScope scope(device_ < 0 ? 0 : device_);
  // Work that failed part-way may leave copies queued; the staging memory
  // they use goes back to the process's cache (retained_memory.h) once the
  // bridge is gone, for another communicator to reuse. Only this stream is
  // waited for: it never waits on a caller's stream.
  if (copyStream_) {
    (void)cudaStreamSynchronize(copyStream_);
    (void)cudaStreamDestroy(copyStream_);
  }
  if (counter_) counterWords().give(counter_);
}

attnResult_t StreamBridge::enqueue(cudaStream_t stream, Work work) {
  DeviceScope scope(device_);
  ATTN_CUDA_CHECK(scope.error());
  // One query: whether the stream captures, and into which graph.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaGraph_t graph = nullptr;
#if CUDART_VERSION >= 13000
  ATTN_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &capture, nullptr, &graph));
#else
  ATTN_CUDA_CHECK(cudaStreamGetCaptureInfo_v2(stream, &capture, nullptr, &graph));
#endif
  if (capture == cudaStreamCaptureStatusInvalidated)
    return setError(attnInvalidUsage,
                    "the caller's stream is in a CUDA graph capture that was already invalidated");
  if (capture == cudaStreamCaptureStatusActive) return enqueueCaptured(stream, graph, std::move(work));
  std::lock_guard<std::mutex> gate(parked::enqueueGate());  // no device-wide free while a stream parks
  std::lock_guard<std::mutex> g(mu_);
  if (aborted_ || stopping_)
    return setError(attnInvalidUsage, "device communicator is aborted or being destroyed");
  const uint32_t seq = issued_.load() + 1;
  cudaEvent_t ready;
  ATTN_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming | cudaEventBlockingSync));
  cudaError_t e = cudaEventRecord(ready, stream);
  if (e != cudaSuccess) {
    (void)cudaEventDestroy(ready);
    return setError(attnUnhandledCudaError,
                    "cudaEventRecord on the caller's stream failed: %s (is the stream on device %d?)",
                    cudaGetErrorString(e), device_);
  }
  auto wait = reinterpret_cast<StreamValue32Fn>(waitValue32_);
  CUresult r = wait(reinterpret_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(counterDev_),
                    seq, CU_STREAM_WAIT_VALUE_GEQ);
  if (r != CUDA_SUCCESS) {
    (void)cudaEventDestroy(ready);
    return setError(attnUnhandledCudaError, "cuStreamWaitValue32 failed with CUresult %d", (int)r);
  }
  queue_.push_back(Item{seq, ready, std::move(work)});
  issued_.store(seq);
  cv_.notify_one();
  return attnSuccess;
}

attnResult_t StreamBridge::enqueueCaptured(cudaStream_t stream, cudaGraph_t graph, Work work) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (aborted_ || stopping_)
      return setError(attnInvalidUsage, "device communicator is aborted or being destroyed");
    if (!writeValue32_) ATTN_CHECK(findStreamValue32("cuStreamWriteValue32", &writeValue32_));
  }
  // The graph owns the operation from here: the user object frees it with
  // the graph, or at once if it cannot be handed over.
  auto* raw = new Captured{link_, std::move(work), nullptr, nullptr};
  attnResult_t took;
  {
    RelaxedCaptureMode relaxed;  // a new page of words is a cudaHostAlloc
    took = counterWords().take(&raw->flag);
  }
  if (took != attnSuccess) {
    delete raw;
    return took;
  }
  liveCaptured.fetch_add(1);
  {
    std::lock_guard<std::mutex> g(link_->mu);
    link_->live.insert(raw);
  }
  cudaUserObject_t owner = nullptr;
  if (cudaError_t e = cudaUserObjectCreate(&owner, raw, &StreamBridge::freeCaptured, 1,
                                           cudaUserObjectNoDestructorSync);
      e != cudaSuccess) {
    freeCaptured(raw);
    return setError(attnUnhandledCudaError, "cudaUserObjectCreate failed: %s", cudaGetErrorString(e));
  }
  if (cudaError_t e = cudaGraphRetainUserObject(graph, owner, 1, cudaGraphUserObjectMove); e != cudaSuccess) {
    (void)cudaUserObjectRelease(owner, 1);
    return setError(attnUnhandledCudaError, "cudaGraphRetainUserObject on the graph being captured failed: %s",
                    cudaGetErrorString(e));
  }
  __atomic_store_n(const_cast<uint32_t*>(raw->flag), 0u, __ATOMIC_SEQ_CST);
  ATTN_CUDA_CHECK(cudaHostGetDevicePointer(&raw->flagDev, const_cast<uint32_t*>(raw->flag), 0));
  ATTN_CUDA_CHECK(cudaLaunchHostFunc(stream, &StreamBridge::submitCaptured, raw));
  const auto flag = reinterpret_cast<CUdeviceptr>(raw->flagDev);
  const auto cs = reinterpret_cast<CUstream>(stream);
  if (CUresult r = reinterpret_cast<StreamValue32Fn>(waitValue32_)(cs, flag, 1, CU_STREAM_WAIT_VALUE_EQ);
      r != CUDA_SUCCESS)
    return setError(attnUnhandledCudaError, "cuStreamWaitValue32 in a graph capture failed with CUresult %d", (int)r);
  if (CUresult r = reinterpret_cast<StreamValue32Fn>(writeValue32_)(cs, flag, 0, CU_STREAM_WRITE_VALUE_DEFAULT);
      r != CUDA_SUCCESS)
    return setError(attnUnhandledCudaError, "cuStreamWriteValue32 in a graph capture failed with CUresult %d", (int)r);
  ATTN_TRACE(kLogInit, "device operation captured into a CUDA graph (flag %p)", (void*)raw->flag);
  return attnSuccess;
}

int StreamBridge::capturedAlive() { return liveCaptured.load(); }

bool StreamBridge::mayParkStreams() const {
  if (busy()) return true;
  std::lock_guard<std::mutex> g(link_->mu);
  return !link_->live.empty();
}

void StreamBridge::freeCaptured(void* p) {
  // On a CUDA thread, once no graph holds the operation: no CUDA calls. The
  // work, if the bridge has not dropped it, holds the device state, but
  // never its last reference: the communicator's goes only after
  // retireCaptured, which waits for this lock.
  auto* op = static_cast<Captured*>(p);
  {
    std::lock_guard<std::mutex> g(op->link->mu);
    op->link->live.erase(op);
    op->work = nullptr;
  }
  counterWords().give(op->flag);
  delete op;
  liveCaptured.fetch_sub(1);
}

void StreamBridge::submitCaptured(void* p) {
  // On CUDA's callback thread: queue the work, never block.
  auto* op = static_cast<Captured*>(p);
  std::lock_guard<std::mutex> link(op->link->mu);
  StreamBridge* b = op->link->bridge;
  bool aborted = b == nullptr;
  if (b) {
    std::lock_guard<std::mutex> g(b->mu_);
    aborted = b->aborted_ || b->stopping_;
    if (!aborted) {
      b->capturedRunning_.fetch_add(1);
      b->queue_.push_back(Item{0, nullptr, nullptr, op});
    }
  }
  if (!aborted) {
    b->cv_.notify_one();
    return;
  }
  // Aborted, or the communicator is gone: release the stream at once.
  if (b && b->onError_) b->onError_(attnRemoteError, "communicator aborted before a captured operation ran");
  __atomic_store_n(const_cast<uint32_t*>(op->flag), 1u, __ATOMIC_SEQ_CST);
}

void StreamBridge::retireCaptured() {
  {
    std::lock_guard<std::mutex> g(link_->mu);
    link_->bridge = nullptr;
  }
  waitIdle();
  std::vector<Work> dropped;  // destroyed here, after the lock
  std::lock_guard<std::mutex> g(link_->mu);
  for (Captured* op : link_->live) dropped.push_back(std::move(op->work));
}

void StreamBridge::abort() {
  {
    std::lock_guard<std::mutex> g(mu_);
    aborted_ = true;
  }
  cv_.notify_all();
}

void StreamBridge::waitIdle() const {
  while (busy()) std::this_thread::sleep_for(std::chrono::microseconds(200));
}

void StreamBridge::release(uint32_t seq) {
  // Done before the stream moves on: a caller that synchronised its stream
  // and then asks attnCommGetAsyncError must not see this work as busy.
  completed_.store(seq);
  // The GPU polls this word over the bus: publish the work's results first.
  __atomic_store_n(const_cast<uint32_t*>(counter_), seq, __ATOMIC_SEQ_CST);
}

attnResult_t StreamBridge::run(Item& it) {
  // Captured work needs no event: its host function ran after the work
  // before it on the stream.
  if (!it.captured) {
    if (cudaError_t e = cudaEventSynchronize(it.ready); e != cudaSuccess)
      return setError(attnUnhandledCudaError, "waiting for the caller's stream failed: %s", cudaGetErrorString(e));
  }
  clearThreadLastError();
  try {
    return it.captured ? it.captured->work(copyStream_) : it.work(copyStream_);
  } catch (const std::exception& ex) {
    return setError(attnInternalError, "device operation threw: %s", ex.what());
  }
}

void StreamBridge::proxyLoop() {
  tlsOnProxy = true;
  (void)cudaSetDevice(device_);
  // The proxy synchronises its own streams: in relaxed mode that is allowed
  // while the application captures a graph elsewhere.
  cudaStreamCaptureMode relaxed = cudaStreamCaptureModeRelaxed;
  (void)cudaThreadExchangeStreamCaptureMode(&relaxed);
  for (;;) {
    Item it;
    bool aborted;
    {
      std::unique_lock<std::mutex> g(mu_);
      cv_.wait(g, [&] { return !queue_.empty() || stopping_; });
      if (queue_.empty()) return;  // stopping, drained
      it = std::move(queue_.front());
      queue_.pop_front();
      aborted = aborted_;
    }
    attnResult_t r = attnSuccess;
    std::string why;
    if (aborted) {
      r = attnRemoteError;
      why = "communicator aborted before this operation ran";
    } else {
      r = run(it);
      if (r != attnSuccess) why = threadLastError();
    }
    if (it.ready) (void)cudaEventDestroy(it.ready);
    // Drop the work's captures before releasing: once idle, the proxy holds
    // nothing its owner may free. (A graph's work stays for its next launch.)
    it.work = nullptr;
    if (r != attnSuccess && onError_) onError_(r, why);
    if (it.captured) {
      capturedRunning_.fetch_sub(1);  // first, as in release()
      __atomic_store_n(const_cast<uint32_t*>(it.captured->flag), 1u, __ATOMIC_SEQ_CST);
    } else {
      release(it.seq);
    }
  }
}

}  // namespace attn
