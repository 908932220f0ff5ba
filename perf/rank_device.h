// Where a perf rank keeps its buffers: host memory (the default) or a CUDA
// device (--device DEV), with one stream per rank. On a device a timed call runs
// from its enqueue to its stream's completion, which is what an engine that
// waits on its stream sees.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "attncomm.h"

namespace attnperf {

// 0 when `device` (the -G value) can run here; else prints why and returns
// the exit code: 77 (skip) on a machine without a CUDA device, 2 for a
// build without CUDA or a device this machine lacks. The devices are
// counted in a forked child, because ranks forked later could not use CUDA
// once this process had initialised it.
int checkDeviceFlag(int device, const char* program);

class RankDevice {
 public:
  RankDevice() = default;
  ~RankDevice();
  RankDevice(const RankDevice&) = delete;
  RankDevice& operator=(const RankDevice&) = delete;

  // Makes `device` this thread's current device and creates the rank's
  // stream. device < 0: host memory, and every call below passes through.
  // exportable: buffers from cudaMalloc, which peers in other processes can
  // open by IPC handle; else stream-ordered on the rank's stream, as ranks
  // that are threads sharing a GPU need (cudaMalloc / cudaFree may wait for
  // the whole device, where a peer's stream may wait for this rank).
  // nullStream (-y 1): calls and copies use the NULL stream instead.
  bool open(int device, bool exportable, bool nullStream = false);
  bool onDevice() const { return device_ >= 0; }
  attnStream_t stream() const { return stream_; }

  // The twin of a host buffer: `bytes` of zeroed device memory, owned here
  // (host memory: `host` itself, or a stand-in address if it is null: an
  // empty tensor). Null means failure.
  void* place(void* host, size_t bytes);
  // Copies between a host buffer and its twin (no-ops in host memory).
  bool upload(void* twin, const void* host, size_t bytes);
  bool download(void* host, const void* twin, size_t bytes);
  // -G: captures what is enqueued on the stream between beginCapture and
  // endCapture into a CUDA graph, kept in place of the previous one (with
  // -g > 1, begin on every rank's stream, issue, end on every stream);
  // launchGraph() enqueues a launch of it. CUDA failures print why and
  // answer attnUnhandledCudaError.
  attnResult_t beginCapture();
  attnResult_t endCapture();
  attnResult_t launchGraph();
  // Waits until the stream is idle, then returns the communicator's
  // asynchronous error: a device operation that fails after its enqueue
  // reports there. `what` names the call in the message.
  bool finish(attnComm_t comm, const char* what);

 private:
  int device_ = -1;
  bool exportable_ = false;
  attnStream_t stream_ = nullptr;
  std::vector<void*> owned_;
  void* graph_ = nullptr;  // cudaGraphExec_t from endCapture
};

}  // namespace attnperf
