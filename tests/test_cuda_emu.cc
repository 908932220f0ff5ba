// The emulated CUDA runtime (tests/cuda_emu) that runs the device paths in
// builds with -DATTN_CUDA_EMULATION=ON: its ordering and its checks must
// hold, or the device tests that run on it prove nothing. Built only there.
//
// A stream is held back with a stream memory wait on a host word, so each
// test controls exactly when work may run; nothing depends on timing.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "support/gpu.h"

namespace {

using WaitValue32Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

// A gate: work pushed on a stream after close() runs only after open().
class Gate {
 public:
  Gate() {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    EXPECT_EQ(cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000, cudaEnableDefault, &found),
              cudaSuccess);
    wait_ = reinterpret_cast<WaitValue32Fn>(fn);
    void* w = nullptr;
    EXPECT_EQ(cudaHostAlloc(&w, sizeof(uint32_t), cudaHostAllocMapped), cudaSuccess);
    word_ = static_cast<volatile uint32_t*>(w);
    *word_ = 0;
  }
  ~Gate() {
    open();
    (void)cudaFreeHost(const_cast<uint32_t*>(word_));
  }
  void close(cudaStream_t s) {
    ASSERT_EQ(wait_(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(word_), 1,
                    CU_STREAM_WAIT_VALUE_GEQ),
              CUDA_SUCCESS);
  }
  void open() { __atomic_store_n(word_, 1u, __ATOMIC_SEQ_CST); }

 private:
  WaitValue32Fn wait_ = nullptr;
  volatile uint32_t* word_ = nullptr;
};

// Runs `body` in a forked child (for tests that poison or must own the
// runtime); the child's exit code is the number of failed checks.
int inChild(const std::function<int()>& body) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

TEST(CudaEmu, StreamWorkWaitsForItsGateAndRunsInOrder) {
  REQUIRE_GPU();
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  char* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), 64), cudaSuccess);
  Gate gate;
  gate.close(s);
  ASSERT_EQ(cudaMemsetAsync(d, 1, 64, s), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d, 7, 32, s), cudaSuccess);
  std::vector<char> h(64, 0);
  ASSERT_EQ(cudaMemcpyAsync(h.data(), d, 64, cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
  EXPECT_EQ(h[0], 0);
  gate.open();
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(h[0], 7);
  EXPECT_EQ(h[31], 7);
  EXPECT_EQ(h[32], 1);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaErrorInvalidResourceHandle);
}

TEST(CudaEmu, EventWaitOrdersTwoStreams) {
  REQUIRE_GPU();
  cudaStream_t a, b;
  ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t ev;
  ASSERT_EQ(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), cudaSuccess);
  char* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), 16), cudaSuccess);
  ASSERT_EQ(cudaMemset(d, 0, 16), cudaSuccess);
  Gate gate;
  gate.close(a);
  ASSERT_EQ(cudaMemsetAsync(d, 9, 16, a), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(ev, a), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(b, ev, 0), cudaSuccess);
  char h = 0;
  ASSERT_EQ(cudaMemcpyAsync(&h, d, 1, cudaMemcpyDeviceToHost, b), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(ev), cudaErrorNotReady);
  EXPECT_EQ(cudaStreamQuery(b), cudaErrorNotReady);
  // The event may go now: the wait holds what it needs.
  EXPECT_EQ(cudaEventDestroy(ev), cudaSuccess);
  gate.open();
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
  EXPECT_EQ(h, 9);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(a), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(b), cudaSuccess);
}

TEST(CudaEmu, LegacyStreamWaitsForBlockingStreamsOnly) {
  REQUIRE_GPU();
  cudaStream_t blocking, nonBlocking;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&nonBlocking, cudaStreamNonBlocking), cudaSuccess);
  char* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), 8), cudaSuccess);
  Gate gate;
  gate.close(nonBlocking);
  ASSERT_EQ(cudaMemsetAsync(d, 3, 8, nullptr), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);  // not held by a non-blocking stream
  gate.open();
  ASSERT_EQ(cudaStreamSynchronize(nonBlocking), cudaSuccess);

  Gate gate2;
  gate2.close(blocking);
  ASSERT_EQ(cudaMemsetAsync(d, 4, 8, nullptr), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(nullptr), cudaErrorNotReady);  // held by the blocking stream
  gate2.open();
  char h = 0;
  ASSERT_EQ(cudaMemcpy(&h, d, 1, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(h, 4);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(blocking), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(nonBlocking), cudaSuccess);
}

