// Process state, allocations and streams of the emulated CUDA runtime.
#include "tests/cuda_emu/emu_core.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

namespace attn_emu {
namespace {

// Leaked on purpose: stream threads may still run while statics are torn
// down at exit.
struct Process {
  std::mutex mu;
  pid_t pid = 0;  // the process that first used the runtime
  std::atomic<int> sticky{cudaSuccess};
  std::map<uintptr_t, Allocation> allocations;  // by base
  std::atomic<unsigned long long> nextBufferId{1};
  std::map<Stream*, std::shared_ptr<Stream>> streams;  // live, created ones
  std::vector<std::shared_ptr<Stream>> legacy;         // per device
  std::map<const void*, size_t> kernelSmem;            // cudaFuncSetAttribute
  std::map<int, size_t> deviceBytes;                   // device memory in use, by device
};

Process& proc() {
  static Process* p = [] {
    auto* q = new Process();
    q->pid = getpid();
    // One memfd per device allocation: lift the soft descriptor limit.
    rlimit rl{};
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
    return q;
  }();
  return *p;
}

std::shared_ptr<Stream>& legacyOf(int device) {
  Process& p = proc();
  std::lock_guard<std::mutex> g(p.mu);
  if (p.legacy.empty()) p.legacy.resize(deviceCount());
  if (!p.legacy[device]) p.legacy[device] = Stream::start(device, true);
  return p.legacy[device];
}

std::shared_ptr<Stream> perThread() {
  // A thread's default stream lives as long as the process (threads that
  // exit leave theirs idle, which costs one parked thread each).
  thread_local std::shared_ptr<Stream> mine;
  if (!mine) mine = Stream::start(currentDevice(), true);
  return mine;
}

}  // namespace

double nowMs() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

cudaError_t enter() {
  Process& p = proc();
  if (p.pid != getpid()) return cudaErrorInitializationError;
  return static_cast<cudaError_t>(p.sticky.load());
}

cudaError_t& lastError() {
  thread_local cudaError_t e = cudaSuccess;
  return e;
}

cudaError_t fail(cudaError_t e, const char* fmt, ...) {
  if (e == cudaSuccess) return e;
  lastError() = e;
  if (getenv("ATTN_CUDA_EMU_VERBOSE")) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cuda-emu: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
  }
  return e;
}

void stickyFault(cudaError_t e, const std::string& why) {
  fprintf(stderr, "cuda-emu: device fault (%s): %s\n", cudaGetErrorName(e), why.c_str());
  int none = cudaSuccess;
  proc().sticky.compare_exchange_strong(none, e);
}

int deviceCount() {
  static const int n = [] {
    const char* s = getenv("ATTN_CUDA_EMU_DEVICES");
    int v = s ? atoi(s) : 1;
    return v < 0 ? 0 : v > 8 ? 8 : v;
  }();
  return n;
}

int& currentDevice() {
  thread_local int d = 0;
  return d;
}

// ---- memory -----------------------------------------------------------------

bool findAllocation(const void* p, size_t bytes, Allocation* out) {
  Process& pr = proc();
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> g(pr.mu);
  auto it = pr.allocations.upper_bound(a);
  if (it == pr.allocations.begin()) return false;
  --it;
  const Allocation& al = it->second;
  if (a < al.base || a - al.base > al.bytes || bytes > al.bytes - (a - al.base)) return false;
  if (bytes == 0 && a == al.base + al.bytes && al.bytes != 0) return false;  // one past the end
  if (out) *out = al;
  return true;
}

bool deviceAccessible(const void* p, size_t bytes) {
  if (bytes == 0) return true;
  return findAllocation(p, bytes, nullptr);
}

// ATTN_CUDA_EMU_DEVICE_MB: each device's memory, for out-of-memory paths
// (read at each allocation; unset: unlimited).
size_t deviceCapacity() {
  const char* s = getenv("ATTN_CUDA_EMU_DEVICE_MB");
  const long long mb = s ? atoll(s) : 0;
  return mb > 0 ? size_t(mb) << 20 : SIZE_MAX;
}

bool isDeviceKind(MemKind k) { return k == MemKind::kDevice || k == MemKind::kPool; }

