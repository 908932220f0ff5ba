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
  // Enqueues `work` on `stream` (NULL: the legacy default stream).
  attnResult_t enqueue(cudaStream_t stream, Work work);
  // Fails every queued operation (releasing its stream) and stops taking new
  // ones: attnCommAbort.
  void abort();
  // True while operations are queued or running.
  bool busy() const { return completed_.load() != issued_.load(); }
  // Returns once every operation enqueued so far has finished (run or
  // failed) and dropped its work, captures included.
  void waitIdle() const;
  // The calling thread is a bridge's proxy thread (API calls made there run
  // on host memory directly).
  static bool onProxyThread();

 private:
  struct Item {
    uint32_t seq;
    cudaEvent_t ready;
    Work work;
  };
  StreamBridge() = default;
  attnResult_t start(int device, OnError onError);
  void proxyLoop();
  void release(uint32_t seq);

  int device_ = -1;
  OnError onError_;
  cudaStream_t copyStream_ = nullptr;
  volatile uint32_t* counter_ = nullptr;  // pinned, mapped, never freed; the proxy writes it
  void* counterDev_ = nullptr;            // its device address
  void* waitValue32_ = nullptr;           // cuStreamWaitValue32 from the driver

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stopping_ = false;
  bool aborted_ = false;
  std::atomic<uint32_t> issued_{0};      // written under mu_
  std::atomic<uint32_t> completed_{0};
  std::thread proxy_;
};

}  // namespace attn