TEST(CudaEmu, CudaFreeWaitsForTheWholeDevice) {
  REQUIRE_GPU();
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 8), cudaSuccess);
  Gate gate;
  gate.close(s);
  std::atomic<bool> freed{false};
  std::thread t([&] {
    EXPECT_EQ(cudaFree(d), cudaSuccess);
    freed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(freed.load());  // it cannot have returned: the gate is closed
  gate.open();
  t.join();
  EXPECT_TRUE(freed.load());
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

TEST(CudaEmu, CopiesOutsideDeviceMemoryAreRefused) {
  REQUIRE_GPU();
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 64), cudaSuccess);
  std::vector<char> h(128);
  EXPECT_EQ(cudaMemcpy(d, h.data(), 65, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(h.data(), static_cast<char*>(d) + 8, 64, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(h.data(), h.data() + 64, 8, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemset(h.data(), 0, 8), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, h.data(), 64, cudaMemcpyDefault), cudaSuccess);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  EXPECT_EQ(cudaFree(d), cudaErrorInvalidValue);  // twice
}

TEST(CudaEmu, PageableSourceIsTakenAtTheCall) {
  REQUIRE_GPU();
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  char* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), 4), cudaSuccess);
  Gate gate;
  gate.close(s);
  char src[4] = {1, 2, 3, 4};
  ASSERT_EQ(cudaMemcpyAsync(d, src, 4, cudaMemcpyHostToDevice, s), cudaSuccess);
  std::memset(src, 0, 4);  // as CUDA stages pageable memory before returning
  gate.open();
  char back[4] = {};
  ASSERT_EQ(cudaMemcpyAsync(back, d, 4, cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(back[3], 4);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

TEST(CudaEmu, KernelHandedHostMemoryFaultsTheProcess) {
  REQUIRE_FORKABLE_CUDA();
  const int bad = inChild([] {
    int fails = 0;
    float* d = nullptr;
    if (cudaMalloc(reinterpret_cast<void**>(&d), 16) != cudaSuccess) return 100;
    std::vector<float> host(4, 1.0f);
    // Launching returns; the fault shows at the next synchronisation and
    // stays, as an illegal address does on a GPU.
    if (attn::cuda::reduceInto(d, host.data(), 4, attnFloat32, attnSum, nullptr) != attnSuccess) ++fails;
    if (cudaStreamSynchronize(nullptr) != cudaErrorIllegalAddress) ++fails;
    if (cudaMalloc(reinterpret_cast<void**>(&d), 16) != cudaErrorIllegalAddress) ++fails;
    return fails;
  });
  EXPECT_EQ(bad, 0);
}

TEST(CudaEmu, ForkedChildOfAUserCannotUseCuda) {
  REQUIRE_FORKABLE_CUDA();
  const int bad = inChild([] {
    void* d = nullptr;
    if (cudaMalloc(&d, 16) != cudaSuccess) return 100;
    return inChild([] {
      void* e = nullptr;
      return cudaMalloc(&e, 16) == cudaErrorInitializationError ? 0 : 1;
    });
  });
  EXPECT_EQ(bad, 0);
}

TEST(CudaEmu, IpcHandleMapsTheSameMemoryInAnotherProcess) {
  REQUIRE_FORKABLE_CUDA();
  int toParent[2], toChild[2];
  ASSERT_EQ(pipe(toParent), 0);
  ASSERT_EQ(pipe(toChild), 0);
  const pid_t pid = fork();
  if (pid == 0) {  // exporter
    int fails = 0;
    char* d = nullptr;
    cudaIpcMemHandle_t h{};
    if (cudaMalloc(reinterpret_cast<void**>(&d), 4096) != cudaSuccess || cudaMemset(d, 0x5a, 4096) != cudaSuccess ||
        cudaIpcGetMemHandle(&h, d) != cudaSuccess)
      _exit(100);
    void* self = nullptr;
    if (cudaIpcOpenMemHandle(&self, h, cudaIpcMemLazyEnablePeerAccess) == cudaSuccess) ++fails;
    if (cudaIpcGetMemHandle(&h, d + 64) == cudaSuccess) ++fails;  // not an allocation's start
    if (cudaIpcGetMemHandle(&h, d) != cudaSuccess) ++fails;
    if (write(toParent[1], &h, sizeof(h)) != ssize_t(sizeof(h))) _exit(101);
    char done = 0;
    if (read(toChild[0], &done, 1) != 1) _exit(102);
    char back = 0;
    if (cudaMemcpy(&back, d + 100, 1, cudaMemcpyDeviceToHost) != cudaSuccess || back != 0x33) ++fails;
    _exit(fails);
  }
  cudaIpcMemHandle_t h{};
  ASSERT_EQ(read(toParent[0], &h, sizeof(h)), ssize_t(sizeof(h)));
  attn_test::CudaUsedHere() = true;
  void* mapped = nullptr;
  ASSERT_EQ(cudaIpcOpenMemHandle(&mapped, h, cudaIpcMemLazyEnablePeerAccess), cudaSuccess);
  char seen = 0;
  ASSERT_EQ(cudaMemcpy(&seen, static_cast<char*>(mapped) + 4000, 1, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(seen, 0x5a);
  ASSERT_EQ(cudaMemset(mapped, 0x33, 4096), cudaSuccess);
  EXPECT_EQ(cudaIpcCloseMemHandle(mapped), cudaSuccess);
  EXPECT_EQ(cudaIpcCloseMemHandle(mapped), cudaErrorInvalidValue);
  ASSERT_EQ(write(toChild[1], "x", 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(CudaEmu, StreamOrderedPoolMemoryCannotBeExported) {
  REQUIRE_GPU();
  void* p = nullptr;
  ASSERT_EQ(cudaMallocAsync(&p, 256, nullptr), cudaSuccess);
  cudaIpcMemHandle_t h{};
  EXPECT_EQ(cudaIpcGetMemHandle(&h, p), cudaErrorInvalidValue);
  cudaPointerAttributes at{};
  ASSERT_EQ(cudaPointerGetAttributes(&at, p), cudaSuccess);
  EXPECT_EQ(at.type, cudaMemoryTypeDevice);
  EXPECT_EQ(cudaFreeAsync(p, nullptr), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  int host = 0;
  ASSERT_EQ(cudaPointerGetAttributes(&at, &host), cudaSuccess);
  EXPECT_EQ(at.type, cudaMemoryTypeUnregistered);
}

// A captured stream records its work; each launch of the graph runs it
// again, in order, and the capture itself ran nothing.
TEST(CudaEmu, CapturedWorkRunsAtEachGraphLaunch) {
  REQUIRE_GPU();
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  char* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), 8), cudaSuccess);
  ASSERT_EQ(cudaMemset(d, 0, 8), cudaSuccess);
  static std::atomic<int> hostCalls{0};
  hostCalls = 0;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  ASSERT_EQ(cudaStreamIsCapturing(s, &st), cudaSuccess);
  EXPECT_EQ(st, cudaStreamCaptureStatusActive);
  ASSERT_EQ(cudaMemsetAsync(d, 5, 8, s), cudaSuccess);
  ASSERT_EQ(cudaLaunchHostFunc(s, [](void*) { ++hostCalls; }, nullptr), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  ASSERT_EQ(cudaStreamIsCapturing(s, &st), cudaSuccess);
  EXPECT_EQ(st, cudaStreamCaptureStatusNone);
  char h = 1;
  ASSERT_EQ(cudaMemcpy(&h, d, 1, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(h, 0);  // captured, not run
  EXPECT_EQ(hostCalls.load(), 0);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int launch = 1; launch <= 3; ++launch) {
    ASSERT_EQ(cudaMemset(d, 0, 8), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(&h, d, 1, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(h, 5);
    EXPECT_EQ(hostCalls.load(), launch);
  }
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

// CUDA's capture-mode rules: a synchronising call from another thread
// breaks a global-mode capture unless that thread is relaxed; waiting for
// a capturing stream or an event recorded in a capture is refused.
TEST(CudaEmu, CaptureModesDecideWhichCallsBreakACapture) {
  REQUIRE_GPU();
  cudaStream_t s, other;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t ev;
  ASSERT_EQ(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), cudaSuccess);
  auto syncFromAnotherThread = [&](bool relaxed) {
    cudaError_t got = cudaSuccess;
    std::thread([&] {
      cudaStreamCaptureMode mode = relaxed ? cudaStreamCaptureModeRelaxed : cudaStreamCaptureModeGlobal;
      EXPECT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
      got = cudaStreamSynchronize(other);
    }).join();
    return got;
  };
  cudaGraph_t graph = nullptr;
  // Relaxed: the capture survives.
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(syncFromAnotherThread(true), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(ev, s), cudaSuccess);
  EXPECT_EQ(cudaEventSynchronize(ev), cudaErrorStreamCaptureUnsupported);  // this thread captures, global mode
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(graph, nullptr);
  // Global: the other thread's call is refused and the capture is lost.
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(syncFromAnotherThread(false), cudaErrorStreamCaptureUnsupported);
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  ASSERT_EQ(cudaStreamIsCapturing(s, &st), cudaSuccess);
  EXPECT_EQ(st, cudaStreamCaptureStatusInvalidated);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  // Thread-local mode: other threads may synchronise; the capturing stream
  // itself cannot be waited for, nor an event recorded in the capture.
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(syncFromAnotherThread(false), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(ev, s), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(ev), cudaErrorCapturedEvent);
  EXPECT_EQ(cudaStreamWaitEvent(s, ev, 0), cudaSuccess);  // inside its own capture
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeRelaxed), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaEventDestroy(ev), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(other), cudaSuccess);
}

// A user object retained by the graph being captured lives as long as the
// graph, its instantiations and their launches; an invalidated capture
// drops it at once.
TEST(CudaEmu, GraphsHoldUserObjectsUntilTheLastReferenceGoes) {
  REQUIRE_GPU();
  static std::atomic<int> destroyed{0};
  destroyed = 0;
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  auto captureOne = [&](bool invalidate) {
    EXPECT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    cudaGraph_t building = nullptr;
    EXPECT_EQ(cudaStreamGetCaptureInfo(s, &st, nullptr, &building), cudaSuccess);
    EXPECT_EQ(st, cudaStreamCaptureStatusActive);
    cudaUserObject_t obj = nullptr;
    EXPECT_EQ(cudaUserObjectCreate(&obj, nullptr, [](void*) { ++destroyed; }, 1, cudaUserObjectNoDestructorSync),
              cudaSuccess);
    EXPECT_EQ(cudaGraphRetainUserObject(building, obj, 1, cudaGraphUserObjectMove), cudaSuccess);
    if (invalidate) EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
    cudaGraph_t graph = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(s, &graph), invalidate ? cudaErrorStreamCaptureInvalidated : cudaSuccess);
    return graph;
  };
  EXPECT_EQ(captureOne(true), nullptr);
  EXPECT_EQ(destroyed.load(), 1);
  cudaGraph_t graph = captureOne(false);
  ASSERT_NE(graph, nullptr);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(destroyed.load(), 1);  // the instantiation still holds it
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(destroyed.load(), 2);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

// A capture forks into a second stream through an event and joins back:
// both streams' work is in the graph; only the stream that began the
// capture may end it.
TEST(CudaEmu, CapturesForkIntoOtherStreamsAndJoinBack) {
  REQUIRE_GPU();
  cudaStream_t s, t;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t fork, join;
  ASSERT_EQ(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), cudaSuccess);
  char* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(d, 0, 2), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d, 1, 1, s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(fork, s), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(t, fork, 0), cudaSuccess);
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  ASSERT_EQ(cudaStreamIsCapturing(t, &st), cudaSuccess);
  EXPECT_EQ(st, cudaStreamCaptureStatusActive);
  ASSERT_EQ(cudaMemsetAsync(d + 1, 2, 1, t), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(join, t), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(s, join, 0), cudaSuccess);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(t, &graph), cudaErrorStreamCaptureUnmatched);
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  ASSERT_EQ(cudaStreamIsCapturing(t, &st), cudaSuccess);
  EXPECT_EQ(st, cudaStreamCaptureStatusNone);
  char h[2] = {9, 9};
  ASSERT_EQ(cudaMemcpy(h, d, 2, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(h[0], 0);
  EXPECT_EQ(h[1], 0);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(h, d, 2, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(h[0], 1);
  EXPECT_EQ(h[1], 2);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  for (cudaEvent_t e : {fork, join}) EXPECT_EQ(cudaEventDestroy(e), cudaSuccess);
  for (cudaStream_t x : {s, t}) EXPECT_EQ(cudaStreamDestroy(x), cudaSuccess);
}

// CUDA ends a capture with cudaErrorStreamCaptureUnjoined when work of a
// forked stream is not joined back into the stream that began it (directly
// or through another forked stream), and discards the graph.
TEST(CudaEmu, ACaptureWithAnUnjoinedForkFails) {
  REQUIRE_GPU();
  cudaStream_t s, t, u;
  for (cudaStream_t* x : {&s, &t, &u}) ASSERT_EQ(cudaStreamCreateWithFlags(x, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t fork, join, relay;
  for (cudaEvent_t* e : {&fork, &join, &relay})
    ASSERT_EQ(cudaEventCreateWithFlags(e, cudaEventDisableTiming), cudaSuccess);
  char* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), 3), cudaSuccess);
  // How the capture ends, by what t and u do after the fork.
  enum class Join { kNone, kDirect, kThroughU, kWorkAfterTheJoin, kNoWorkOnT };
  const std::pair<Join, cudaError_t> cases[] = {
      {Join::kNone, cudaErrorStreamCaptureUnjoined},
      {Join::kDirect, cudaSuccess},
      {Join::kThroughU, cudaSuccess},
      {Join::kWorkAfterTheJoin, cudaErrorStreamCaptureUnjoined},
      {Join::kNoWorkOnT, cudaSuccess},
  };
  for (const auto& [how, expected] : cases) {
    SCOPED_TRACE(int(how));
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(d, 1, 1, s), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(fork, s), cudaSuccess);
    ASSERT_EQ(cudaStreamWaitEvent(t, fork, 0), cudaSuccess);
    if (how != Join::kNoWorkOnT) ASSERT_EQ(cudaMemsetAsync(d + 1, 2, 1, t), cudaSuccess);
    if (how == Join::kDirect || how == Join::kWorkAfterTheJoin || how == Join::kNoWorkOnT) {
      ASSERT_EQ(cudaEventRecord(join, t), cudaSuccess);
      ASSERT_EQ(cudaStreamWaitEvent(s, join, 0), cudaSuccess);
    }
    if (how == Join::kThroughU) {  // t joins u, which joins s
      ASSERT_EQ(cudaEventRecord(relay, t), cudaSuccess);
      ASSERT_EQ(cudaStreamWaitEvent(u, relay, 0), cudaSuccess);
      ASSERT_EQ(cudaMemsetAsync(d + 2, 3, 1, u), cudaSuccess);
      ASSERT_EQ(cudaEventRecord(join, u), cudaSuccess);
      ASSERT_EQ(cudaStreamWaitEvent(s, join, 0), cudaSuccess);
    }
    if (how == Join::kWorkAfterTheJoin) ASSERT_EQ(cudaMemsetAsync(d + 1, 4, 1, t), cudaSuccess);
    cudaGraph_t graph = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(s, &graph), expected);
    EXPECT_EQ(graph != nullptr, expected == cudaSuccess);
    // The capture has ended either way, on every stream it had.
    for (cudaStream_t x : {s, t, u}) {
      cudaStreamCaptureStatus st = cudaStreamCaptureStatusActive;
      ASSERT_EQ(cudaStreamIsCapturing(x, &st), cudaSuccess);
      EXPECT_EQ(st, cudaStreamCaptureStatusNone);
    }
    if (graph) EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  }
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  for (cudaEvent_t e : {fork, join, relay}) EXPECT_EQ(cudaEventDestroy(e), cudaSuccess);
  for (cudaStream_t x : {s, t, u}) EXPECT_EQ(cudaStreamDestroy(x), cudaSuccess);
}

}  // namespace
