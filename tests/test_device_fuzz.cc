// Random sequences of collectives and grouped sends/receives on device
// communicators: every type and reduction op, random counts (zero to past
// the staging slice), in place and not, random roots, all-to-allv with gaps,
// groups of messages in a random order (self included) spread over two
// streams, and calls alternating between two streams; a third of the
// collectives are captured into a CUDA graph and run by launching it. Each result is
// downloaded and compared with host-computed values, guard zones included.
// Run over each backend a device communicator has: CUDA IPC between threads
// and between processes, pinned staging (sliced) without it, and staging
// across emulated hosts. Seeds are fixed; ATTN_FUZZ_SEEDS / ATTN_FUZZ_ITERS
// widen them. Without a GPU every test skips.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "attncomm.h"
#include "support/device_checks.h"
#include "support/gpu.h"
#include "support/multirank.h"
#include "src/device/backends/cuda_ipc/ipc_stats.h"

namespace {

using attn_test::AsStream;
using attn_test::DevBuf;
using attn_test::DevEquals;
using attn_test::DevInOut;
using attn_test::Pattern;
using attn_test::RedExpected;
using attn_test::RedInput;
using attn_test::RunOptions;
using attn_test::Sentinel;
using attn_test::TypedBuf;

// The same sequence on every rank: a small deterministic generator.
struct Rng {
  uint64_t s;
  uint64_t next() {
    s += 0x9E3779B97F4A7C15ull;
    uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  int below(int n) { return static_cast<int>(next() % static_cast<uint64_t>(n)); }
  bool chance(double p) { return (next() >> 11) * 0x1.0p-53 < p; }
};

enum class Kind { kAllGather, kReduceScatter, kAllReduce, kBroadcast, kAllToAll, kAllToAllv, kGroup, kBarrier, kReduce };
const char* KindName(Kind k) {
  static const char* names[] = {"all-gather", "reduce-scatter", "all-reduce", "broadcast", "all-to-all",
                                "all-to-allv", "group",          "barrier",    "reduce"};
  return names[static_cast<int>(k)];
}

struct Message {
  int src, dst;
  size_t count;
  attnDataType_t type;
  int stream;  // which of the two streams each end posts it on
};

struct Call {
  Kind kind;
  attnDataType_t type;
  attnRedOp_t op;
  size_t count;
  int root;
  bool inPlace;
  int stream;
  uint64_t salt;
  std::vector<std::vector<size_t>> a2av;  // [from][to] counts
  std::vector<Message> msgs;
  std::vector<std::vector<int>> order;  // per rank: the message ends it posts, in order (+i send, -i-1 recv)
  bool graph;  // captured into a CUDA graph, then launched
};

// Counts from empty to past a 4 KiB staging slice of any type.
size_t PickCount(Rng& g, bool large) {
  const int x = g.below(20);
  if (x < 2) return 0;
  if (x < 4) return 1;
  if (x < 14 || !large) return 2 + g.below(300);
  return 1000 + g.below(20000);
}

Call MakeCall(Rng& g, int n) {
  static const Kind kinds[] = {Kind::kAllGather, Kind::kAllGather,   Kind::kReduceScatter, Kind::kReduceScatter,
                               Kind::kAllReduce, Kind::kAllReduce,   Kind::kBroadcast,     Kind::kAllToAll,
                               Kind::kAllToAllv, Kind::kGroup,       Kind::kGroup,         Kind::kBarrier,
                               Kind::kReduce};
  static const attnDataType_t types[] = {attnInt8,    attnUint8,   attnInt32,   attnInt64,
                                         attnFloat16, attnFloat32, attnFloat64, attnBfloat16};
  static const attnRedOp_t ops[] = {attnSum, attnProd, attnMax, attnMin, attnAvg};
  Call c;
  c.kind = kinds[g.below(13)];
  c.type = types[g.below(8)];
  c.op = ops[g.below(5)];
  c.count = PickCount(g, true);
  c.root = g.below(n);
  c.inPlace = g.chance(0.35);
  c.stream = g.below(2);
  c.salt = g.next() % 1000;
  // From the salt, so that the seeds' sequences stay what they were.
  c.graph = c.salt % 3 == 0 && c.kind != Kind::kGroup && c.kind != Kind::kAllToAllv;
  if (c.kind == Kind::kAllToAllv) {
    c.a2av.assign(n, std::vector<size_t>(n));
    for (auto& row : c.a2av)
      for (auto& x : row) x = PickCount(g, g.chance(0.2));
  }
  if (c.kind == Kind::kGroup) {
    const int m = 1 + g.below(2 * n);
    for (int i = 0; i < m; ++i)
      c.msgs.push_back({g.below(n), g.below(n), PickCount(g, g.chance(0.2)), types[g.below(8)], g.below(2)});
    // Each rank posts its ends in a random interleaving that keeps the
    // order of the messages between each pair (they match in order).
    c.order.resize(n);
    for (int r = 0; r < n; ++r) {
      std::vector<std::vector<int>> queues;  // one per (direction, peer)
      std::vector<std::pair<int, int>> keys;
      for (int i = 0; i < m; ++i) {
        const Message& msg = c.msgs[i];
        for (int dir = 0; dir < 2; ++dir) {
          if ((dir == 0 ? msg.src : msg.dst) != r) continue;
          const std::pair<int, int> key{dir, dir == 0 ? msg.dst : msg.src};
          size_t q = 0;
          while (q < keys.size() && keys[q] != key) ++q;
          if (q == keys.size()) {
            keys.push_back(key);
            queues.emplace_back();
          }
          queues[q].push_back(dir == 0 ? i : -i - 1);
        }
      }
      while (!queues.empty()) {
        const int q = g.below(static_cast<int>(queues.size()));
        c.order[r].push_back(queues[q].front());
        queues[q].erase(queues[q].begin());
        if (queues[q].empty()) {
          queues.erase(queues.begin() + q);
          keys.erase(keys.begin() + q);
        }
      }
    }
  }
  return c;
}

bool Approximate(const Call& c) {
  return c.op == attnAvg || c.type == attnFloat16 || c.type == attnBfloat16;
}

// Issues one operation on a stream: directly, or captured into a CUDA
// graph that is then launched once, as an engine's captured step would be.
// The graph goes once the stream has run it.
class Issuer {
 public:
  Issuer(bool graph, cudaStream_t s) : graph_(graph), s_(s) {}
  ~Issuer() {
    if (!exec_) return;
    EXPECT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
    EXPECT_EQ(cudaGraphExecDestroy(exec_), cudaSuccess);
  }
  template <class F>
  attnResult_t operator()(F call) {
    if (!graph_) return call();
    if (cudaStreamBeginCapture(s_, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return attnUnhandledCudaError;
    const attnResult_t r = call();
    cudaGraph_t g = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(s_, &g);
    if (r == attnSuccess && ended == cudaSuccess && cudaGraphInstantiate(&exec_, g, 0) == cudaSuccess &&
        cudaGraphLaunch(exec_, s_) == cudaSuccess) {
      cudaGraphDestroy(g);
      return attnSuccess;
    }
    if (g) cudaGraphDestroy(g);
    return r != attnSuccess ? r : attnUnhandledCudaError;
  }

 private:
  bool graph_;
  cudaStream_t s_;
  cudaGraphExec_t exec_ = nullptr;
};

// Runs call c on this rank and checks its result; `what` names it.
void RunCall(attnComm_t comm, int rank, int n, const Call& c, cudaStream_t* streams, const std::string& what) {
  SCOPED_TRACE(what);
  cudaStream_t s = streams[c.stream];
  Issuer issue(c.graph, s);  // before the buffers, so it goes after them
  const attnDataType_t t = c.type;
  const size_t cnt = c.count, esz = attn_test::TypeSize(t);
  const uint64_t salt = c.salt;
  auto pat = [&](int who, size_t i) { return Pattern(t, int(salt * 64 + who), i); };
  auto red = [&](int who, size_t i) { return RedInput(c.op, t, who, n, i + salt); };
  switch (c.kind) {
    case Kind::kAllGather: {
      TypedBuf in(t, cnt), out(t, cnt * n);
      for (size_t i = 0; i < cnt; ++i) in.Set(i, pat(rank, i));
      out.Fill(Sentinel(t));
      if (c.inPlace)
        for (size_t i = 0; i < cnt; ++i) out.Set(rank * cnt + i, pat(rank, i));
      DevBuf din(in, s), dout(out, s);
      ASSERT_TRUE(din.ok() && dout.ok());
      din.Upload(in, s);
      dout.Upload(out, s);
      const void* send = c.inPlace ? static_cast<char*>(dout.data()) + rank * cnt * esz : din.data();
      ASSERT_EQ(issue([&] { return attnAllGather(send, dout.data(), cnt, t, comm, AsStream(s)); }), attnSuccess) << attnGetLastError(comm);
      dout.Download(&out, s);
      EXPECT_TRUE(attn_test::BufEquals(out, 0, cnt * n, [&](size_t i) { return pat(int(i / cnt), i % cnt); }));
      break;
    }
    case Kind::kReduceScatter: {
      DevInOut b(t, cnt * n, cnt, [&](size_t i) { return red(rank, i); }, s);
      ASSERT_TRUE(b.ok());
      TypedBuf &in = b.in, &out = b.out;
      DevBuf &din = b.din, &dout = b.dout;
      void* recv = c.inPlace ? static_cast<char*>(din.data()) + rank * cnt * esz : dout.data();
      ASSERT_EQ(issue([&] { return attnReduceScatter(din.data(), recv, cnt, t, c.op, comm, AsStream(s)); }), attnSuccess)
          << attnGetLastError(comm);
      TypedBuf& got = c.inPlace ? in : out;
      (c.inPlace ? din : dout).Download(&got, s);
      const size_t at = c.inPlace ? rank * cnt : 0;
      EXPECT_TRUE(DevEquals(got, at, cnt, [&](size_t i) { return RedExpected(c.op, t, n, rank * cnt + i - at + salt); },
                            Approximate(c)));
      if (c.inPlace)  // the other ranks' blocks of the input are the caller's; only checked to be readable
        EXPECT_TRUE(got.GuardsIntact());
      break;
    }
    case Kind::kAllReduce: {
      DevInOut b(t, cnt, cnt, [&](size_t i) { return red(rank, i); }, s);
      ASSERT_TRUE(b.ok());
      TypedBuf &in = b.in, &out = b.out;
      DevBuf &din = b.din, &dout = b.dout;
      void* recv = c.inPlace ? din.data() : dout.data();
      ASSERT_EQ(issue([&] { return attnAllReduce(din.data(), recv, cnt, t, c.op, comm, AsStream(s)); }), attnSuccess)
          << attnGetLastError(comm);
      TypedBuf& got = c.inPlace ? in : out;
      (c.inPlace ? din : dout).Download(&got, s);
      EXPECT_TRUE(DevEquals(got, 0, cnt, [&](size_t i) { return RedExpected(c.op, t, n, i + salt); }, Approximate(c)));
      break;
    }
    case Kind::kBroadcast: {
      TypedBuf in(t, cnt), out(t, cnt);
      for (size_t i = 0; i < cnt; ++i) in.Set(i, pat(c.root, i));
      out.Fill(Sentinel(t));
      const bool inPlace = c.inPlace && rank == c.root;
      if (inPlace) out = in;
      DevBuf din(in, s), dout(out, s);
      ASSERT_TRUE(din.ok() && dout.ok());
      din.Upload(in, s);
      dout.Upload(out, s);
      const void* send = rank != c.root ? nullptr : inPlace ? dout.data() : din.data();
      ASSERT_EQ(issue([&] { return attnBroadcast(send, dout.data(), cnt, t, c.root, comm, AsStream(s)); }), attnSuccess)
          << attnGetLastError(comm);
      dout.Download(&out, s);
      EXPECT_TRUE(attn_test::BufEquals(out, 0, cnt, [&](size_t i) { return pat(c.root, i); }));
      break;
    }
    case Kind::kReduce: {
      // In place, every rank passes sendbuff as recvbuff: only the root's changes.
      DevInOut b(t, cnt, cnt, [&](size_t i) { return red(rank, i); }, s);
      ASSERT_TRUE(b.ok());
      TypedBuf &in = b.in, &out = b.out;
      DevBuf &din = b.din, &dout = b.dout;
      const bool isRoot = rank == c.root;
      void* recv = c.inPlace ? din.data() : isRoot ? dout.data() : nullptr;
      ASSERT_EQ(issue([&] { return attnReduce(din.data(), recv, cnt, t, c.op, c.root, comm, AsStream(s)); }), attnSuccess)
          << attnGetLastError(comm);
      din.Download(&in, s);
      dout.Download(&out, s);
      if (isRoot)
        EXPECT_TRUE(DevEquals(c.inPlace ? in : out, 0, cnt, [&](size_t i) { return RedExpected(c.op, t, n, i + salt); },
                              Approximate(c)));
      else
        EXPECT_TRUE(attn_test::BufEquals(in, 0, cnt, [&](size_t i) { return red(rank, i); }))
            << "a non-root's sendbuff changed";
      if (!isRoot || c.inPlace)
        EXPECT_TRUE(attn_test::BufEquals(out, 0, cnt, [&](size_t) { return Sentinel(t); }));
      break;
    }
    case Kind::kAllToAll: {
      DevInOut b(t, cnt * n, cnt * n, [&](size_t j) { return pat(rank * 16 + int(j / cnt), j % cnt); }, s);
      ASSERT_TRUE(b.ok());
      TypedBuf& out = b.out;
      DevBuf &din = b.din, &dout = b.dout;
      ASSERT_EQ(issue([&] { return attnAllToAll(din.data(), dout.data(), cnt, t, comm, AsStream(s)); }), attnSuccess)
          << attnGetLastError(comm);
      dout.Download(&out, s);
      EXPECT_TRUE(attn_test::BufEquals(out, 0, cnt * n,
                                       [&](size_t i) { return pat(int(i / cnt) * 16 + rank, i % cnt); }));
      break;
    }
    case Kind::kAllToAllv: {
      // Blocks in peer order with a gap of (peer % 3) elements before each.
      std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
      size_t sendTotal = 0, recvTotal = 0;
      for (int p = 0; p < n; ++p) {
        sc[p] = c.a2av[rank][p];
        sd[p] = sendTotal + p % 3;
        sendTotal = sd[p] + sc[p];
        rc[p] = c.a2av[p][rank];
        rd[p] = recvTotal + (p + 1) % 3;
        recvTotal = rd[p] + rc[p];
      }
      attn_test::RunDevAllToAllv(comm, rank, n, t, s, sc, sd, rc, rd,
                                 [&](int from, int to, size_t i) { return pat(from * 16 + to, i); });
      break;
    }
    case Kind::kGroup: {
      // Buffers are made (on stream 0) and filled before the group; both
      // streams are synchronised so either may use them.
      std::vector<std::unique_ptr<TypedBuf>> host(c.msgs.size());
      std::vector<std::unique_ptr<DevBuf>> dev(c.msgs.size());
      std::vector<int> mine;
      for (int e : c.order[rank]) mine.push_back(e);
      for (int e : mine) {
        const int i = e >= 0 ? e : -e - 1;
        const Message& m = c.msgs[i];
        auto& h = host[i];
        if (!h) {
          h = std::make_unique<TypedBuf>(m.type, m.count);
          h->Fill(Sentinel(m.type));
        }
        if (e >= 0)
          for (size_t k = 0; k < m.count; ++k) h->Set(k, Pattern(m.type, int(salt * 64 + i), k));
      }
      // A self message has one buffer for both ends: give its receive its own.
      std::vector<std::unique_ptr<TypedBuf>> selfRecv(c.msgs.size());
      std::vector<std::unique_ptr<DevBuf>> selfRecvDev(c.msgs.size());
      for (size_t i = 0; i < c.msgs.size(); ++i) {
        if (!host[i]) continue;
        dev[i] = std::make_unique<DevBuf>(*host[i], streams[0]);
        ASSERT_TRUE(dev[i]->ok());
        dev[i]->Upload(*host[i], streams[0]);
        if (c.msgs[i].src == rank && c.msgs[i].dst == rank) {
          selfRecv[i] = std::make_unique<TypedBuf>(c.msgs[i].type, c.msgs[i].count);
          selfRecv[i]->Fill(Sentinel(c.msgs[i].type));
          selfRecvDev[i] = std::make_unique<DevBuf>(*selfRecv[i], streams[0]);
          ASSERT_TRUE(selfRecvDev[i]->ok());
          selfRecvDev[i]->Upload(*selfRecv[i], streams[0]);
        }
      }
      ASSERT_EQ(cudaStreamSynchronize(streams[0]), cudaSuccess);
      ASSERT_EQ(attnGroupStart(), attnSuccess);
      for (int e : mine) {
        const int i = e >= 0 ? e : -e - 1;
        const Message& m = c.msgs[i];
        cudaStream_t ms = streams[m.stream];
        attnResult_t r;
        if (e >= 0) {
          r = attnSend(dev[i]->data(), m.count, m.type, m.dst, comm, AsStream(ms));
        } else {
          void* buf = selfRecvDev[i] ? selfRecvDev[i]->data() : dev[i]->data();
          r = attnRecv(buf, m.count, m.type, m.src, comm, AsStream(ms));
        }
        ASSERT_EQ(r, attnSuccess) << attnGetLastError(comm);
      }
      ASSERT_EQ(attnGroupEnd(), attnSuccess) << attnGetLastError(comm);
      ASSERT_EQ(cudaStreamSynchronize(streams[0]), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(streams[1]), cudaSuccess);
      for (int e : mine) {
        if (e >= 0) continue;
        const int i = -e - 1;
        const Message& m = c.msgs[i];
        TypedBuf& got = selfRecv[i] ? *selfRecv[i] : *host[i];
        (selfRecvDev[i] ? *selfRecvDev[i] : *dev[i]).Download(&got, streams[1]);
        EXPECT_TRUE(attn_test::BufEquals(got, 0, m.count,
                                         [&](size_t k) { return Pattern(m.type, int(salt * 64 + i), k); }))
            << "message " << i << " from rank " << m.src;
      }
      break;
    }
    case Kind::kBarrier:
      ASSERT_EQ(issue([&] { return attnBarrier(comm, AsStream(s)); }), attnSuccess) << attnGetLastError(comm);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      break;
  }
}

std::vector<uint64_t> Seeds() {
  std::vector<uint64_t> seeds;
  const char* env = std::getenv("ATTN_FUZZ_SEEDS");
  std::stringstream in(env ? env : "1,2");
  for (std::string x; std::getline(in, x, ',');) seeds.push_back(std::stoull(x));
  return seeds;
}

int Iters() {
  const char* env = std::getenv("ATTN_FUZZ_ITERS");
  return env ? std::atoi(env) : 40;
}

void RunSequence(int rank, int n, attnComm_t comm, uint64_t seed) {
  cudaStream_t streams[2];
  ASSERT_EQ(cudaStreamCreateWithFlags(&streams[0], cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&streams[1], cudaStreamNonBlocking), cudaSuccess);
  Rng g{seed * 7919 + static_cast<uint64_t>(n)};
  const int iters = Iters();
  for (int it = 0; it < iters && !::testing::Test::HasFatalFailure(); ++it) {
    const Call c = MakeCall(g, n);
    const std::string what = "seed " + std::to_string(seed) + ", " + std::to_string(n) + " ranks, call " +
                             std::to_string(it) + " (" + KindName(c.kind) + ", " + attn_test::TypeName(c.type) +
                             ", count " + std::to_string(c.count) + (c.inPlace ? ", in place" : "") +
                             ", stream " + std::to_string(c.stream) + (c.graph ? ", in a graph" : "") + "), rank " +
                             std::to_string(rank);
    RunCall(comm, rank, n, c, streams, what);
  }
  attnResult_t async = attnInternalError;
  EXPECT_EQ(attnCommGetAsyncError(comm, &async), attnSuccess);
  EXPECT_EQ(async, attnSuccess) << attnGetLastError(comm);
  cudaStreamDestroy(streams[0]);
  cudaStreamDestroy(streams[1]);
}

RunOptions OnGpu0(attnConfig_t* cfg, std::vector<std::pair<std::string, std::string>> env) {
  *cfg = ATTN_CONFIG_INITIALIZER;
  cfg->device = 0;
  cfg->timeout_ms = 60000;
  RunOptions o;
  o.config = cfg;
  o.env = std::move(env);
  o.deadline_ms = 240000;
  return o;
}

// The counters show the backend named in each test ran.
uint64_t IpcOps() { return attn::ipc::ipcCounters().ops.load(); }

TEST(DeviceFuzz, RandomCollectivesAndGroupsOverCudaIpcBetweenThreads) {
  REQUIRE_GPU();
  for (uint64_t seed : Seeds())
    for (int n : {2, 3}) {
      attnConfig_t cfg;
      const uint64_t ipcOps = IpcOps();
      attn_test::RunThreads(n, [&](int rank, int nranks, attnComm_t& comm) { RunSequence(rank, nranks, comm, seed); },
                            OnGpu0(&cfg, {}));
      EXPECT_GT(IpcOps(), ipcOps) << "seed " << seed << ": no collective went GPU to GPU";
    }
}

TEST(DeviceFuzz, RandomCollectivesAndGroupsStagedInSlicesBetweenThreads) {
  REQUIRE_GPU();
  for (uint64_t seed : Seeds()) {
    attnConfig_t cfg;
    attn_test::RunThreads(3, [&](int rank, int nranks, attnComm_t& comm) { RunSequence(rank, nranks, comm, seed); },
                          OnGpu0(&cfg, {{"ATTN_TRANSPORT", "shm,tcp"}, {"ATTN_DEVICE_STAGE_CHUNK", "4096"}}));
  }
}

TEST(DeviceFuzz, RandomCollectivesAndGroupsOverCudaIpcBetweenProcesses) {
  REQUIRE_FORKABLE_CUDA();
  for (uint64_t seed : Seeds()) {
    attnConfig_t cfg;
    attn_test::RunProcesses(3, [&](int rank, int nranks, attnComm_t& comm) {
      attn_test::DevBufsFromCudaMalloc();  // exportable: pool memory would be staged
      RunSequence(rank, nranks, comm, seed);
      EXPECT_GT(IpcOps(), 0u) << "seed " << seed << ", rank " << rank << ": no collective went GPU to GPU";
    }, OnGpu0(&cfg, {}));
  }
}

TEST(DeviceFuzz, RandomCollectivesAndGroupsStagedAcrossHosts) {
  REQUIRE_FORKABLE_CUDA();
  for (uint64_t seed : Seeds()) {
    attnConfig_t cfg;
    RunOptions o = OnGpu0(&cfg, {{"ATTN_DEVICE_STAGE_CHUNK", "4096"}});
    o.child_setup = [](int rank) { setenv("ATTN_HOSTID", ("fuzz-host-" + std::to_string(rank % 2)).c_str(), 1); };
    attn_test::RunProcesses(4, [&](int rank, int nranks, attnComm_t& comm) { RunSequence(rank, nranks, comm, seed); },
                            o);
  }
}

}  // namespace
