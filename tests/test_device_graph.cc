// Device communicators inside CUDA graphs: operations enqueued on a stream
// that is being captured run at every launch of the graph, with the
// buffers' contents of that launch; the proxy's own synchronisation never
// breaks an application's capture; what fails at a launch is the
// communicator's asynchronous error. Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "attncomm.h"
#include "src/device/retained_memory.h"
#include "src/device/stream_bridge.h"
#include "support/attn_fixtures.h"
#include "support/device_attn.h"
#include "support/gpu.h"
#include "support/multirank.h"
#include "src/device/backends/cuda_ipc/ipc_stats.h"

namespace {

using attn_test::RunOptions;
using attn_test::RunProcesses;
using attn_test::RunThreads;

RunOptions OnGpu0(attnConfig_t* cfg) {
  *cfg = ATTN_CONFIG_INITIALIZER;
  cfg->device = 0;
  RunOptions o;
  o.config = cfg;
  return o;
}

void ExpectNoAsyncError(attnComm_t comm) {
  attnResult_t async = attnInternalError;
  ASSERT_EQ(attnCommGetAsyncError(comm, &async), attnSuccess);
  EXPECT_EQ(async, attnSuccess) << attnGetLastError(comm);
}

// Captures `body`'s calls on `s` (thread-local mode: rank threads of one
// process capture at the same time) into an instantiated graph.
template <class Body>
cudaGraphExec_t Capture(cudaStream_t s, Body body) {
  EXPECT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  body();
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  if (graph) {
    EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  }
  return exec;
}

// An all-reduce, an all-gather and a group of sends and receives, captured
// once and launched three times with new inputs.
TEST(DeviceGraph, CapturedCollectivesRunAtEachLaunch) {
  REQUIRE_GPU();
  for (int n : {2, 3}) {
    attnConfig_t cfg;
    RunThreads(n, [](int rank, int nranks, attnComm_t& comm) {
      const size_t count = 333;
      cudaStream_t s;
      ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
      float *send, *sum, *all, *fromLeft;
      ASSERT_EQ(cudaMallocAsync(reinterpret_cast<void**>(&send), count * sizeof(float), s), cudaSuccess);
      ASSERT_EQ(cudaMallocAsync(reinterpret_cast<void**>(&fromLeft), count * sizeof(float), s), cudaSuccess);
      ASSERT_EQ(cudaMallocAsync(reinterpret_cast<void**>(&sum), count * sizeof(float), s), cudaSuccess);
      ASSERT_EQ(cudaMallocAsync(reinterpret_cast<void**>(&all), nranks * count * sizeof(float), s), cudaSuccess);
      ASSERT_EQ(cudaMemsetAsync(sum, 0, count * sizeof(float), s), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      cudaGraphExec_t exec = Capture(s, [&] {
        EXPECT_EQ(attnAllReduce(send, sum, count, attnFloat32, attnSum, comm, (attnStream_t)s), attnSuccess)
            << attnGetLastError(comm);
        EXPECT_EQ(attnAllGather(send, all, count, attnFloat32, comm, (attnStream_t)s), attnSuccess)
            << attnGetLastError(comm);
        // A ring exchange as one group.
        EXPECT_EQ(attnGroupStart(), attnSuccess);
        EXPECT_EQ(attnSend(send, count, attnFloat32, (rank + 1) % nranks, comm, (attnStream_t)s), attnSuccess);
        EXPECT_EQ(attnRecv(fromLeft, count, attnFloat32, (rank + nranks - 1) % nranks, comm, (attnStream_t)s),
                  attnSuccess);
        EXPECT_EQ(attnGroupEnd(), attnSuccess) << attnGetLastError(comm);
      });
      ASSERT_NE(exec, nullptr);
      // Nothing ran at capture time.
      std::vector<float> got(count, -1.f);
      ASSERT_EQ(cudaMemcpyAsync(got.data(), sum, count * sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      EXPECT_EQ(got[0], 0.f);
      std::vector<float> gathered(nranks * count), left(count);
      for (int launch = 1; launch <= 3; ++launch) {
        std::vector<float> mine(count);
        for (size_t i = 0; i < count; ++i) mine[i] = float(launch * 100000 + rank * 1000 + int(i));
        ASSERT_EQ(cudaMemcpyAsync(send, mine.data(), count * sizeof(float), cudaMemcpyHostToDevice, s), cudaSuccess);
        ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
        ASSERT_EQ(cudaMemcpyAsync(got.data(), sum, count * sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
        ASSERT_EQ(cudaMemcpyAsync(gathered.data(), all, gathered.size() * sizeof(float), cudaMemcpyDeviceToHost, s),
                  cudaSuccess);
        ASSERT_EQ(cudaMemcpyAsync(left.data(), fromLeft, count * sizeof(float), cudaMemcpyDeviceToHost, s),
                  cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
        const int leftRank = (rank + nranks - 1) % nranks;
        for (size_t i = 0; i < count; ++i) {
          double expect = 0;
          for (int r = 0; r < nranks; ++r) expect += launch * 100000.0 + r * 1000.0 + double(i);
          ASSERT_EQ(got[i], float(expect)) << "launch " << launch << " element " << i;
          for (int r = 0; r < nranks; ++r)
            ASSERT_EQ(gathered[r * count + i], float(launch * 100000 + r * 1000 + int(i)));
          ASSERT_EQ(left[i], float(launch * 100000 + leftRank * 1000 + int(i)));
        }
      }
      ExpectNoAsyncError(comm);
      EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
      for (float* p : {send, sum, all, fromLeft}) cudaFreeAsync(p, s);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      cudaStreamDestroy(s);
    }, OnGpu0(&cfg));
  }
}

// Sends on one stream and receives on another, in one group, inside a
// capture that forks into the second stream and joins it back (as engines
// capture several streams): the group's streams are joined inside the
// graph, and every launch moves that launch's data.
TEST(DeviceGraph, AGroupOverTwoStreamsInsideAForkedCapture) {
  REQUIRE_GPU();
  attnConfig_t cfg;
  RunThreads(3, [](int rank, int nranks, attnComm_t& comm) {
    const size_t count = 100;
    cudaStream_t s, t;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking), cudaSuccess);
    cudaEvent_t fork, join;
    ASSERT_EQ(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), cudaSuccess);
    ASSERT_EQ(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), cudaSuccess);
    float *out, *in;
    ASSERT_EQ(cudaMallocAsync(reinterpret_cast<void**>(&out), count * sizeof(float), s), cudaSuccess);
    ASSERT_EQ(cudaMallocAsync(reinterpret_cast<void**>(&in), count * sizeof(float), s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    const int right = (rank + 1) % nranks, left = (rank + nranks - 1) % nranks;
    cudaGraphExec_t exec = Capture(s, [&] {
      EXPECT_EQ(cudaEventRecord(fork, s), cudaSuccess);
      EXPECT_EQ(cudaStreamWaitEvent(t, fork, 0), cudaSuccess);
      EXPECT_EQ(attnGroupStart(), attnSuccess);
      EXPECT_EQ(attnSend(out, count, attnFloat32, right, comm, (attnStream_t)s), attnSuccess);
      EXPECT_EQ(attnRecv(in, count, attnFloat32, left, comm, (attnStream_t)t), attnSuccess);
      EXPECT_EQ(attnGroupEnd(), attnSuccess) << attnGetLastError(comm);
      EXPECT_EQ(cudaEventRecord(join, t), cudaSuccess);
      EXPECT_EQ(cudaStreamWaitEvent(s, join, 0), cudaSuccess);
    });
    ASSERT_NE(exec, nullptr);
    for (int launch = 1; launch <= 2; ++launch) {
      std::vector<float> mine(count), got(count, -1.f);
      for (size_t i = 0; i < count; ++i) mine[i] = float(launch * 1000 + rank * 100 + int(i));
      ASSERT_EQ(cudaMemcpyAsync(out, mine.data(), count * sizeof(float), cudaMemcpyHostToDevice, s), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
      ASSERT_EQ(cudaMemcpyAsync(got.data(), in, count * sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(got[i], float(launch * 1000 + left * 100 + int(i))) << "launch " << launch;
    }
    ExpectNoAsyncError(comm);
    EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
    for (float* p : {out, in}) cudaFreeAsync(p, s);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    for (cudaEvent_t e : {fork, join}) cudaEventDestroy(e);
    for (cudaStream_t x : {s, t}) cudaStreamDestroy(x);
  }, OnGpu0(&cfg));
}

// Many operations in one graph: each takes a flag word, and past the first
// page of them the library allocates pinned memory during the capture,
// which must not break it (the capturing thread is in thread-local mode).
TEST(DeviceGraph, AGraphOfManyOperations) {
  REQUIRE_GPU();
  attnConfig_t cfg;
  RunThreads(2, [](int rank, int nranks, attnComm_t& comm) {
    constexpr int kOps = 150;
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    float* buf = nullptr;
    ASSERT_EQ(cudaMallocAsync(reinterpret_cast<void**>(&buf), sizeof(float), s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    cudaGraphExec_t exec = Capture(s, [&] {
      for (int i = 0; i < kOps; ++i)
        ASSERT_EQ(attnAllReduce(buf, buf, 1, attnFloat32, attnMax, comm, (attnStream_t)s), attnSuccess)
            << attnGetLastError(comm);
    });
    ASSERT_NE(exec, nullptr);
    for (int launch = 1; launch <= 2; ++launch) {
      const float mine = float(launch * 10 + rank);
      float got = -1.f;
      ASSERT_EQ(cudaMemcpyAsync(buf, &mine, sizeof(float), cudaMemcpyHostToDevice, s), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
      ASSERT_EQ(cudaMemcpyAsync(&got, buf, sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      EXPECT_EQ(got, float(launch * 10 + nranks - 1));
    }
    ExpectNoAsyncError(comm);
    EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
    cudaFreeAsync(buf, s);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    cudaStreamDestroy(s);
  }, OnGpu0(&cfg));
}

// A chain of collectives captured as one graph, each reading the one
// before: all-reduce, all-gather, reduce-scatter (max), broadcast,
// all-to-all, in-place all-reduce. Three launches with new inputs, over
// CUDA IPC and over pinned staging: every intermediate and the end
// result are those of that launch's inputs.
TEST(DeviceGraph, CapturedChainOfCollectivesRunsInOrderAtEachLaunch) {
  REQUIRE_GPU();
  for (const char* transport : {"", "shm,tcp"}) {
    for (int n : {2, 3}) {
      SCOPED_TRACE(std::string("ATTN_TRANSPORT=") + transport + ", " + std::to_string(n) + " ranks");
      attnConfig_t cfg;
      RunOptions o = OnGpu0(&cfg);
      if (*transport) o.env = {{"ATTN_TRANSPORT", transport}};
      const uint64_t ipcOps = attn::ipc::ipcCounters().ops.load();
      RunThreads(n, [](int rank, int nranks, attnComm_t& comm) {
        const size_t k = 37, c = k * size_t(nranks);  // c elements per rank, k per all-to-all block
        const size_t bytes = c * sizeof(float);
        cudaStream_t s;
        ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
        float *x, *y, *z, *w, *v, *u;
        for (float** p : {&x, &y, &w, &v, &u})
          ASSERT_EQ(cudaMallocAsync(reinterpret_cast<void**>(p), bytes, s), cudaSuccess);
        ASSERT_EQ(cudaMallocAsync(reinterpret_cast<void**>(&z), bytes * nranks, s), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
        const auto st = (attnStream_t)s;
        cudaGraphExec_t exec = Capture(s, [&] {
          EXPECT_EQ(attnAllReduce(x, y, c, attnFloat32, attnSum, comm, st), attnSuccess);
          EXPECT_EQ(attnAllGather(y, z, c, attnFloat32, comm, st), attnSuccess);
          EXPECT_EQ(attnReduceScatter(z, w, c, attnFloat32, attnMax, comm, st), attnSuccess);
          EXPECT_EQ(attnBroadcast(w, v, c, attnFloat32, nranks - 1, comm, st), attnSuccess);
          EXPECT_EQ(attnAllToAll(v, u, k, attnFloat32, comm, st), attnSuccess);
          EXPECT_EQ(attnAllReduce(u, u, c, attnFloat32, attnSum, comm, st), attnSuccess);
        });
        ASSERT_NE(exec, nullptr) << attnGetLastError(comm);
        auto input = [&](int launch, int r, size_t i) { return float(launch * 1000 + r * 10 + int(i % 97)); };
        for (int launch = 1; launch <= 3; ++launch) {
          std::vector<float> in(c), gotZ(c * nranks), gotW(c), gotU(c);
          for (size_t i = 0; i < c; ++i) in[i] = input(launch, rank, i);
          ASSERT_EQ(cudaMemcpyAsync(x, in.data(), bytes, cudaMemcpyHostToDevice, s), cudaSuccess);
          ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
          ASSERT_EQ(cudaMemcpyAsync(gotZ.data(), z, bytes * nranks, cudaMemcpyDeviceToHost, s), cudaSuccess);
          ASSERT_EQ(cudaMemcpyAsync(gotW.data(), w, bytes, cudaMemcpyDeviceToHost, s), cudaSuccess);
          ASSERT_EQ(cudaMemcpyAsync(gotU.data(), u, bytes, cudaMemcpyDeviceToHost, s), cudaSuccess);
          ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
          auto sum = [&](size_t i) {  // y[i]: the first all-reduce
            float t = 0;
            for (int r = 0; r < nranks; ++r) t += input(launch, r, i);
            return t;
          };
          for (size_t i = 0; i < c; ++i) {
            for (int r = 0; r < nranks; ++r) ASSERT_EQ(gotZ[r * c + i], sum(i)) << "launch " << launch;
            // Every rank gathered the same z, so block `rank`'s max over ranks is y.
            ASSERT_EQ(gotW[i], sum(i)) << "launch " << launch;
          }
          // After the all-to-all rank q holds y[q*k + j] in every block p;
          // the last all-reduce adds those over q.
          for (int p = 0; p < nranks; ++p)
            for (size_t j = 0; j < k; ++j) {
              float expect = 0;
              for (int q = 0; q < nranks; ++q) expect += sum(q * k + j);
              ASSERT_EQ(gotU[p * k + j], expect) << "launch " << launch;
            }
        }
        ExpectNoAsyncError(comm);
        EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
        for (float* p : {x, y, z, w, v, u}) cudaFreeAsync(p, s);
        ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
        cudaStreamDestroy(s);
      }, o);
      // The backend named ran: GPU to GPU, or staged without cuda_ipc.
      if (*transport) EXPECT_EQ(attn::ipc::ipcCounters().ops.load(), ipcOps);
      else EXPECT_GT(attn::ipc::ipcCounters().ops.load(), ipcOps);
    }
  }
}

// Ring attention captured once and launched twice, its output cleared
// before each launch: both launches compute exact attention.
TEST(DeviceGraph, CapturedRingAttentionEqualsExactAttention) {
  REQUIRE_GPU();
  constexpr attnAttnConfig_t shape = ATTN_ATTN_CONFIG(8, 2, 64, attnBfloat16, 0.f, 1);
  const attn_test::AttnCase c =
      attn_test::MakeCase("graph", attn_test::PrefillSpec(shape, {200, 61}, {40, 0}), 5);
  for (attnAttnMode_t mode : {attnModePassKV, attnModePassQ, attnModeShipQ}) {
    attnConfig_t cfg;
    RunThreads(3, [&](int rank, int nranks, attnComm_t& comm) {
      const attn_test::Placement pl = attn_test::RandomPlacement(c, nranks, 3, -1);
      const attn_test::RankShard sh = attn_test::GatherShard(c, pl, rank);
      const size_t outBytes = sh.q.size();
      const attn_test::DeviceRun r =
          attn_test::RunShardOnDevice(c, sh, comm, true, {}, [&](const attn_test::DeviceShard& d) {
            attnResult_t rc = attnSuccess;
            cudaGraphExec_t exec = Capture(d.stream, [&] {
              rc = attnRingAttention(d.q, d.k, d.v, d.out, d.lse, &sh.layout, &c.cfg, mode, comm,
                                     (attnStream_t)d.stream);
            });
            if (rc != attnSuccess || !exec) return rc != attnSuccess ? rc : attnInternalError;
            for (int launch = 0; launch < 2; ++launch) {
              EXPECT_EQ(cudaMemsetAsync(d.out, 0, outBytes + 1, d.stream), cudaSuccess);
              EXPECT_EQ(cudaGraphLaunch(exec, d.stream), cudaSuccess);
            }
            EXPECT_EQ(cudaStreamSynchronize(d.stream), cudaSuccess);
            EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
            return attnSuccess;
          });
      attn_test::ExpectExact(r, shape.dtype, attn_test::ModeName(mode));
      ExpectNoAsyncError(comm);
    }, OnGpu0(&cfg));
  }
}

// An application captures a graph in global mode on its own stream while
// the ranks' proxies run collectives (and synchronise their copy streams):
// the capture must survive, since the proxies run in relaxed mode.
TEST(DeviceGraph, ProxySynchronisationDoesNotBreakAnApplicationsCapture) {
  REQUIRE_GPU();
  std::atomic<int> ready{0};  // ranks set up (communicator, buffers)
  std::atomic<int> phase{0};  // 1: the capture is open; 2: the ranks are done; 3: it is closed
  cudaError_t ended = cudaErrorUnknown;
  std::thread app([&] {
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    void* scratch = nullptr;
    ASSERT_EQ(cudaMallocAsync(&scratch, 64, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    while (ready.load() != 2) std::this_thread::yield();
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    EXPECT_EQ(cudaMemsetAsync(scratch, 1, 64, s), cudaSuccess);
    phase = 1;
    while (phase.load() != 2) std::this_thread::yield();
    cudaGraph_t graph = nullptr;
    ended = cudaStreamEndCapture(s, &graph);
    phase = 3;
    if (graph) cudaGraphDestroy(graph);
    cudaFreeAsync(scratch, s);
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  });
  attnConfig_t cfg;
  std::atomic<int> done{0};
  RunThreads(2, [&](int rank, int nranks, attnComm_t& comm) {
    // Set up before the capture opens, check after it closed: these
    // threads are in global mode themselves.
    const size_t count = 4096;
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    float* buf = nullptr;
    ASSERT_EQ(cudaMallocAsync(reinterpret_cast<void**>(&buf), count * sizeof(float), s), cudaSuccess);
    std::vector<float> mine(count, float(rank + 1)), got(count, 0.f);
    ASSERT_EQ(cudaMemcpyAsync(buf, mine.data(), count * sizeof(float), cudaMemcpyHostToDevice, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    ++ready;
    while (phase.load() != 1) std::this_thread::yield();
    for (int i = 0; i < 3; ++i)
      ASSERT_EQ(attnAllReduce(buf, buf, count, attnFloat32, attnSum, comm, (attnStream_t)s), attnSuccess)
          << attnGetLastError(comm);
    ASSERT_EQ(cudaMemcpyAsync(got.data(), buf, count * sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
    // Wait for the copy without a synchronising call while the capture is open.
    while (cudaStreamQuery(s) == cudaErrorNotReady) std::this_thread::yield();
    if (++done == nranks) phase = 2;
    while (phase.load() != 3) std::this_thread::yield();
    const float expect = float(nranks * (nranks + 1) / 2) * float(nranks) * float(nranks);  // 3 all-reduces
    EXPECT_EQ(got[0], expect);
    EXPECT_EQ(got[count - 1], expect);
    cudaFreeAsync(buf, s);
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }, OnGpu0(&cfg));
  app.join();
  EXPECT_EQ(ended, cudaSuccess) << "the application's capture was broken: " << cudaGetErrorString(ended);
}

// A captured attnKvAppend runs at each launch, with the positions the host
// array holds then (DeviceKvPool.CapturedDecodeStep… checks the tokens).
// What fails at a launch appends nothing and is the communicator's
// asynchronous error: positions that do not increase, a full pool, a pool
// destroyed before the launch. attnKvRelease is refused in a capture.
TEST(DeviceGraph, CapturedKvAppendFailuresAreAsyncErrorsOfTheLaunch) {
  REQUIRE_GPU();
  struct Case {
    const char* name;
    int64_t capacity;
    int goodLaunches;     // launches that append, each at a new position
    bool repeatPosition;  // then one at the last position again
    bool destroyPool;     // then one after attnKvPoolDestroy
    attnResult_t code;
    const char* error;
  };
  const Case cases[] = {
      {"positions", 8, 2, true, false, attnInvalidArgument, "positions must increase"},
      {"full pool", 1, 4, false, false, attnInvalidUsage, "free of 1"},
      {"destroyed pool", 8, 1, false, true, attnInvalidUsage, "after its pool was destroyed"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    attnConfig_t cfg;
    RunThreads(1, [&](int, int, attnComm_t& comm) {
      const attnKvPoolConfig_t pc{4, 1, 8, attnFloat32, c.capacity};
      attnKvPool_t pool = nullptr;
      ASSERT_EQ(attnKvPoolCreate(comm, &pc, &pool), attnSuccess) << attnGetLastError(comm);
      cudaStream_t s;
      ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
      float* kv = nullptr;
      int32_t* pos = nullptr;
      ASSERT_EQ(cudaMallocAsync(reinterpret_cast<void**>(&kv), 8 * sizeof(float), s), cudaSuccess);
      ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pos), sizeof(int32_t)), cudaSuccess);
      ASSERT_EQ(cudaMemsetAsync(kv, 0, 8 * sizeof(float), s), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      cudaGraphExec_t exec = Capture(s, [&] {
        EXPECT_EQ(attnKvAppend(pool, 7, kv, kv, pos, 1, (attnStream_t)s), attnSuccess) << attnGetLastError(comm);
        // A release cannot be replayed: refused, and the capture goes on.
        EXPECT_EQ(attnKvRelease(pool, 7, (attnStream_t)s), attnInvalidUsage);
        const std::string refused = attnGetLastError(nullptr);
        EXPECT_NE(refused.find("captured into a CUDA graph"), std::string::npos) << refused;
      });
      ASSERT_NE(exec, nullptr);
      int64_t tokens = -1;
      // Captured, not run: the request does not exist yet.
      EXPECT_EQ(attnKvGetPlacement(pool, 7, nullptr, &tokens), attnInvalidArgument);
      for (int i = 0; i < c.goodLaunches; ++i) {
        *pos = 10 * i;
        ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
        ExpectNoAsyncError(comm);
        ASSERT_EQ(attnKvGetPlacement(pool, 7, nullptr, &tokens), attnSuccess) << attnGetLastError(comm);
        EXPECT_EQ(tokens, i + 1);
      }
      if (c.destroyPool) {
        EXPECT_EQ(attnKvPoolDestroy(pool), attnSuccess);
        pool = nullptr;
      } else if (!c.repeatPosition) {
        *pos += 10;
      }
      ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);  // the failed launch still released the stream
      attnResult_t async = attnSuccess;
      ASSERT_EQ(attnCommGetAsyncError(comm, &async), attnSuccess);
      EXPECT_EQ(async, c.code);
      const std::string why = attnGetLastError(comm);
      EXPECT_NE(why.find(c.error), std::string::npos) << why;
      EXPECT_NE(why.find("request 7"), std::string::npos) << why;
      if (pool) {  // nothing was appended
        ASSERT_EQ(attnKvGetPlacement(pool, 7, nullptr, &tokens), attnSuccess) << attnGetLastError(comm);
        EXPECT_EQ(tokens, c.goodLaunches);
        EXPECT_EQ(attnKvPoolDestroy(pool), attnSuccess);
      }
      EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
      cudaFreeAsync(kv, s);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      cudaFreeHost(pos);
      cudaStreamDestroy(s);
    }, OnGpu0(&cfg));
  }
}

// While a graph holds a communicator's captured operations, a launch may
// park a stream at any moment, unannounced: the process's memory cache
// then keeps what is past its cap instead of a device-wide free, and gives
// it back once the graph is gone.
TEST(DeviceGraph, TheMemoryCacheIsNotTrimmedWhileGraphsMayPark) {
  REQUIRE_GPU();
  namespace rm = attn::retained;
  const size_t MiB = size_t(1) << 20;
  const int aliveBefore = attn::StreamBridge::capturedAlive();
  attnConfig_t cfg;
  RunOptions o = OnGpu0(&cfg);
  o.env = {{"ATTN_RETAINED_CACHE_MB", "1"}};  // read when a device communicator is made
  RunThreads(1, [&](int, int, attnComm_t& comm) {
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    float* x = nullptr;
    ASSERT_EQ(cudaMallocAsync(reinterpret_cast<void**>(&x), 64 * sizeof(float), s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    cudaGraphExec_t exec = Capture(s, [&] {
      EXPECT_EQ(attnAllReduce(x, x, 64, attnFloat32, attnSum, comm, (attnStream_t)s), attnSuccess);
    });
    ASSERT_NE(exec, nullptr);
    const rm::Stats before = rm::stats();
    rm::Block big;
    ASSERT_EQ(rm::acquire(0, 4 * MiB, &big), attnSuccess);
    rm::release(0, big);  // over the cap, but the graph may be launched
    const rm::Stats kept = rm::stats();
    EXPECT_EQ(kept.freed, before.freed) << "freed while a graph could park a stream";
    EXPECT_GT(kept.trimsDeferred, before.trimsDeferred);
    EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
    for (int i = 0; i < 5000 && attn::StreamBridge::capturedAlive() != aliveBefore; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    rm::Block small;
    ASSERT_EQ(rm::acquire(0, 1000, &small), attnSuccess);
    rm::release(0, small);
    const rm::Stats after = rm::stats();
    EXPECT_GT(after.freed, kept.freed) << "the graph is gone: the cache should trim to its cap";
    EXPECT_LE(after.cachedBytes, MiB);
    cudaFreeAsync(x, s);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    cudaStreamDestroy(s);
  }, o);
}

// A graph may outlive its communicator: destroying the communicator frees
// its device state at once (the graph keeps only its flags), a later
// launch runs nothing and does not hang, and destroying the graph frees
// the captured operations.
void GraphOutlivesItsCommunicator(int nranks, attnComm_t& comm) {
  namespace rm = attn::retained;
  const int aliveBefore = attn::StreamBridge::capturedAlive();
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  float* buf = nullptr;
  ASSERT_EQ(cudaMallocAsync(reinterpret_cast<void**>(&buf), 64 * sizeof(float), s), cudaSuccess);
  std::vector<float> ones(64, 1.f), got(64, 0.f);
  ASSERT_EQ(cudaMemcpyAsync(buf, ones.data(), 64 * sizeof(float), cudaMemcpyHostToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaGraphExec_t exec = Capture(s, [&] {
    EXPECT_EQ(attnAllReduce(buf, buf, 64, attnFloat32, attnSum, comm, (attnStream_t)s), attnSuccess);
    EXPECT_EQ(attnAllReduce(buf, buf, 64, attnFloat32, attnSum, comm, (attnStream_t)s), attnSuccess);
  });
  ASSERT_NE(exec, nullptr);
  EXPECT_EQ(attn::StreamBridge::capturedAlive(), aliveBefore + 2);
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(got.data(), buf, 64 * sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(got[63], float(nranks * nranks));
  ASSERT_EQ(attnCommDestroy(comm), attnSuccess);
  comm = nullptr;
  EXPECT_EQ(rm::stats().holds, 0) << "the captured work kept the communicator's device state alive";
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);  // released, not parked forever
  EXPECT_EQ(attn::StreamBridge::capturedAlive(), aliveBefore + 2);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  // CUDA runs user-object destructors on a thread of its own.
  for (int i = 0; i < 5000 && attn::StreamBridge::capturedAlive() != aliveBefore; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(attn::StreamBridge::capturedAlive(), aliveBefore);
  cudaFreeAsync(buf, s);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaStreamDestroy(s);
}

// One host: the cuda_ipc backend.
TEST(DeviceGraph, GraphsOutliveTheirCommunicatorSafely) {
  REQUIRE_GPU();
  attnConfig_t cfg;
  RunThreads(1, [](int, int nranks, attnComm_t& comm) { GraphOutlivesItsCommunicator(nranks, comm); },
             OnGpu0(&cfg));
}

// Two emulated hosts: the staged backend, whose work holds the device
// state itself (the communicator must drop it from its graphs).
TEST(DeviceGraph, GraphsOutliveTheirCommunicatorSafelyAcrossHosts) {
  REQUIRE_GPU();
  attnConfig_t cfg;
  RunOptions o = OnGpu0(&cfg);
  o.child_setup = [](int rank) { setenv("ATTN_HOSTID", rank == 0 ? "graph-host-a" : "graph-host-b", 1); };
  RunProcesses(2, [](int, int nranks, attnComm_t& comm) { GraphOutlivesItsCommunicator(nranks, comm); }, o);
}

}  // namespace