cudaError_t allocate(MemKind kind, size_t bytes, void** out) {
  *out = nullptr;
  if (bytes == 0) return cudaSuccess;
  if (isDeviceKind(kind)) {
    std::lock_guard<std::mutex> g(proc().mu);
    size_t& used = proc().deviceBytes[currentDevice()];
    if (bytes > deviceCapacity() - std::min(used, deviceCapacity()))
      return fail(cudaErrorMemoryAllocation, "out of memory: %zu bytes asked, %zu of %zu in use", bytes, used,
                  deviceCapacity());
    used += bytes;  // taken back below if the mapping fails
  }
  auto unreserve = [&] {
    if (!isDeviceKind(kind)) return;
    std::lock_guard<std::mutex> g(proc().mu);
    proc().deviceBytes[currentDevice()] -= bytes;
  };
  Allocation a;
  a.kind = kind;
  a.bytes = bytes;
  a.device = currentDevice();
  a.bufferId = proc().nextBufferId.fetch_add(1);
  void* m = MAP_FAILED;
  if (kind == MemKind::kDevice) {
    // Shared file memory, so another process can map it from an IPC handle.
    a.fd = memfd_create("attn-cuda-emu", MFD_CLOEXEC);
    if (a.fd < 0) {
      unreserve();
      return fail(cudaErrorMemoryAllocation, "memfd_create failed");
    }
    if (ftruncate(a.fd, off_t(bytes)) != 0) {
      close(a.fd);
      unreserve();
      return fail(cudaErrorMemoryAllocation, "ftruncate(%zu) failed", bytes);
    }
    m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, a.fd, 0);
    if (m == MAP_FAILED) close(a.fd);
  } else {
    m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  }
  if (m == MAP_FAILED) {
    unreserve();
    return fail(cudaErrorMemoryAllocation, "mmap(%zu) failed", bytes);
  }
  a.base = reinterpret_cast<uintptr_t>(m);
  {
    std::lock_guard<std::mutex> g(proc().mu);
    proc().allocations[a.base] = a;
  }
  *out = m;
  return cudaSuccess;
}

cudaError_t release(void* p, MemKind expected) {
  if (!p) return cudaSuccess;
  Allocation a;
  {
    std::lock_guard<std::mutex> g(proc().mu);
    auto it = proc().allocations.find(reinterpret_cast<uintptr_t>(p));
    const bool poolOk = expected == MemKind::kDevice && it != proc().allocations.end() &&
                        it->second.kind == MemKind::kPool;
    if (it == proc().allocations.end() || (it->second.kind != expected && !poolOk))
      return fail(cudaErrorInvalidValue, "free of %p, which is not the start of a live allocation of that kind", p);
    a = it->second;
    proc().allocations.erase(it);
    if (isDeviceKind(a.kind)) proc().deviceBytes[a.device] -= a.bytes;
  }
  // Unmapped, so a use after free faults here as it would on a GPU.
  munmap(reinterpret_cast<void*>(a.base), a.bytes);
  if (a.fd >= 0) close(a.fd);
  return cudaSuccess;
}

void registerMapping(const Allocation& a) {
  std::lock_guard<std::mutex> g(proc().mu);
  proc().allocations[a.base] = a;
}

bool unregisterMapping(uintptr_t base, Allocation* out) {
  std::lock_guard<std::mutex> g(proc().mu);
  auto it = proc().allocations.find(base);
  if (it == proc().allocations.end() || it->second.kind != MemKind::kIpcMapped) return false;
  *out = it->second;
  proc().allocations.erase(it);
  return true;
}

// ---- streams ----------------------------------------------------------------

std::shared_ptr<Stream> Stream::start(int device, bool blocking) {
  auto s = std::make_shared<Stream>(device, blocking);
  // The thread keeps its stream alive until it is retired and drained.
  std::thread([s] { s->loop(); }).detach();
  return s;
}

void Stream::push(Op op) {
  {
    std::lock_guard<std::mutex> g(mu_);
    queue_.push_back(std::move(op));
    ++pushed_;
  }
  cv_.notify_all();
}

uint64_t Stream::mark() {
  std::lock_guard<std::mutex> g(mu_);
  return pushed_;
}

void Stream::waitFor(uint64_t mark) {
  std::unique_lock<std::mutex> g(mu_);
  cv_.wait(g, [&] { return done_ >= mark; });
}

bool Stream::reached(uint64_t mark) {
  std::lock_guard<std::mutex> g(mu_);
  return done_ >= mark;
}

std::shared_ptr<Capture> Stream::capture() {
  std::lock_guard<std::mutex> g(mu_);
  return capture_;
}

void Stream::setCapture(std::shared_ptr<Capture> c) {
  std::lock_guard<std::mutex> g(mu_);
  capture_ = std::move(c);
}

void Stream::retire() {
  {
    std::lock_guard<std::mutex> g(mu_);
    retired_ = true;
  }
  cv_.notify_all();
}

// ATTN_CUDA_EMU_STREAM_DELAY_US: each piece of stream work starts up to
// that many microseconds late (random), as a busy GPU would run it, so
// that a missing wait for a stream shows up as wrong data.
static int streamDelayUs() {
  static const int us = [] {
    const char* s = getenv("ATTN_CUDA_EMU_STREAM_DELAY_US");
    const int v = s ? atoi(s) : 0;
    return v < 0 ? 0 : v;
  }();
  return us;
}

void Stream::loop() {
  thread_local std::minstd_rand jitter(std::random_device{}());
  const int delayUs = streamDelayUs();
  std::unique_lock<std::mutex> g(mu_);
  for (;;) {
    cv_.wait(g, [&] { return !queue_.empty() || retired_; });
    if (queue_.empty()) return;
    Op op = std::move(queue_.front());
    queue_.pop_front();
    g.unlock();
    if (delayUs > 0) std::this_thread::sleep_for(std::chrono::microseconds(jitter() % (delayUs + 1)));
    op();
    op = nullptr;
    g.lock();
    ++done_;
    cv_.notify_all();
  }
}

