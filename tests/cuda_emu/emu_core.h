// The CUDA runtime emulated on host threads (see README.md): allocations,
// streams and events, shared by the runtime API (emu_runtime.cc), the driver
// entry points (emu_driver.cc) and the kernel launchers (emu_kernels.cc).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace attn_emu {

// ---- process state and errors ----------------------------------------------

// Every API call starts here: cudaErrorInitializationError in a child forked
// after the parent used CUDA (as the real runtime), else the sticky error of
// a failed "kernel", else success.
cudaError_t enter();
// Records `e` as the calling thread's last error (cudaGetLastError) and
// returns it.
cudaError_t fail(cudaError_t e, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
cudaError_t& lastError();
// A fault inside stream work (a kernel reading memory the device cannot
// reach, a kernel that failed): printed, and returned by every later call.
void stickyFault(cudaError_t e, const std::string& why);

int deviceCount();     // ATTN_CUDA_EMU_DEVICES, default 1
int& currentDevice();  // per thread, default 0

// ---- memory -----------------------------------------------------------------

enum class MemKind { kDevice, kPool, kPinned, kIpcMapped };

struct Allocation {
  uintptr_t base = 0;
  size_t bytes = 0;
  MemKind kind = MemKind::kDevice;
  int device = 0;
  unsigned long long bufferId = 0;
  int fd = -1;  // kDevice: the memfd that IPC handles name
};

// The allocation holding [p, p + bytes), if one does.
bool findAllocation(const void* p, size_t bytes, Allocation* out);
// Device code may read or write [p, p + bytes): it lies inside one device,
// pool, IPC-mapped or pinned host allocation.
bool deviceAccessible(const void* p, size_t bytes);

cudaError_t allocate(MemKind kind, size_t bytes, void** out);
cudaError_t release(void* p, MemKind expected);  // p must be an allocation's base
void registerMapping(const Allocation& a);       // IPC-mapped memory
bool unregisterMapping(uintptr_t base, Allocation* out);

// ---- streams and events -----------------------------------------------------

using Op = std::function<void()>;
struct Capture;

// One in-order queue of work run by its own thread: a CUDA stream.
class Stream : public std::enable_shared_from_this<Stream> {
 public:
  Stream(int device, bool blocking) : device_(device), blocking_(blocking) {}
  static std::shared_ptr<Stream> start(int device, bool blocking);
  void push(Op op);
  uint64_t mark();              // work pushed so far
  void waitFor(uint64_t mark);  // until that much has run
  bool reached(uint64_t mark);
  void retire();  // cudaStreamDestroy: the thread exits once its queue is drained
  int device() const { return device_; }
  bool blocking() const { return blocking_; }
  // The capture this stream records into (cudaStreamBeginCapture), or null.
  std::shared_ptr<Capture> capture();
  void setCapture(std::shared_ptr<Capture> c);

 private:
  void loop();
  const int device_;
  const bool blocking_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_;
  uint64_t pushed_ = 0, done_ = 0;
  bool retired_ = false;
  std::shared_ptr<Capture> capture_;
};

// The stream a handle names (NULL and cudaStreamLegacy: the device's legacy
// stream; cudaStreamPerThread: the thread's own), or null for a handle that
// is not a live stream.
std::shared_ptr<Stream> resolve(cudaStream_t s);
// Pushes `op` on `s` with the legacy default stream's implicit ordering:
// legacy work waits for the blocking streams' earlier work and they wait for
// its. Returns cudaErrorInvalidResourceHandle for a bad stream. On a
// capturing stream `op` is recorded into the capture instead, to run at
// each launch of the graph; legacy-stream work while a blocking stream of
// the device captures is cudaErrorStreamCaptureImplicit (and invalidates
// that capture), as in CUDA.
cudaError_t enqueue(cudaStream_t s, Op op);
cudaStream_t createStream(bool blocking);
cudaError_t destroyStream(cudaStream_t s);
// Until every stream of `device` has run what was pushed before the call.
void synchronizeDevice(int device);
// Until `s` has run what was pushed before the call (the legacy stream also
// waits for the blocking streams, as cudaStreamSynchronize(0) does).
cudaError_t synchronizeStream(cudaStream_t s);

struct Event {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0, completed = 0;  // generations
  double completedAtMs = 0;
  bool timing = true;
  // Last recorded inside this capture: a dependency of the graph, not a
  // point the host can wait for (cudaErrorCapturedEvent); recorded on
  // `capturedOn` after that stream's first `capturedNodes` nodes.
  std::shared_ptr<Capture> captured;
  const Stream* capturedOn = nullptr;
  uint64_t capturedNodes = 0;
};
std::shared_ptr<Event> eventOf(cudaEvent_t e);  // null for a bad handle

double nowMs();

// ---- stream capture (emu_capture.cc) ----------------------------------------

// One cudaStreamBeginCapture .. cudaStreamEndCapture sequence. Another
// stream that waits for an event recorded in it joins it (a fork); the
// work of all its streams is recorded in issue order, which respects every
// dependency, and a launch runs it in that order. (That forked streams
// joined back before the end is not checked.)
struct Capture {
  std::mutex mu;
  const Stream* origin = nullptr;  // the stream that began it: only it may end it
  std::vector<std::weak_ptr<Stream>> forked;
  std::vector<Op> ops;  // what each launch of the graph runs, in order
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id owner;
  bool invalidated = false;
  // cudaGraphRetainUserObject on the graph being captured: (object, count),
  // handed to the graph at the end of the capture.
  std::vector<std::pair<void*, unsigned>> userObjects;
  // For cudaErrorStreamCaptureUnjoined: the nodes each stream recorded,
  // and the waits between its streams (`to`'s nodes after its first
  // `toNodes` depend on `from`'s first `fromNodes`).
  struct Wait {
    const Stream* from;
    uint64_t fromNodes;
    const Stream* to;
    uint64_t toNodes;
  };
  std::map<const Stream*, uint64_t> nodes;
  std::vector<Wait> waits;
  void add(const Stream* s, Op op);
  uint64_t nodesOf(const Stream* s);
  void addWait(const Wait& w);
  // A stream forked into the capture whose last node the end of the
  // capture (the origin's state) does not depend on, or null.
  const Stream* unjoined();
  void invalidate();
  bool isInvalidated();
};

// CUDA's rule for "potentially unsafe" calls (allocation, frees,
// synchronous copies, synchronisation) during captures: forbidden, unless
// the calling thread's mode (cudaThreadExchangeStreamCaptureMode) is
// relaxed, while this thread has a non-relaxed capture open or, in global
// mode, while any thread has a global one. A forbidden call invalidates
// those captures and returns cudaErrorStreamCaptureUnsupported.
cudaError_t unsafeCallAllowed(const char* what);

// ---- kernels ------------------------------------------------------------------

// Dynamic shared memory a kernel may launch with: 48 KiB unless raised by
// cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize).
size_t maxDynamicSharedMemory(const void* kernel);
void setMaxDynamicSharedMemory(const void* kernel, size_t bytes);
constexpr size_t kSharedMemoryDefault = 48 << 10, kSharedMemoryOptin = 227 << 10;

}  // namespace attn_emu
