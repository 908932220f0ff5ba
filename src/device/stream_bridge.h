// Stream ordering for device communicators.
//
// An operation on a device communicator is enqueued on the caller's CUDA
// stream and never blocks the host: the bridge records an event where the
// operation starts, hands the work to this communicator's proxy thread, and
// makes the stream wait (cuStreamWaitValue32) on a host-mapped counter
// until the proxy has finished it. The proxy waits for the event, runs the
// work (its own copies on the library's stream, transports on host
// threads), and bumps the counter. Each rank has its own proxy thread and
// counter, so ranks sharing a GPU or a process never wait on each other's
// host callbacks (why not cudaLaunchHostFunc: a blocking host function
// would hold CUDA's callback thread, which ranks of one process share).
//
// A failed operation still releases the stream (its outputs are then
// undefined) and is reported by attnCommGetAsyncError, as in NCCL.
//
// CUDA graphs: on a stream that is being captured, the operation becomes
// three nodes of the graph instead: a host function that hands the work to
// the proxy (it only queues: it never blocks CUDA's callback thread), a
// wait until the proxy sets the operation's own flag word, and a write that
// clears the flag for the next launch. Each launch of the graph runs the
// work again, with the pointers and sizes it was captured with, as NCCL's
// captured operations do. The graph owns each captured operation and its
// flag (a CUDA user object): they go when the graph and its instantiations
// are destroyed. The work inside (which holds the communicator's device
// state) is dropped earlier, by retireCaptured when the communicator is
// freed; a launch after that runs nothing and releases its stream (outputs
// undefined), and a graph must not be launched twice at once (each
// operation has one flag). The proxy thread
// runs in relaxed capture mode, so its own synchronisation never breaks an
// application's capture on another stream.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "attncomm.h"

namespace attn {

class StreamBridge {
 public:
  // Work run on the proxy thread, with `copyStream` (the library's stream on
  // this communicator's device) for its copies.
  using Work = std::function<attnResult_t(cudaStream_t copyStream)>;
  // Called on the proxy thread when a work item fails (code, text).
  using OnError = std::function<void(attnResult_t, const std::string&)>;

  // Binds to `device`; starts the proxy thread. Errors: no such device, no
  // stream memory operations on it.
  static attnResult_t create(int device, OnError onError, std::unique_ptr<StreamBridge>* out);
  ~StreamBridge();  // drains the queue, then stops the proxy

  int device() const { return device_; }
  // The library's copy stream (the one Work receives).
  cudaStream_t copyStream() const { return copyStream_; }
  // Enqueues `work` on `stream` (NULL: the legacy default stream), or
  // captures it when the stream is capturing a graph.
  attnResult_t enqueue(cudaStream_t stream, Work work);
  // Fails every queued operation (releasing its stream) and stops taking new
  // ones: attnCommAbort.
  void abort();
  // Operations captured into graphs that still exist, in the process (tests).
  static int capturedAlive();
  // Whether a stream may be parked on this bridge, now or at any moment
  // (parked_streams.h): operations are queued or running, or graphs hold
  // captured operations, whose launches park their streams unannounced.
  bool mayParkStreams() const;
  // True while operations are queued or running.
  bool busy() const { return completed_.load() != issued_.load() || capturedRunning_.load() != 0; }
  // Returns once every operation enqueued so far has finished (run or
  // failed) and dropped its work, captures included.
  void waitIdle() const;
  // Before the communicator goes: later launches of its graphs run
  // nothing; waits for the launches queued, then drops the captured work
  // on this thread (the graphs keep only their flags).
  void retireCaptured();
  // The calling thread is a bridge's proxy thread (API calls made there run
  // on host memory directly).
  static bool onProxyThread();

 private:
  struct Captured;
  // What a bridge and its captured operations share, so graphs may outlive
  // the bridge: the bridge (null once retired) and its live operations.
  struct CaptureLink {
    std::mutex mu;
    StreamBridge* bridge = nullptr;
    std::set<Captured*> live;
  };
  // An operation captured into a graph: run by the proxy at each launch;
  // owned by the graph.
  struct Captured {
    std::shared_ptr<CaptureLink> link;
    Work work;                // empty once the bridge retired it
    volatile uint32_t* flag;  // pinned, mapped: 1 once a launch's work is done
    void* flagDev;
  };
  struct Item {
    uint32_t seq;
    cudaEvent_t ready;
    Work work;
    Captured* captured = nullptr;  // instead of seq, ready and work
  };
  StreamBridge() = default;
  attnResult_t start(int device, OnError onError);
  // `graph`: the one `stream` is capturing into.
  attnResult_t enqueueCaptured(cudaStream_t stream, cudaGraph_t graph, Work work);
  // The captured host function: queues one launch's run of `op`.
  static void submitCaptured(void* op);
  // The graph's user object destructor: frees `op` and its flag.
  static void freeCaptured(void* op);
  void proxyLoop();
  attnResult_t run(Item& it);
  void release(uint32_t seq);

  int device_ = -1;
  OnError onError_;
  cudaStream_t copyStream_ = nullptr;
  volatile uint32_t* counter_ = nullptr;  // pinned, mapped, never freed; the proxy writes it
  void* counterDev_ = nullptr;            // its device address
  void* waitValue32_ = nullptr;           // cuStreamWaitValue32 from the driver
  void* writeValue32_ = nullptr;          // cuStreamWriteValue32, found at the first capture

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stopping_ = false;
  bool aborted_ = false;
  std::atomic<uint32_t> issued_{0};      // written under mu_
  std::atomic<uint32_t> completed_{0};
  std::atomic<int> capturedRunning_{0};  // launches of captured work queued or running
  std::shared_ptr<CaptureLink> link_;
  std::thread proxy_;
};

}  // namespace attn
