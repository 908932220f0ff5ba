// The cuda_ipc backend of device communicators (src/device/backends/cuda_ipc):
// collectives move device buffers GPU to GPU when every rank is on this
// host. Its ATTN_TRANSPORT name is checked everywhere; the GPU tests skip
// without a GPU.
//
// Ranks as forked processes need a CUDA context made after the fork: the
// parent of these tests never initialises CUDA (it counts the GPUs in a
// throwaway child), and a test that finds CUDA already initialised in this
// process by an earlier test (the whole binary run at once, not through
// ctest) skips its process variant.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attncomm.h"
#include "src/core/config.h"
#include "support/multirank.h"

#if ATTN_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "support/gpu.h"
#include "src/device/backends/cuda_ipc/ipc_stats.h"
#endif

namespace {

using attn::kTransportCudaIpc;
using attn::kTransportShm;
using attn::kTransportTcp;
using attn::parseTransportList;

// ---- ATTN_TRANSPORT: runs in every build -----------------------------------

TEST(CudaIpcConfig, TransportListAcceptsCudaIpcWhereCudaIsBuilt) {
  uint32_t mask = 0;
  const attnResult_t r = parseTransportList("shm,cuda_ipc", &mask);
#if ATTN_HAVE_CUDA
  ASSERT_EQ(r, attnSuccess);
  EXPECT_EQ(mask, kTransportShm | kTransportCudaIpc);
  EXPECT_EQ(attn::transportListString(mask), "shm,cuda_ipc");
#else
  EXPECT_EQ(r, attnNotSupported);
#endif
}

TEST(CudaIpcConfig, TransportListRejectsGarbage) {
  uint32_t mask = 0;
  for (const char* bad : {"cuda-ipc", "shm,cudaipc", "tcp,cuda_ipc2", "CUDA_IPC,shm"})
    EXPECT_EQ(parseTransportList(bad, &mask), attnInvalidArgument) << bad;
}

TEST(CudaIpcConfig, CudaIpcAloneNamesNoHostTransport) {
  uint32_t mask = 0;
  const attnResult_t r = parseTransportList("cuda_ipc", &mask);
#if ATTN_HAVE_CUDA
  EXPECT_EQ(r, attnInvalidArgument);
#else
  EXPECT_EQ(r, attnNotSupported);
#endif
}

TEST(CudaIpcConfig, AllowedByDefault) {
  EXPECT_TRUE(attn::CommConfig{}.transports & kTransportCudaIpc);
  uint32_t mask = 0;
  ASSERT_EQ(parseTransportList("shm,tcp", &mask), attnSuccess);
  EXPECT_FALSE(mask & kTransportCudaIpc) << "an explicit list without it turns it off";
}

#if ATTN_HAVE_CUDA
// A host communicator whose list names cuda_ipc still connects over shm.
TEST(CudaIpcConfig, HostCommunicatorIgnoresCudaIpc) {
  attn_test::RunOptions o;
  o.env = {{"ATTN_TRANSPORT", "shm,cuda_ipc"}};
  attn_test::RunThreads(2, [](int rank, int n, attnComm_t& comm) {
    attn_test::CheckAllReduce(comm, rank, n, attnFloat32, attnSum, 1001, false);
  }, o);
}

// ---- GPU tests ---------------------------------------------------------------

using attn_test::Pattern;
using attn_test::RedExpected;
using attn_test::RedInput;
using attn_test::RunOptions;
using attn_test::Sentinel;
using attn_test::TypedBuf;

uint64_t Count(std::atomic<uint64_t>& c) { return c.load(); }
attn::ipc::IpcCounters& Counters() { return attn::ipc::ipcCounters(); }

RunOptions OnGpu0(attnConfig_t* cfg) {
  *cfg = ATTN_CONFIG_INITIALIZER;
  cfg->device = 0;
  RunOptions o;
  o.config = cfg;
  o.deadline_ms = 240000;
  return o;
}

// A device buffer. With a stream it is stream-ordered on it, as ranks that
// are threads sharing a GPU need: cudaMalloc/cudaFree may wait for the whole
// device, where a peer thread's stream may already wait for this rank's next
// call. Without one it comes from cudaMalloc, which peers in other processes
// can open by IPC handle (and a process's cudaFree waits only for its own
// streams).
class DevBuf {
 public:
  explicit DevBuf(size_t bytes, cudaStream_t orderedOn = nullptr) : s_(orderedOn) {
    if (bytes == 0) return;
    if (s_) EXPECT_EQ(cudaMallocAsync(&p_, bytes, s_), cudaSuccess);
    else EXPECT_EQ(cudaMalloc(&p_, bytes), cudaSuccess);
  }
  ~DevBuf() {
    if (p_ && s_) cudaFreeAsync(p_, s_);
    else if (p_) cudaFree(p_);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  char* at(size_t off) const { return static_cast<char*>(p_) + off; }
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
  cudaStream_t s_ = nullptr;
};

void Upload(void* dst, const TypedBuf& h, cudaStream_t s) {
  if (h.bytes()) ASSERT_EQ(cudaMemcpyAsync(dst, h.data(), h.bytes(), cudaMemcpyHostToDevice, s), cudaSuccess);
}
void Download(TypedBuf* h, const void* src, cudaStream_t s) {
  if (h->bytes())
    ASSERT_EQ(cudaMemcpyAsync(h->data(), src, h->bytes(), cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
}

// One rank's side of every collective the backend implements, each checked
// against host-computed values. Returns the number of operations issued.
class DeviceChecks {
 public:
  // threads: ranks are threads of this process (buffers stream-ordered).
  DeviceChecks(attnComm_t comm, int rank, int n, bool threads)
      : comm_(comm), rank_(rank), n_(n), threads_(threads) {
    EXPECT_EQ(cudaStreamCreate(&s_), cudaSuccess);
  }
  ~DeviceChecks() {
    cudaStreamSynchronize(s_);
    cudaStreamDestroy(s_);
  }
  int ops() const { return ops_; }
  cudaStream_t stream() const { return s_; }

  void AllGather(attnDataType_t t, size_t count, bool inPlace) {
    const size_t esz = attn_test::TypeSize(t);
    TypedBuf send(t, count), out(t, count * n_);
    for (size_t i = 0; i < count; ++i) send.Set(i, Pattern(t, rank_, i));
    out.Fill(Sentinel(t));
    DevBuf dsend(inPlace ? 0 : send.bytes(), Order()), drecv(out.bytes(), Order());
    char* sendPtr = inPlace ? drecv.at(rank_ * count * esz) : dsend.at(0);
    Upload(drecv.get(), out, s_);
    Upload(sendPtr, send, s_);
    Run(attnAllGather(sendPtr, drecv.get(), count, t, comm_, Stream()));
    Download(&out, drecv.get(), s_);
    EXPECT_TRUE(attn_test::BufEquals(out, 0, count * n_, [&](size_t j) { return Pattern(t, j / count, j % count); }))
        << What("AllGather", t, count, inPlace);
  }

  void ReduceScatter(attnDataType_t t, attnRedOp_t op, size_t recvcount, bool inPlace) {
    const size_t esz = attn_test::TypeSize(t), total = recvcount * n_;
    TypedBuf send(t, total), out(t, recvcount);
    for (size_t j = 0; j < total; ++j) send.Set(j, RedInput(op, t, rank_, n_, j));
    out.Fill(Sentinel(t));
    DevBuf dsend(send.bytes(), Order()), drecv(inPlace ? 0 : out.bytes(), Order());
    char* outPtr = inPlace ? dsend.at(rank_ * recvcount * esz) : drecv.at(0);
    Upload(dsend.get(), send, s_);
    if (!inPlace) Upload(outPtr, out, s_);
    Run(attnReduceScatter(dsend.get(), outPtr, recvcount, t, op, comm_, Stream()));
    Download(&out, outPtr, s_);
    EXPECT_TRUE(attn_test::BufEquals(out, 0, recvcount, [&](size_t i) {
      return RedExpected(op, t, n_, rank_ * recvcount + i);
    })) << What("ReduceScatter", t, recvcount, inPlace);
  }

  void AllReduce(attnDataType_t t, attnRedOp_t op, size_t count, bool inPlace) {
    TypedBuf send(t, count), out(t, count);
    for (size_t i = 0; i < count; ++i) send.Set(i, RedInput(op, t, rank_, n_, i));
    out.Fill(Sentinel(t));
    DevBuf dsend(send.bytes(), Order()), drecv(inPlace ? 0 : out.bytes(), Order());
    void* outPtr = inPlace ? dsend.get() : drecv.get();
    Upload(dsend.get(), send, s_);
    if (!inPlace) Upload(outPtr, out, s_);
    Run(attnAllReduce(dsend.get(), outPtr, count, t, op, comm_, Stream()));
    Download(&out, outPtr, s_);
    EXPECT_TRUE(attn_test::BufEquals(out, 0, count, [&](size_t i) { return RedExpected(op, t, n_, i); }))
        << What("AllReduce", t, count, inPlace);
  }

  void Broadcast(attnDataType_t t, size_t count, int root) {
    TypedBuf send(t, count), out(t, count);
    for (size_t i = 0; i < count; ++i) send.Set(i, Pattern(t, root, i));
    out.Fill(Sentinel(t));
    DevBuf dsend(rank_ == root ? send.bytes() : 0, Order()), drecv(out.bytes(), Order());
    if (rank_ == root) Upload(dsend.get(), send, s_);
    Upload(drecv.get(), out, s_);
    Run(attnBroadcast(rank_ == root ? dsend.get() : nullptr, drecv.get(), count, t, root, comm_, Stream()));
    Download(&out, drecv.get(), s_);
    EXPECT_TRUE(attn_test::BufEquals(out, 0, count, [&](size_t i) { return Pattern(t, root, i); }))
        << What("Broadcast", t, count, false);
  }

  // Non-roots pass no receive buffer (out of place) or their sendbuff (in
  // place), which must keep its contents.
  void Reduce(attnDataType_t t, attnRedOp_t op, size_t count, int root, bool inPlace) {
    const bool isRoot = rank_ == root;
    TypedBuf send(t, count), out(t, count);
    for (size_t i = 0; i < count; ++i) send.Set(i, RedInput(op, t, rank_, n_, i));
    out.Fill(Sentinel(t));
    DevBuf dsend(send.bytes(), Order()), drecv(isRoot && !inPlace ? out.bytes() : 0, Order());
    void* outPtr = inPlace ? dsend.get() : isRoot ? drecv.get() : nullptr;
    Upload(dsend.get(), send, s_);
    if (isRoot && !inPlace) Upload(outPtr, out, s_);
    Run(attnReduce(dsend.get(), outPtr, count, t, op, root, comm_, Stream()));
    if (isRoot) {
      Download(&out, outPtr, s_);
      EXPECT_TRUE(attn_test::BufEquals(out, 0, count, [&](size_t i) { return RedExpected(op, t, n_, i); }))
          << What("Reduce", t, count, inPlace);
    } else {
      Download(&send, dsend.get(), s_);
      EXPECT_TRUE(attn_test::BufEquals(send, 0, count, [&](size_t i) { return RedInput(op, t, rank_, n_, i); }))
          << What("Reduce", t, count, inPlace) << ": a non-root's sendbuff changed";
    }
  }

  void AllToAll(attnDataType_t t, size_t count) {
    TypedBuf send(t, count * n_), out(t, count * n_);
    for (int p = 0; p < n_; ++p)
      for (size_t i = 0; i < count; ++i) send.Set(p * count + i, Pattern(t, rank_ * n_ + p, i));
    out.Fill(Sentinel(t));
    DevBuf dsend(send.bytes(), Order()), drecv(out.bytes(), Order());
    Upload(dsend.get(), send, s_);
    Upload(drecv.get(), out, s_);
    Run(attnAllToAll(dsend.get(), drecv.get(), count, t, comm_, Stream()));
    Download(&out, drecv.get(), s_);
    EXPECT_TRUE(attn_test::BufEquals(out, 0, count * n_, [&](size_t j) {
      return Pattern(t, (j / count) * n_ + rank_, j % count);
    })) << What("AllToAll", t, count, false);
  }

  // Uneven counts (some zero), gaps between blocks, receive blocks in
  // reverse peer order; the gaps must keep their contents.
  void AllToAllv(attnDataType_t t, size_t scale) {
    auto countOf = [&](int from, int to) { return size_t((from + 2 * to) % 3) * scale; };
    std::vector<size_t> sc(n_), sd(n_), rc(n_), rd(n_);
    size_t sendEnd = 0, recvEnd = 0;
    for (int p = 0; p < n_; ++p) {
      sc[p] = countOf(rank_, p);
      sd[p] = sendEnd + 1;
      sendEnd = sd[p] + sc[p];
    }
    for (int p = n_ - 1; p >= 0; --p) {
      rc[p] = countOf(p, rank_);
      rd[p] = recvEnd + 2;
      recvEnd = rd[p] + rc[p];
    }
    TypedBuf send(t, sendEnd), out(t, recvEnd);
    send.Fill(Sentinel(t));
    for (int p = 0; p < n_; ++p)
      for (size_t i = 0; i < sc[p]; ++i) send.Set(sd[p] + i, Pattern(t, rank_ * n_ + p, i));
    out.Fill(Sentinel(t));
    DevBuf dsend(send.bytes(), Order()), drecv(out.bytes(), Order());
    Upload(dsend.get(), send, s_);
    Upload(drecv.get(), out, s_);
    Run(attnAllToAllv(dsend.get(), sc.data(), sd.data(), drecv.get(), rc.data(), rd.data(), t, comm_, Stream()));
    Download(&out, drecv.get(), s_);
    EXPECT_TRUE(attn_test::BufEquals(out, 0, recvEnd, [&](size_t j) {
      for (int p = 0; p < n_; ++p)
        if (j >= rd[p] && j < rd[p] + rc[p]) return Pattern(t, p * n_ + rank_, j - rd[p]);
      return Sentinel(t);
    })) << What("AllToAllv", t, scale, false);
  }

  // Everything, with odd sizes so per-rank splits are uneven.
  void All() {
    AllGather(attnFloat32, 1003, false);
    AllGather(attnBfloat16, 257, true);
    ReduceScatter(attnFloat32, attnSum, 517, false);
    ReduceScatter(attnBfloat16, attnAvg, 301, false);
    ReduceScatter(attnInt32, attnMax, 99, true);
    AllReduce(attnFloat32, attnSum, 1001, false);
    AllReduce(attnBfloat16, attnAvg, 1000 + n_, true);
    AllReduce(attnInt64, attnProd, 3, false);  // fewer elements than ranks for n = 4
    Broadcast(attnFloat32, 777, n_ - 1);
    Broadcast(attnInt8, 5, 0);
    Reduce(attnFloat32, attnSum, 1001, n_ - 1, false);
    Reduce(attnBfloat16, attnAvg, 300, 0, true);
    Reduce(attnInt32, attnMin, 2, n_ / 2, false);
    AllToAll(attnFloat32, 129);
    AllToAllv(attnFloat16, 37);
    attnResult_t async;
    ASSERT_EQ(attnCommGetAsyncError(comm_, &async), attnSuccess);
    EXPECT_EQ(async, attnSuccess) << attnGetLastError(comm_);
  }

  void Run(attnResult_t r) {
    ++ops_;
    ASSERT_EQ(r, attnSuccess) << attnGetLastError(comm_);
  }

 private:
  attnStream_t Stream() const { return reinterpret_cast<attnStream_t>(s_); }
  std::string What(const char* coll, attnDataType_t t, size_t count, bool inPlace) const {
    return std::string(coll) + "(" + attn_test::TypeName(t) + ", count " + std::to_string(count) +
           (inPlace ? ", in place" : "") + ") on rank " + std::to_string(rank_) + "/" + std::to_string(n_);
  }

  cudaStream_t Order() const { return threads_ ? s_ : nullptr; }

  attnComm_t comm_;
  int rank_, n_;
  bool threads_;
  cudaStream_t s_ = nullptr;
  int ops_ = 0;
};

constexpr int kOpsPerRank = 15;  // DeviceChecks::All

TEST(CudaIpc, ThreadsSharingGpu0) {
  REQUIRE_GPU();
  for (int n : {2, 3, 4}) {
    const uint64_t ops0 = Count(Counters().ops), staged0 = Count(Counters().stagedOps);
    const uint64_t opens0 = Count(Counters().opens);
    attnConfig_t cfg;
    attn_test::RunThreads(n, [](int rank, int nranks, attnComm_t& comm) {
      DeviceChecks c(comm, rank, nranks, /*threads=*/true);
      c.All();
      EXPECT_EQ(c.ops(), kOpsPerRank);
    }, OnGpu0(&cfg));
    EXPECT_EQ(Count(Counters().ops) - ops0, uint64_t(n * kOpsPerRank)) << n << " ranks";
    EXPECT_EQ(Count(Counters().stagedOps) - staged0, 0u) << n << " ranks";
    EXPECT_EQ(Count(Counters().opens) - opens0, 0u) << "ranks of one process use addresses, not handles";
  }
}

TEST(CudaIpc, ProcessesSharingGpu0) {
  REQUIRE_FORKABLE_CUDA();
  for (int n : {2, 4}) {
    attnConfig_t cfg;
    attn_test::RunProcesses(n, [](int rank, int nranks, attnComm_t& comm) {
      DeviceChecks c(comm, rank, nranks, /*threads=*/false);
      c.All();
      // Each child counts only its own operations.
      EXPECT_EQ(Count(Counters().ops), uint64_t(kOpsPerRank));
      EXPECT_EQ(Count(Counters().stagedOps), 0u);
      EXPECT_GT(Count(Counters().opens), 0u);
      EXPECT_GT(Count(Counters().exports), 0u);
    }, OnGpu0(&cfg));
  }
}

// The same buffers again: no handle is exported or opened a second time.
TEST(CudaIpc, RepeatedCallsHitTheHandleCache) {
  REQUIRE_FORKABLE_CUDA();
  attnConfig_t cfg;
  attn_test::RunProcesses(3, [](int rank, int n, attnComm_t& comm) {
    DeviceChecks c(comm, rank, n, /*threads=*/false);
    const size_t count = 4096;
    DevBuf send(count * 4), recv(count * 4 * n);
    auto gather = [&] {
      c.Run(attnAllGather(send.get(), recv.get(), count, attnFloat32, comm,
                          reinterpret_cast<attnStream_t>(c.stream())));
      ASSERT_EQ(cudaStreamSynchronize(c.stream()), cudaSuccess);
    };
    gather();
    const uint64_t opens = Count(Counters().opens), exports = Count(Counters().exports);
    const uint64_t hits = Count(Counters().openHits), exportHits = Count(Counters().exportHits);
    EXPECT_EQ(opens, uint64_t(n - 1));
    for (int i = 0; i < 5; ++i) gather();
    EXPECT_EQ(Count(Counters().opens), opens);
    EXPECT_EQ(Count(Counters().exports), exports);
    EXPECT_EQ(Count(Counters().openHits) - hits, uint64_t(5 * (n - 1)));
    EXPECT_EQ(Count(Counters().exportHits) - exportHits, 5u);
    // A new buffer is a new handle, even where the old one was freed.
    DevBuf other(count * 4);
    c.Run(attnAllGather(other.get(), recv.get(), count, attnFloat32, comm,
                        reinterpret_cast<attnStream_t>(c.stream())));
    ASSERT_EQ(cudaStreamSynchronize(c.stream()), cudaSuccess);
    EXPECT_EQ(Count(Counters().opens), opens + uint64_t(n - 1));
  }, OnGpu0(&cfg));
}

// ATTN_CUDA_IPC_CACHE=0: mappings are closed after every operation.
TEST(CudaIpc, CacheOffClosesAfterEachOperation) {
  REQUIRE_FORKABLE_CUDA();
  attnConfig_t cfg;
  RunOptions o = OnGpu0(&cfg);
  o.env = {{"ATTN_CUDA_IPC_CACHE", "0"}};
  attn_test::RunProcesses(2, [](int rank, int n, attnComm_t& comm) {
    DeviceChecks c(comm, rank, n, /*threads=*/false);
    c.AllGather(attnFloat32, 100, false);
    c.AllGather(attnFloat32, 100, false);
    EXPECT_EQ(Count(Counters().opens), 2u);
    EXPECT_EQ(Count(Counters().closes), 2u);
  }, o);
}

// One rank passes pinned host memory: every rank sees it in the descriptors
// and the operation runs staged everywhere, with the right result.
TEST(CudaIpc, HostMemoryOnOneRankRunsStagedEverywhere) {
  REQUIRE_GPU();
  const uint64_t ops0 = Count(Counters().ops), staged0 = Count(Counters().stagedOps);
  attnConfig_t cfg;
  attn_test::RunThreads(2, [](int rank, int n, attnComm_t& comm) {
    DeviceChecks c(comm, rank, n, /*threads=*/true);
    const size_t count = 333;
    TypedBuf host(attnFloat32, count), out(attnFloat32, count * n);
    for (size_t i = 0; i < count; ++i) host.Set(i, Pattern(attnFloat32, rank, i));
    void* send = nullptr;
    if (rank == 0) {
      ASSERT_EQ(cudaMallocHost(&send, host.bytes()), cudaSuccess);
      std::memcpy(send, host.data(), host.bytes());
    } else {
      ASSERT_EQ(cudaMalloc(&send, host.bytes()), cudaSuccess);
      Upload(send, host, c.stream());
    }
    DevBuf recv(out.bytes());
    c.Run(attnAllGather(send, recv.get(), count, attnFloat32, comm, reinterpret_cast<attnStream_t>(c.stream())));
    Download(&out, recv.get(), c.stream());
    EXPECT_TRUE(attn_test::BufEquals(out, 0, count * n, [&](size_t j) {
      return Pattern(attnFloat32, j / count, j % count);
    }));
    if (rank == 0) cudaFreeHost(send);
    else cudaFree(send);
  }, OnGpu0(&cfg));
  EXPECT_EQ(Count(Counters().ops) - ops0, 0u);
  EXPECT_EQ(Count(Counters().stagedOps) - staged0, 2u);
}

// ATTN_TRANSPORT without cuda_ipc: the staging backend serves everything.
TEST(CudaIpc, TransportListWithoutCudaIpcStages) {
  REQUIRE_GPU();
  const uint64_t ops0 = Count(Counters().ops), staged0 = Count(Counters().stagedOps);
  attnConfig_t cfg;
  RunOptions o = OnGpu0(&cfg);
  o.env = {{"ATTN_TRANSPORT", "shm,tcp"}};
  attn_test::RunThreads(2, [](int rank, int n, attnComm_t& comm) {
    DeviceChecks c(comm, rank, n, /*threads=*/true);
    c.AllReduce(attnFloat32, attnSum, 1001, false);
    c.AllToAll(attnFloat32, 64);
  }, o);
  EXPECT_EQ(Count(Counters().ops) - ops0, 0u);
  EXPECT_EQ(Count(Counters().stagedOps) - staged0, 4u);
}

// ---- grouped sends and receives (ipc_p2p) ------------------------------------

enum class Mem { kDevice, kPool, kPinned };

void* Alloc(Mem m, size_t bytes, cudaStream_t s) {
  void* p = nullptr;
  if (m == Mem::kDevice) EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
  if (m == Mem::kPool) EXPECT_EQ(cudaMallocAsync(&p, bytes, s), cudaSuccess);
  if (m == Mem::kPinned) EXPECT_EQ(cudaMallocHost(&p, bytes), cudaSuccess);
  return p;
}

void Free(Mem m, void* p, cudaStream_t s) {
  if (m == Mem::kDevice) cudaFree(p);
  if (m == Mem::kPool) cudaFreeAsync(p, s);
  if (m == Mem::kPinned) {
    cudaStreamSynchronize(s);
    cudaFreeHost(p);
  }
}

// One group in which every rank sends a block of its own size to every rank,
// itself included, each pair in a different order; checks what arrived.
void AllPairsGroup(attnComm_t comm, int rank, int n, Mem sendMem, Mem recvMem) {
  const attnDataType_t t = attnFloat32;
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  auto countOf = [](int from, int to) { return size_t(1000 + 7 * from + 3 * to); };
  std::vector<size_t> soff(n + 1, 0), roff(n + 1, 0);
  for (int p = 0; p < n; ++p) {
    soff[p + 1] = soff[p] + countOf(rank, p);
    roff[p + 1] = roff[p] + countOf(p, rank);
  }
  TypedBuf send(t, soff[n]), out(t, roff[n]);
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < countOf(rank, p); ++i) send.Set(soff[p] + i, Pattern(t, rank * n + p, i));
  out.Fill(Sentinel(t));
  char* dsend = static_cast<char*>(Alloc(sendMem, send.bytes(), s));
  char* drecv = static_cast<char*>(Alloc(recvMem, out.bytes(), s));
  ASSERT_EQ(cudaMemcpyAsync(dsend, send.data(), send.bytes(), cudaMemcpyDefault, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(drecv, out.data(), out.bytes(), cudaMemcpyDefault, s), cudaSuccess);
  const attnStream_t as = reinterpret_cast<attnStream_t>(s);
  ASSERT_EQ(attnGroupStart(), attnSuccess);
  for (int k = 0; k < n; ++k) {
    const int p = (rank + k) % n;
    ASSERT_EQ(attnSend(dsend + soff[p] * 4, countOf(rank, p), t, p, comm, as), attnSuccess);
    ASSERT_EQ(attnRecv(drecv + roff[p] * 4, countOf(p, rank), t, p, comm, as), attnSuccess);
  }
  ASSERT_EQ(attnGroupEnd(), attnSuccess) << attnGetLastError(comm);
  Download(&out, drecv, s);
  EXPECT_TRUE(attn_test::BufEquals(out, 0, roff[n], [&](size_t j) {
    int p = 0;
    while (j >= roff[p + 1]) ++p;
    return Pattern(t, p * n + rank, j - roff[p]);
  })) << "rank " << rank << " of " << n;
  attnResult_t async = attnInternalError;
  ASSERT_EQ(attnCommGetAsyncError(comm, &async), attnSuccess);
  EXPECT_EQ(async, attnSuccess) << attnGetLastError(comm);
  Free(sendMem, dsend, s);
  Free(recvMem, drecv, s);
  cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
}

struct P2pCounts {
  uint64_t groups, pulls, viaHost;
  static P2pCounts now() {
    return {Count(Counters().p2pGroups), Count(Counters().p2pPulls), Count(Counters().p2pViaHost)};
  }
  P2pCounts since(const P2pCounts& a) const { return {groups - a.groups, pulls - a.pulls, viaHost - a.viaHost}; }
};

// Ranks of one process read each other's buffers by address, stream-ordered
// pool memory included.
TEST(CudaIpc, GroupedSendRecvPullsBetweenThreads) {
  REQUIRE_GPU();
  for (int n : {2, 3}) {
    const P2pCounts before = P2pCounts::now();
    attnConfig_t cfg;
    attn_test::RunThreads(n, [](int rank, int nranks, attnComm_t& comm) {
      AllPairsGroup(comm, rank, nranks, Mem::kPool, Mem::kPool);
    }, OnGpu0(&cfg));
    const P2pCounts d = P2pCounts::now().since(before);
    EXPECT_EQ(d.groups, uint64_t(n));
    EXPECT_EQ(d.pulls, uint64_t(n * (n - 1))) << "every receive from a peer is a pull";
    EXPECT_EQ(d.viaHost, 0u);
  }
}

TEST(CudaIpc, GroupedSendRecvPullsBetweenProcesses) {
  REQUIRE_FORKABLE_CUDA();
  attnConfig_t cfg;
  attn_test::RunProcesses(3, [](int rank, int n, attnComm_t& comm) {
    AllPairsGroup(comm, rank, n, Mem::kDevice, Mem::kDevice);
    AllPairsGroup(comm, rank, n, Mem::kDevice, Mem::kPinned);
    EXPECT_EQ(Count(Counters().p2pPulls), uint64_t(2 * (n - 1)));
    EXPECT_EQ(Count(Counters().p2pViaHost), 0u);
    EXPECT_GT(Count(Counters().opens), 0u);
  }, OnGpu0(&cfg));
}

// Pool memory cannot be exported to another process, and pinned host memory
// is not a device buffer: those pairs go through host memory, right all the
// same.
TEST(CudaIpc, GroupedSendRecvOfUnexportableBuffersGoesThroughHost) {
  REQUIRE_FORKABLE_CUDA();
  attnConfig_t cfg;
  attn_test::RunProcesses(2, [](int rank, int n, attnComm_t& comm) {
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
    AllPairsGroup(comm, rank, n, Mem::kPool, Mem::kDevice);
    AllPairsGroup(comm, rank, n, Mem::kPinned, Mem::kPool);
    EXPECT_EQ(Count(Counters().p2pPulls), 0u);
    EXPECT_EQ(Count(Counters().p2pViaHost), 4u) << "a send and a receive per group";
    cudaStreamDestroy(s);
  }, OnGpu0(&cfg));
}

// Ranks 0 and 1 on one emulated host, rank 2 on another: the pair on one
// host pulls, the pairs across hosts go through host memory and TCP.
TEST(CudaIpc, GroupedSendRecvAcrossHostsGoesThroughHost) {
  REQUIRE_FORKABLE_CUDA();
  attnConfig_t cfg;
  RunOptions o = OnGpu0(&cfg);
  o.child_setup = [](int rank) { setenv("ATTN_HOSTID", rank < 2 ? "p2p-host-a" : "p2p-host-b", 1); };
  attn_test::RunProcesses(3, [](int rank, int n, attnComm_t& comm) {
    AllPairsGroup(comm, rank, n, Mem::kDevice, Mem::kDevice);
    EXPECT_EQ(Count(Counters().p2pPulls), rank < 2 ? 1u : 0u);
    EXPECT_EQ(Count(Counters().p2pViaHost), rank < 2 ? 2u : 4u);
  }, o);
}

// ATTN_TRANSPORT without cuda_ipc: nothing is pulled.
TEST(CudaIpc, GroupedSendRecvWithoutCudaIpcGoesThroughHost) {
  REQUIRE_GPU();
  const P2pCounts before = P2pCounts::now();
  attnConfig_t cfg;
  RunOptions o = OnGpu0(&cfg);
  o.env = {{"ATTN_TRANSPORT", "shm,tcp"}};
  attn_test::RunThreads(2, [](int rank, int n, attnComm_t& comm) {
    AllPairsGroup(comm, rank, n, Mem::kPool, Mem::kPool);
  }, o);
  const P2pCounts d = P2pCounts::now().since(before);
  EXPECT_EQ(d.pulls, 0u);
  EXPECT_EQ(d.viaHost, 4u);
}

// A send larger than its receive fails on both ranks, reported through the
// async error, and the communicator still works afterwards.
TEST(CudaIpc, GroupedSendLargerThanItsReceiveFailsBothRanks) {
  REQUIRE_GPU();
  attnConfig_t cfg;
  attn_test::RunThreads(2, [](int rank, int n, attnComm_t& comm) {
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    void* buf = nullptr;
    ASSERT_EQ(cudaMallocAsync(&buf, 4096, s), cudaSuccess);
    const attnStream_t as = reinterpret_cast<attnStream_t>(s);
    ASSERT_EQ(attnGroupStart(), attnSuccess);
    if (rank == 0) ASSERT_EQ(attnSend(buf, 200, attnFloat32, 1, comm, as), attnSuccess);
    else ASSERT_EQ(attnRecv(buf, 100, attnFloat32, 0, comm, as), attnSuccess);
    ASSERT_EQ(attnGroupEnd(), attnSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    attnResult_t async = attnSuccess;
    ASSERT_EQ(attnCommGetAsyncError(comm, &async), attnSuccess);
    EXPECT_EQ(async, rank == 0 ? attnRemoteError : attnInvalidUsage);
    EXPECT_NE(std::string(attnGetLastError(comm)).find(rank == 0 ? "rank 1" : "400 bytes"), std::string::npos)
        << attnGetLastError(comm);
    cudaFreeAsync(buf, s);
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }, OnGpu0(&cfg));
}
#endif  // ATTN_HAVE_CUDA

}  // namespace
