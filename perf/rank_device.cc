#include "perf/rank_device.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#if ATTN_PERF_CUDA
#include <cuda_runtime_api.h>
#endif

namespace attnperf {

namespace {

// An empty host tensor (a rank without queries) has a null data(); null
// from place() means failure, so such a tensor gets a stand-in address.
void* hostOrEmpty(void* host) {
  static char empty;
  return host != nullptr ? host : &empty;
}

}  // namespace

#if ATTN_PERF_CUDA

namespace {

bool cudaOk(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(e));
  return false;
}

int countDevicesInChild() {
  const pid_t pid = fork();
  if (pid == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    _exit(std::min(n, 100));
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 0;
  return WEXITSTATUS(status);
}

}  // namespace

int checkDeviceFlag(int device, const char* program) {
  if (device < 0) return 0;
  const int n = countDevicesInChild();
  if (n == 0) {
    printf("# %s: no CUDA device on this machine, --device %d skipped\n", program, device);
    return 77;
  }
  if (device >= n) {
    fprintf(stderr, "%s: --device %d, but this machine has %d CUDA device(s)\n", program, device, n);
    return 2;
  }
  return 0;
}

RankDevice::~RankDevice() {
  if (device_ < 0) return;
  if (graph_) (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph_));
  const auto s = reinterpret_cast<cudaStream_t>(stream_);
  for (void* p : owned_) (void)(exportable_ ? cudaFree(p) : cudaFreeAsync(p, s));
  (void)cudaStreamSynchronize(s);
  if (s) (void)cudaStreamDestroy(s);
}

bool RankDevice::open(int device, bool exportable, bool nullStream) {
  if (device < 0) return true;
  if (!cudaOk(cudaSetDevice(device), "cudaSetDevice")) return false;
  cudaStream_t s = nullptr;
  if (!nullStream &&
      !cudaOk(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"))
    return false;
  device_ = device;
  exportable_ = exportable;
  stream_ = reinterpret_cast<attnStream_t>(s);
  return true;
}

void* RankDevice::place(void* host, size_t bytes) {
  if (device_ < 0) return hostOrEmpty(host);
  const auto s = reinterpret_cast<cudaStream_t>(stream_);
  const size_t n = std::max<size_t>(bytes, 1);
  void* p = nullptr;
  if (!cudaOk(exportable_ ? cudaMalloc(&p, n) : cudaMallocAsync(&p, n, s), "cudaMalloc")) return nullptr;
  owned_.push_back(p);
  if (!cudaOk(cudaMemsetAsync(p, 0, n, s), "cudaMemsetAsync") ||
      !cudaOk(cudaStreamSynchronize(s), "cudaStreamSynchronize"))
    return nullptr;
  return p;
}

// On the rank's stream, never the legacy default stream (which would wait
// for every other stream of the device, peers' included).
bool RankDevice::upload(void* twin, const void* host, size_t bytes) {
  if (device_ < 0 || bytes == 0) return true;
  const auto s = reinterpret_cast<cudaStream_t>(stream_);
  return cudaOk(cudaMemcpyAsync(twin, host, bytes, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync to the device") &&
         cudaOk(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

bool RankDevice::download(void* host, const void* twin, size_t bytes) {
  if (device_ < 0 || bytes == 0) return true;
  const auto s = reinterpret_cast<cudaStream_t>(stream_);
  return cudaOk(cudaMemcpyAsync(host, twin, bytes, cudaMemcpyDeviceToHost, s),
                "cudaMemcpyAsync from the device") &&
         cudaOk(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

bool RankDevice::finish(attnComm_t comm, const char* what) {
  if (device_ < 0) return true;
  if (!cudaOk(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream_)), "cudaStreamSynchronize"))
    return false;
  attnResult_t async = attnSuccess;
  const attnResult_t r = attnCommGetAsyncError(comm, &async);
  if (r == attnSuccess && async == attnSuccess) return true;
  fprintf(stderr, "%s failed on the stream: %s (%s)\n", what,
          attnGetErrorString(r != attnSuccess ? r : async), attnGetLastError(comm));
  return false;
}

attnResult_t RankDevice::beginCapture() {
  const auto s = reinterpret_cast<cudaStream_t>(stream_);
  if (graph_) (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph_));
  graph_ = nullptr;
  return cudaOk(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture")
             ? attnSuccess
             : attnUnhandledCudaError;
}

attnResult_t RankDevice::endCapture() {
  cudaGraph_t graph = nullptr;
  if (!cudaOk(cudaStreamEndCapture(reinterpret_cast<cudaStream_t>(stream_), &graph), "cudaStreamEndCapture"))
    return attnUnhandledCudaError;
  cudaGraphExec_t exec = nullptr;
  const bool made = cudaOk(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  (void)cudaGraphDestroy(graph);
  if (!made) return attnUnhandledCudaError;
  graph_ = exec;
  return attnSuccess;
}

attnResult_t RankDevice::launchGraph() {
  return cudaOk(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph_), reinterpret_cast<cudaStream_t>(stream_)),
                "cudaGraphLaunch")
             ? attnSuccess
             : attnUnhandledCudaError;
}

#else  // perf built without CUDA: only host memory

int checkDeviceFlag(int device, const char* program) {
  if (device < 0) return 0;
  fprintf(stderr, "%s: --device %d needs a build with CUDA (this one has none)\n", program, device);
  return 2;
}

RankDevice::~RankDevice() = default;
bool RankDevice::open(int device, bool, bool) { return device < 0; }
void* RankDevice::place(void* host, size_t) { return hostOrEmpty(host); }
bool RankDevice::upload(void*, const void*, size_t) { return true; }
bool RankDevice::download(void*, const void*, size_t) { return true; }
bool RankDevice::finish(attnComm_t, const char*) { return true; }
attnResult_t RankDevice::launchGraph() { return attnNotSupported; }
attnResult_t RankDevice::beginCapture() { return attnNotSupported; }
attnResult_t RankDevice::endCapture() { return attnNotSupported; }

#endif

}  // namespace attnperf
