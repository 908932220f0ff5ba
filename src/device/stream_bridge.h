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
// captured operations do. The work stays with the bridge until the
// communicator is destroyed; a graph must not be launched after that, nor
// launched twice at once (each operation has one flag). The proxy thread
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
  // True while operations are queued or running.
  bool busy() const { return completed_.load() != issued_.load() || capturedRunning_.load() != 0; }
  // Returns once every operation enqueued so far has finished (run or
  // failed) and dropped its work, captures included.
  void waitIdle() const;
  // The calling thread is a bridge's proxy thread (API calls made there run
  // on host memory directly).
  static bool onProxyThread();

 private:
  // An operation captured into a graph: run by the proxy at each launch.
  struct Captured {
    StreamBridge* bridge;
    Work work;
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
  attnResult_t enqueueCaptured(cudaStream_t stream, Work work);
  // The captured host function: queues one launch's run of `op`.
  static void submitCaptured(void* op);
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
  std::vector<std::unique_ptr<Captured>> captured_;  // under mu_
  std::thread proxy_;
};

}  // namespace attn