std::shared_ptr<Stream> resolve(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy) return legacyOf(currentDevice());
  if (s == cudaStreamPerThread) return perThread();
  Process& p = proc();
  std::lock_guard<std::mutex> g(p.mu);
  auto it = p.streams.find(reinterpret_cast<Stream*>(s));
  return it == p.streams.end() ? nullptr : it->second;
}

cudaError_t enqueue(cudaStream_t s, Op op) {
  std::shared_ptr<Stream> st = resolve(s);
  if (!st) return fail(cudaErrorInvalidResourceHandle, "stream %p is not a live stream", (void*)s);
  if (std::shared_ptr<Capture> c = st->capture()) {
    c->add(st.get(), std::move(op));
    return cudaSuccess;
  }
  // The legacy stream's implicit barriers, against the other blocking
  // streams of its device.
  std::vector<std::pair<std::shared_ptr<Stream>, uint64_t>> deps;
  std::shared_ptr<Stream> legacy = legacyOf(st->device());
  if (st == legacy) {
    std::vector<std::shared_ptr<Stream>> others;
    {
      std::lock_guard<std::mutex> g(proc().mu);
      for (auto& [raw, sp] : proc().streams)
        if (sp->blocking() && sp->device() == st->device()) others.push_back(sp);
    }
    for (auto& o : others)
      if (std::shared_ptr<Capture> c = o->capture()) {
        c->invalidate();
        return fail(cudaErrorStreamCaptureImplicit,
                    "work on the legacy stream while blocking stream %p captures", (void*)o.get());
      }
    for (auto& o : others) deps.emplace_back(o, o->mark());
  } else if (st->blocking()) {
    deps.emplace_back(legacy, legacy->mark());
  }
  std::erase_if(deps, [](auto& d) { return d.first->reached(d.second); });
  if (deps.empty()) {
    st->push(std::move(op));
  } else {
    st->push([deps = std::move(deps), op = std::move(op)] {
      for (auto& [o, m] : deps) o->waitFor(m);
      op();
    });
  }
  return cudaSuccess;
}

cudaStream_t createStream(bool blocking) {
  auto s = Stream::start(currentDevice(), blocking);
  std::lock_guard<std::mutex> g(proc().mu);
  proc().streams[s.get()] = s;
  return reinterpret_cast<cudaStream_t>(s.get());
}

cudaError_t destroyStream(cudaStream_t s) {
  std::shared_ptr<Stream> st;
  {
    std::lock_guard<std::mutex> g(proc().mu);
    auto it = proc().streams.find(reinterpret_cast<Stream*>(s));
    if (it == proc().streams.end())
      return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy of %p, not a live stream", (void*)s);
    st = it->second;
    proc().streams.erase(it);
  }
  st->retire();  // returns at once; queued work still runs, as in CUDA
  return cudaSuccess;
}

void synchronizeDevice(int device) {
  std::vector<std::shared_ptr<Stream>> all;
  {
    std::lock_guard<std::mutex> g(proc().mu);
    for (auto& [raw, sp] : proc().streams)
      if (sp->device() == device) all.push_back(sp);
  }
  all.push_back(legacyOf(device));
  std::vector<uint64_t> marks;
  for (auto& s : all) marks.push_back(s->mark());
  for (size_t i = 0; i < all.size(); ++i) all[i]->waitFor(marks[i]);
}

cudaError_t synchronizeStream(cudaStream_t s) {
  std::shared_ptr<Stream> st = resolve(s);
  if (!st) return fail(cudaErrorInvalidResourceHandle, "stream %p is not a live stream", (void*)s);
  if (st == legacyOf(st->device())) {
    // Waits for the blocking streams' earlier work too.
    std::vector<std::pair<std::shared_ptr<Stream>, uint64_t>> all;
    {
      std::lock_guard<std::mutex> g(proc().mu);
      for (auto& [raw, sp] : proc().streams)
        if (sp->blocking() && sp->device() == st->device()) all.emplace_back(sp, 0);
    }
    for (auto& a : all) a.second = a.first->mark();
    const uint64_t m = st->mark();
    for (auto& [o, om] : all) o->waitFor(om);
    st->waitFor(m);
  } else {
    st->waitFor(st->mark());
  }
  return cudaSuccess;
}

size_t maxDynamicSharedMemory(const void* kernel) {
  Process& p = proc();
  std::lock_guard<std::mutex> lock(p.mu);
  auto it = p.kernelSmem.find(kernel);
  return it == p.kernelSmem.end() ? kSharedMemoryDefault : it->second;
}

void setMaxDynamicSharedMemory(const void* kernel, size_t bytes) {
  Process& p = proc();
  std::lock_guard<std::mutex> lock(p.mu);
  p.kernelSmem[kernel] = bytes;
}

}  // namespace attn_emu
