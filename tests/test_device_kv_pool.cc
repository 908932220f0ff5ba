// The distributed KV cache on device communicators: K and V in GPU memory,
// appends copied on the caller's stream, migration and attention enqueued
// on it. Checked against the double-precision reference over all of a
// request's tokens:
//   - lending blocks to peers and taking them back keeps attention exact
//     (fp32 and bf16, causal and not), ranks as threads and as processes;
//   - local calls made while collectives are queued on the stream do not
//     change what those collectives see, and the books catch up once the
//     stream has run them;
//   - decode steps see every token's position, wherever its block is and
//     whatever the slot held before (the GPU reads a mirror of them);
//   - a holder serves several owners in one batch, each its own partial;
//   - a decode step captured into a CUDA graph sees, at each launch, the
//     tokens appended before it;
//   - a device pool follows its communicator through attnCommShrink;
// Without a GPU the tests skip (the emulated runtime provides one in CI).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "attncomm.h"
#include "support/attn_fixtures.h"
#include "support/gpu.h"
#include "support/kv_fixtures.h"
#include "support/lse_conventions.h"
#include "support/multirank.h"
#include "src/device/backends/cuda_ipc/ipc_stats.h"

namespace {

using namespace attn_test;

attn_test::RunOptions OnGpu0(attnConfig_t* cfg) {
  *cfg = ATTN_CONFIG_INITIALIZER;
  cfg->device = 0;
  attn_test::RunOptions o = AttnRunOptions();
  o.config = cfg;
  return o;
}

attnStream_t AsStream(cudaStream_t s) { return reinterpret_cast<attnStream_t>(s); }

// Tokens [from, to) of a request, uploaded and appended on `s`; the device
// copies are freed after the append in stream order.
attnResult_t DeviceAppend(attnKvPool_t pool, cudaStream_t s, attnDataType_t t, int rank, int64_t req, int from,
                          int to, int len) {
  const KvTokens x = RequestTokens(t, rank, req, len);
  const size_t row = size_t(kKvHeads) * kKvDim * KvElemSize(t), bytes = size_t(to - from) * row;
  void *k = nullptr, *v = nullptr;
  EXPECT_EQ(cudaMallocAsync(&k, bytes + 1, s), cudaSuccess);
  EXPECT_EQ(cudaMallocAsync(&v, bytes + 1, s), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(k, x.k.data() + size_t(from) * row, bytes, cudaMemcpyHostToDevice, s), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(v, x.v.data() + size_t(from) * row, bytes, cudaMemcpyHostToDevice, s), cudaSuccess);
  // Positions are a host array, read during the call.
  const attnResult_t r = attnKvAppend(pool, req, k, v, x.pos.data() + from, to - from, AsStream(s));
  EXPECT_EQ(cudaFreeAsync(k, s), cudaSuccess);
  EXPECT_EQ(cudaFreeAsync(v, s), cudaSuccess);
  return r;
}

// One attnKvAttention call enqueued on a stream; Check() waits for it and
// compares with the reference.
class DeviceAttentionCall {
 public:
  DeviceAttentionCall(attnKvPool_t pool, attnComm_t comm, cudaStream_t s, int rank, std::vector<Req> reqs,
                      attnDataType_t t, bool causal, int hq = 4, attnLseBase_t base = attnLseNatural,
                      attnLseLayout_t layout = attnLseTokenMajor)
      : comm_(comm), s_(s), rank_(rank), reqs_(std::move(reqs)), t_(t), causal_(causal),
        qs_(MakeKvQueries(rank, reqs_, t, causal, hq)) {
    qs_.cfg.lse_base = base;
    qs_.cfg.lse_layout = layout;
    const size_t lseBytes = size_t(qs_.rows) * qs_.cfg.num_q_heads * sizeof(float);
    EXPECT_EQ(cudaMallocAsync(&q_, qs_.q.size() + 1, s), cudaSuccess);
    EXPECT_EQ(cudaMallocAsync(&out_, qs_.q.size() + 1, s), cudaSuccess);
    EXPECT_EQ(cudaMallocAsync(&lse_, lseBytes + 4, s), cudaSuccess);
    EXPECT_EQ(cudaMemcpyAsync(q_, qs_.q.data(), qs_.q.size(), cudaMemcpyHostToDevice, s), cudaSuccess);
    rc_ = attnKvAttention(pool, int(qs_.ids.size()), qs_.ids.data(), qs_.offs.data(), q_, qs_.qpos.data(), out_,
                          static_cast<float*>(lse_), &qs_.cfg, AsStream(s));
    if (rc_ != attnSuccess) error_ = attnGetLastError(comm);
  }

  AttnCheck Check() {
    std::vector<uint8_t> out(qs_.q.size());
    std::vector<float> lse(size_t(qs_.rows) * qs_.cfg.num_q_heads);
    EXPECT_EQ(cudaMemcpyAsync(out.data(), out_, out.size(), cudaMemcpyDeviceToHost, s_), cudaSuccess);
    EXPECT_EQ(cudaMemcpyAsync(lse.data(), lse_, lse.size() * sizeof(float), cudaMemcpyDeviceToHost, s_),
              cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
    for (void* p : {q_, out_, lse_}) EXPECT_EQ(cudaFreeAsync(p, s_), cudaSuccess);
    AttnCheck c;
    attnResult_t async = attnSuccess;
    EXPECT_EQ(attnCommGetAsyncError(comm_, &async), attnSuccess);
    c.rc = rc_ != attnSuccess ? rc_ : async;
    c.error = rc_ != attnSuccess ? error_ : async != attnSuccess ? attnGetLastError(comm_) : "";
    if (c.rc != attnSuccess) return c;
    // Back to natural token-major from the config's convention.
    const std::vector<float> natural =
        FromLseConvention(lse.data(), qs_.rows, qs_.cfg.num_q_heads, qs_.cfg.lse_base, qs_.cfg.lse_layout);
    AttnCheck r = CompareKvAttention(qs_, rank_, reqs_, t_, causal_, out.data(), natural.data());
    return r;
  }

 private:
  attnComm_t comm_;
  cudaStream_t s_;
  int rank_;
  std::vector<Req> reqs_;
  attnDataType_t t_;
  bool causal_;
  KvQueries qs_;
  void *q_ = nullptr, *out_ = nullptr, *lse_ = nullptr;
  attnResult_t rc_ = attnSuccess;
  std::string error_;
};

std::vector<int64_t> Holders(attnKvPool_t pool, int n, int64_t req) {
  std::vector<int64_t> h(static_cast<size_t>(n), int64_t(-1));
  EXPECT_EQ(attnKvGetPlacement(pool, req, h.data(), nullptr), attnSuccess) << attnGetLastError(nullptr);
  return h;
}

// Runs `body` on n rank threads of device communicators on GPU 0, each with
// a stream and a device pool (32 blocks of blockTokens, dtype t) of its
// own; the pool, then the stream, are destroyed after it, even when an
// assertion ended the body early.
using PoolBody = std::function<void(int rank, attnComm_t& comm, cudaStream_t st, attnKvPool_t pool)>;
void RunWithDevicePools(int n, int blockTokens, attnDataType_t t, const PoolBody& body) {
  attnConfig_t cfg;
  RunThreads(n, [&](int rank, int, attnComm_t& comm) {
    cudaStream_t st = nullptr;
    ASSERT_EQ(cudaStreamCreate(&st), cudaSuccess);
    const attnKvPoolConfig_t pc = PoolCfg(blockTokens, 32, t);
    attnKvPool_t pool = nullptr;
    ATTN_ASSERT_OK(comm, attnKvPoolCreate(comm, &pc, &pool));
    body(rank, comm, st, pool);
    ATTN_EXPECT_OK(comm, attnKvPoolDestroy(pool));
    EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(st), cudaSuccess);
  }, OnGpu0(&cfg));
}

struct Scenario {
  attnDataType_t dtype;
  bool causal;
  int blockTokens;
};

std::string Tag(const Scenario& s, int rank) {
  return std::string(s.dtype == attnFloat32 ? "fp32" : s.dtype == attnFloat16 ? "fp16" : "bf16") +
         (s.causal ? ", causal" : "") + ", rank " + std::to_string(rank);
}

// Every rank owns two requests; rank 0 lends blocks of its long one to
// ranks 1 and 2, then they return some. Attention is exact throughout.
void LendAndReturnOnDevice(const Scenario& s, int rank, int n, attnComm_t& comm) {
  cudaStream_t st = nullptr;
  ASSERT_EQ(cudaStreamCreate(&st), cudaSuccess);
  const attnKvPoolConfig_t cfg = PoolCfg(s.blockTokens, 64, s.dtype);
  attnKvPool_t pool = nullptr;
  ATTN_ASSERT_OK(comm, attnKvPoolCreate(comm, &cfg, &pool));
  const std::vector<Req> reqs = {{100 + rank, 3 * s.blockTokens * n + 5, 1}, {200 + rank, s.blockTokens + 3, 4}};
  // In two pieces, so the second fills the first's last block.
  for (const Req& r : reqs) {
    ATTN_ASSERT_OK(comm, DeviceAppend(pool, st, s.dtype, rank, r.id, 0, r.len / 3, r.len));
    ATTN_ASSERT_OK(comm, DeviceAppend(pool, st, s.dtype, rank, r.id, r.len / 3, r.len, r.len));
  }
  const std::string tag = Tag(s, rank);
  ExpectExact(DeviceAttentionCall(pool, comm, st, rank, reqs, s.dtype, s.causal).Check(), s.dtype,
              "all at home, " + tag);

  std::vector<attnKvMove_t> moves;
  if (rank == 0) moves = {{0, 1, 0, 100, 3}, {0, 2, 0, 100, 2}};
  std::vector<int64_t> granted(moves.size(), -1);
  ATTN_ASSERT_OK(comm, attnKvMigrate(pool, moves.data(), int(moves.size()), granted.data(), AsStream(st)));
  // Attention queued right behind the move sees the blocks where it left them.
  DeviceAttentionCall afterLending(pool, comm, st, rank, reqs, s.dtype, s.causal);
  ExpectExact(afterLending.Check(), s.dtype, "after lending, " + tag);  // synchronises
  if (rank == 0) {
    EXPECT_EQ(granted, (std::vector<int64_t>{3, 2}));
    const std::vector<int64_t> h = Holders(pool, n, 100);
    EXPECT_EQ(h[1], 3);
    EXPECT_EQ(h[2], 2);
  }
  attnKvPoolStats_t stats{};
  ATTN_ASSERT_OK(comm, attnKvPoolGetStats(pool, &stats));
  EXPECT_EQ(stats.lent_in_blocks, rank == 1 ? 3 : rank == 2 ? 2 : 0) << tag;
  EXPECT_EQ(stats.lent_out_blocks, rank == 0 ? 5 : 0) << tag;

  moves.clear();
  if (rank == 2) moves = {{2, 0, 0, 100, 2}};
  if (rank == 1) moves = {{1, 0, 0, 100, 1}};
  granted.assign(moves.size(), -1);
  ATTN_ASSERT_OK(comm, attnKvMigrate(pool, moves.data(), int(moves.size()), granted.data(), AsStream(st)));
  ExpectExact(DeviceAttentionCall(pool, comm, st, rank, reqs, s.dtype, s.causal).Check(), s.dtype,
              "after returning, " + tag);
  for (int64_t g : granted) EXPECT_EQ(g, rank == 2 ? 2 : 1);
  if (rank == 0) {
    const std::vector<int64_t> h = Holders(pool, n, 100);
    EXPECT_EQ(h[1], 2);
    EXPECT_EQ(h[2], 0);
  }
  ATTN_ASSERT_OK(comm, attnKvPoolDestroy(pool));
  EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(st), cudaSuccess);
}

TEST(DeviceKvPool, LendAndReturnKeepAttentionExactThreads) {
  REQUIRE_GPU();
  for (Scenario s : {Scenario{attnFloat32, true, 4}, Scenario{attnFloat32, false, 16},
                     Scenario{attnBfloat16, true, 5}}) {
    attnConfig_t cfg;
    RunThreads(3, [&](int rank, int n, attnComm_t& comm) { LendAndReturnOnDevice(s, rank, n, comm); },
               OnGpu0(&cfg));
  }
}

// The LSE in each convention of the config (base 2, head-major), served
// at the owner and at the holder of lent blocks.
TEST(DeviceKvPool, AttentionWritesTheLseConventionOfItsConfig) {
  REQUIRE_GPU();
  constexpr int kBlock = 4;
  RunWithDevicePools(2, kBlock, attnFloat32, [&](int rank, attnComm_t& comm, cudaStream_t st, attnKvPool_t pool) {
    const std::vector<Req> reqs = {{100, 3 * kBlock + 1, 2}, {101, 2 * kBlock, 1}};
    if (rank == 0)
      for (const Req& r : reqs) ATTN_ASSERT_OK(comm, DeviceAppend(pool, st, attnFloat32, rank, r.id, 0, r.len, r.len));
    std::vector<attnKvMove_t> moves;
    if (rank == 0) moves = {{0, 1, 0, 100, 2}};
    ATTN_ASSERT_OK(comm, attnKvMigrate(pool, moves.data(), int(moves.size()), nullptr, AsStream(st)));
    const std::vector<Req> mine = rank == 0 ? reqs : std::vector<Req>{};
    for (attnLseBase_t base : {attnLseNatural, attnLseBase2})
      for (attnLseLayout_t lay : {attnLseTokenMajor, attnLseHeadMajor})
        ExpectExact(DeviceAttentionCall(pool, comm, st, rank, mine, attnFloat32, true, 4, base, lay).Check(),
                    attnFloat32, std::string(base == attnLseBase2 ? "base 2" : "natural") +
                                     (lay == attnLseHeadMajor ? ", head-major" : ", token-major"));
  });
}

// Requests whose blocks are scattered through the pools (appended a block
// at a time in turn, lent one block per migration in turn): each is one
// paged kernel launch at its owner (own) and at its holder (serve), and
// attention stays exact.
TEST(DeviceKvPool, ScatteredBlocksAttendExactlyAtOwnerAndHolder) {
  REQUIRE_GPU();
  constexpr int kBlock = 4;
  for (attnDataType_t t : {attnFloat32, attnBfloat16}) {
    RunWithDevicePools(2, kBlock, t, [&](int rank, attnComm_t& comm, cudaStream_t st, attnKvPool_t pool) {
      const std::vector<Req> reqs = {{100, 6 * kBlock + 3, 2}, {101, 5 * kBlock, 1}};
      if (rank == 0)
        for (int at = 0; at < reqs[0].len; at += kBlock)
          for (const Req& r : reqs)
            if (at < r.len) ATTN_ASSERT_OK(comm, DeviceAppend(pool, st, t, rank, r.id, at, std::min(at + kBlock, r.len), r.len));
      const std::vector<Req> mine = rank == 0 ? reqs : std::vector<Req>{};
      ExpectExact(DeviceAttentionCall(pool, comm, st, rank, mine, t, true).Check(), t, "scattered at home");
      // One block per migration, the two requests in turn: rank 1 holds
      // each request's blocks in every other slot.
      std::vector<int64_t> granted(4, -1);
      for (int i = 0; i < 4; ++i) {
        std::vector<attnKvMove_t> moves;
        if (rank == 0) moves = {{0, 1, 0, reqs[size_t(i % 2)].id, 1}};
        ATTN_ASSERT_OK(comm, attnKvMigrate(pool, moves.data(), int(moves.size()), &granted[size_t(i)], AsStream(st)));
      }
      ExpectExact(DeviceAttentionCall(pool, comm, st, rank, mine, t, true).Check(), t, "scattered at both");
      if (rank == 0) {  // the stream has run the moves
        EXPECT_EQ(granted, (std::vector<int64_t>{1, 1, 1, 1}));
        EXPECT_EQ(Holders(pool, 2, 100), (std::vector<int64_t>{5, 2}));
        EXPECT_EQ(Holders(pool, 2, 101), (std::vector<int64_t>{3, 2}));
      }
    });
  }
}

// Migration moves each block's K and V as device sends and receives: with
// cuda_ipc allowed, ranks sharing the GPU copy them straight out of the
// sender's slots; without it they go through pinned host memory.
TEST(DeviceKvPool, MigrationCopiesBlocksGpuToGpuWhereCudaIpcReaches) {
  REQUIRE_GPU();
  const uint64_t movedTensors = 2 * (5 + 3);  // K and V of the blocks lent, then returned
  for (const char* transports : {"shm,tcp,cuda_ipc", "shm,tcp"}) {
    attn::ipc::IpcCounters& k = attn::ipc::ipcCounters();
    const uint64_t pulls0 = k.p2pPulls.load(), viaHost0 = k.p2pViaHost.load();
    attnConfig_t cfg;
    RunOptions o = OnGpu0(&cfg);
    o.env = {{"ATTN_TRANSPORT", transports}};
    RunThreads(3, [&](int rank, int n, attnComm_t& comm) {
      LendAndReturnOnDevice(Scenario{attnBfloat16, true, 5}, rank, n, comm);
    }, o);
    const bool ipc = std::string(transports).find("cuda_ipc") != std::string::npos;
    EXPECT_EQ(k.p2pPulls.load() - pulls0, ipc ? movedTensors : 0) << transports;
    // Counted by both ends of each pair.
    EXPECT_EQ(k.p2pViaHost.load() - viaHost0, ipc ? 0 : 2 * movedTensors) << transports;
  }
}

// Processes on one host: the pools are exportable memory, so each receiver
// copies the blocks it gets out of its sender's slots by IPC handle.
TEST(DeviceKvPool, LendAndReturnKeepAttentionExactProcesses) {
  REQUIRE_FORKABLE_CUDA();
  attnConfig_t cfg;
  RunProcesses(3, [&](int rank, int n, attnComm_t& comm) {
    const uint64_t pulls0 = attn::ipc::ipcCounters().p2pPulls.load();
    LendAndReturnOnDevice(Scenario{attnFloat16, true, 8}, rank, n, comm);
    // K and V of the blocks this rank received: 3 and 2 lent to ranks 1
    // and 2, then 1 + 2 returned to rank 0.
    const uint64_t received = rank == 2 ? 2 * 2 : 2 * 3;
    EXPECT_EQ(attn::ipc::ipcCounters().p2pPulls.load() - pulls0, received) << "rank " << rank;
  }, OnGpu0(&cfg));
}

// Ranks 0 and 1 on one emulated host, rank 2 on another: blocks between
// 0 and 1 are pulled by IPC handle, those to and from rank 2 go through
// pinned memory and the host transport (both ends count them).
TEST(DeviceKvPool, MigrationPullsOnTheHostAndStagesAcrossHosts) {
  REQUIRE_FORKABLE_CUDA();
  attnConfig_t cfg;
  RunOptions o = OnGpu0(&cfg);
  o.child_setup = [](int rank) { setenv("ATTN_HOSTID", rank < 2 ? "kv-host-a" : "kv-host-b", 1); };
  RunProcesses(3, [&](int rank, int n, attnComm_t& comm) {
    attn::ipc::IpcCounters& k = attn::ipc::ipcCounters();
    const uint64_t pulls0 = k.p2pPulls.load(), viaHost0 = k.p2pViaHost.load();
    LendAndReturnOnDevice(Scenario{attnBfloat16, true, 8}, rank, n, comm);
    // Rank 0 lends 3 blocks to rank 1 and 2 to rank 2; rank 1 returns 1,
    // rank 2 returns 2. K and V of each are one send and one receive.
    const uint64_t pulls[3] = {2 * 1, 2 * 3, 0};
    const uint64_t viaHost[3] = {2 * (2 + 2), 0, 2 * (2 + 2)};
    EXPECT_EQ(k.p2pPulls.load() - pulls0, pulls[rank]) << "rank " << rank;
    EXPECT_EQ(k.p2pViaHost.load() - viaHost0, viaHost[rank]) << "rank " << rank;
  }, o);
}

// Rank 0 queues three attention calls on its stream, which cannot run
// before rank 1 joins them, and makes local calls in between: appends to
// the request the first call reads, a release, an append that needs the
// released blocks. Each call must see the request as it was when it was
// enqueued (no causal mask, so later tokens would change the result), and
// the blocks of the release come free once the stream has run the calls.
TEST(DeviceKvPool, LocalCallsBehindQueuedCollectivesKeepTheirPlace) {
  REQUIRE_GPU();
  constexpr attnDataType_t t = attnFloat32;
  std::atomic<bool> go{false};
  attnConfig_t cfg;
  RunThreads(2, [&](int rank, int, attnComm_t& comm) {
    cudaStream_t st = nullptr;
    ASSERT_EQ(cudaStreamCreate(&st), cudaSuccess);
    const attnKvPoolConfig_t pc = PoolCfg(4, 6, t);
    attnKvPool_t pool = nullptr;
    ATTN_ASSERT_OK(comm, attnKvPoolCreate(comm, &pc, &pool));
    if (rank == 1) {
      ATTN_ASSERT_OK(comm, DeviceAppend(pool, st, t, rank, 1, 0, 5, 5));
      while (!go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      for (int i = 0; i < 3; ++i)
        ExpectExact(DeviceAttentionCall(pool, comm, st, rank, {{1, 5, 1}}, t, false).Check(), t, "rank 1");
    } else {
      ATTN_ASSERT_OK(comm, DeviceAppend(pool, st, t, rank, 1, 0, 10, 13));  // blocks of 4, 4, 2
      DeviceAttentionCall first(pool, comm, st, rank, {{1, 10, 1}}, t, false);
      ATTN_ASSERT_OK(comm, DeviceAppend(pool, st, t, rank, 1, 10, 13, 13));  // fills the third, opens a fourth
      attnKvPoolStats_t s{};
      ATTN_ASSERT_OK(comm, attnKvPoolGetStats(pool, &s));
      EXPECT_EQ(s.num_requests, 1);
      EXPECT_EQ(s.used_blocks, 4);
      int64_t tokens = 0;
      std::vector<int64_t> h(2, -1);
      ATTN_ASSERT_OK(comm, attnKvGetPlacement(pool, 1, h.data(), &tokens));
      EXPECT_EQ(tokens, 13);
      EXPECT_EQ(h, (std::vector<int64_t>{4, 0}));
      DeviceAttentionCall second(pool, comm, st, rank, {{1, 13, 1}}, t, false);
      ATTN_ASSERT_OK(comm, attnKvRelease(pool, 1, AsStream(st)));
      EXPECT_EQ(attnKvGetPlacement(pool, 1, nullptr, nullptr), attnInvalidArgument);
      ATTN_ASSERT_OK(comm, DeviceAppend(pool, st, t, rank, 2, 0, 8, 8));  // the last two free blocks
      // The released blocks are still read by the queued calls.
      EXPECT_EQ(DeviceAppend(pool, st, t, rank, 3, 0, 4, 4), attnInvalidUsage);
      DeviceAttentionCall third(pool, comm, st, rank, {{2, 8, 1}}, t, false);
      ATTN_ASSERT_OK(comm, attnKvPoolGetStats(pool, &s));
      EXPECT_EQ(s.num_requests, 1);
      EXPECT_EQ(s.used_blocks, 6);
      go = true;
      ExpectExact(first.Check(), t, "first call: the 10 tokens it was enqueued behind");
      ExpectExact(second.Check(), t, "second call: all 13");
      ExpectExact(third.Check(), t, "third call: the request appended after the release");
      ATTN_ASSERT_OK(comm, attnKvPoolGetStats(pool, &s));
      EXPECT_EQ(s.used_blocks, 2);
      ATTN_ASSERT_OK(comm, DeviceAppend(pool, st, t, rank, 3, 0, 4, 4));
    }
    ATTN_ASSERT_OK(comm, attnKvPoolDestroy(pool));
    EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(st), cudaSuccess);
  }, OnGpu0(&cfg));
}

// Decode on a device pool: tokens appended one at a time, attention after
// each, with queries at the last half of the positions (causal, so a key
// whose position the GPU reads wrong is seen or hidden wrongly). The GPU
// reads a mirror of the host's positions, brought up to date per call; this
// covers appends into a half-filled block, blocks received from a peer
// (rank 1 holds the first two of rank 0's request), a slot that comes back
// with other positions (the request's fourth block takes the first one's
// slot after it was lent), and slots released and taken by other requests.
TEST(DeviceKvPool, DecodeStepsSeeEveryPositionWhereverItsBlockIs) {
  REQUIRE_GPU();
  constexpr int kBlock = 4, kFinal = 3 * kBlock + 2;
  constexpr int64_t kReq = 100;
  for (attnDataType_t t : {attnFloat32, attnBfloat16}) {
    RunWithDevicePools(2, kBlock, t, [&](int rank, attnComm_t& comm, cudaStream_t st, attnKvPool_t pool) {
      auto mine = [&](std::vector<Req> r) { return rank == 0 ? r : std::vector<Req>{}; };
      int len = 2 * kBlock + 1;
      if (rank == 0) ATTN_ASSERT_OK(comm, DeviceAppend(pool, st, t, rank, kReq, 0, len, kFinal));
      std::vector<attnKvMove_t> moves;
      if (rank == 0) moves = {{0, 1, 0, kReq, 2}};
      ATTN_ASSERT_OK(comm, attnKvMigrate(pool, moves.data(), int(moves.size()), nullptr, AsStream(st)));
      ExpectExact(DeviceAttentionCall(pool, comm, st, rank, mine({{kReq, len, (len + 1) / 2}}), t, true).Check(), t,
                  "two blocks lent");
      for (; len < kFinal; ++len) {
        if (rank == 0) ATTN_ASSERT_OK(comm, DeviceAppend(pool, st, t, rank, kReq, len, len + 1, kFinal));
        const int n = len + 1;
        ExpectExact(DeviceAttentionCall(pool, comm, st, rank, mine({{kReq, n, (n + 1) / 2}}), t, true).Check(), t,
                    "decode step to " + std::to_string(n) + " tokens");
      }
      if (rank == 0) {
        EXPECT_EQ(Holders(pool, 2, kReq), (std::vector<int64_t>{2, 2}));
        ATTN_ASSERT_OK(comm, attnKvRelease(pool, kReq, AsStream(st)));
        for (int at = 0; at < 7; at += kBlock)  // a block of each in turn
          for (const auto& [id, n] : {std::pair<int64_t, int>{101, 6}, {102, 7}})
            if (at < n) ATTN_ASSERT_OK(comm, DeviceAppend(pool, st, t, rank, id, at, std::min(at + kBlock, n), n));
      }
      ExpectExact(DeviceAttentionCall(pool, comm, st, rank, mine({{101, 6, 3}, {102, 7, 4}}), t, true).Check(), t,
                  "released slots taken by other requests");
    });
  }
}

// Rank 0 appends the first `len` tokens of request req (of `final`) and
// lends its first two blocks to rank 1.
void StartLentRequest(attnKvPool_t pool, attnComm_t comm, cudaStream_t st, attnDataType_t t, int rank, int64_t req,
                      int len, int final) {
  if (rank == 0) ATTN_ASSERT_OK(comm, DeviceAppend(pool, st, t, rank, req, 0, len, final));
  std::vector<attnKvMove_t> moves;
  if (rank == 0) moves = {{0, 1, 0, req, 2}};
  ATTN_ASSERT_OK(comm, attnKvMigrate(pool, moves.data(), int(moves.size()), nullptr, AsStream(st)));
}

// Launches a graph on `s`, then downloads the outputs of its attention
// call (sizes from the vectors) and waits for them.
void LaunchAndDownload(cudaGraphExec_t exec, cudaStream_t s, const void* out, std::vector<uint8_t>* gotOut,
                       const void* lse, std::vector<float>* gotLse) {
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(gotOut->data(), out, gotOut->size(), cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(gotLse->data(), lse, gotLse->size() * sizeof(float), cudaMemcpyDeviceToHost, s),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
}

// A decode step captured into a CUDA graph once and launched after every
// append: each launch attends over the tokens the pool holds at that
// launch, wherever their blocks are (two lent to the peer, which serves its
// part from inside its own graph). Not causal: the query's position stays
// where it was at the capture, before the new tokens (the next test
// advances it, causal).
TEST(DeviceKvPool, CapturedDecodeStepSeesTheTokensAppendedBeforeEachLaunch) {
  REQUIRE_GPU();
  constexpr int kBlock = 4, kStart = 2 * kBlock + 1, kFinal = 3 * kBlock + 2;
  constexpr int64_t kReq = 100;
  for (attnDataType_t t : {attnFloat32, attnBfloat16}) {
    RunWithDevicePools(2, kBlock, t, [&](int rank, attnComm_t& comm, cudaStream_t st, attnKvPool_t pool) {
      ASSERT_NO_FATAL_FAILURE(StartLentRequest(pool, comm, st, t, rank, kReq, kStart, kFinal));
      const std::vector<Req> reqs = rank == 0 ? std::vector<Req>{{kReq, kStart, 1}} : std::vector<Req>{};
      const KvQueries qs = MakeKvQueries(rank, reqs, t, false);
      const size_t lseCount = size_t(qs.rows) * qs.cfg.num_q_heads;
      void *q = nullptr, *out = nullptr, *lse = nullptr;
      ASSERT_EQ(cudaMallocAsync(&q, qs.q.size() + 1, st), cudaSuccess);
      ASSERT_EQ(cudaMallocAsync(&out, qs.q.size() + 1, st), cudaSuccess);
      ASSERT_EQ(cudaMallocAsync(&lse, lseCount * sizeof(float) + 4, st), cudaSuccess);
      ASSERT_EQ(cudaMemcpyAsync(q, qs.q.data(), qs.q.size(), cudaMemcpyHostToDevice, st), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
      ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
      const attnResult_t captured =
          attnKvAttention(pool, int(qs.ids.size()), qs.ids.data(), qs.offs.data(), q, qs.qpos.data(), out,
                          static_cast<float*>(lse), &qs.cfg, AsStream(st));
      cudaGraph_t graph = nullptr;
      ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
      ATTN_ASSERT_OK(comm, captured);
      cudaGraphExec_t exec = nullptr;
      ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
      ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
      // The first append too comes between the capture and a launch.
      for (int len = kStart + 1; len <= kFinal; ++len) {
        if (rank == 0) ATTN_ASSERT_OK(comm, DeviceAppend(pool, st, t, rank, kReq, len - 1, len, kFinal));
        std::vector<uint8_t> gotOut(qs.q.size());
        std::vector<float> gotLse(lseCount);
        ASSERT_NO_FATAL_FAILURE(LaunchAndDownload(exec, st, out, &gotOut, lse, &gotLse));
        if (rank != 0) continue;
        ExpectExact(CompareKvAttention(qs, rank, {{kReq, len, 1}}, t, false, gotOut.data(), gotLse.data()), t,
                    "launch over " + std::to_string(len) + " tokens");
      }
      attnResult_t async = attnInternalError;
      EXPECT_EQ(attnCommGetAsyncError(comm, &async), attnSuccess);
      EXPECT_EQ(async, attnSuccess) << attnGetLastError(comm);
      EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
      for (void* p : {q, out, lse}) EXPECT_EQ(cudaFreeAsync(p, st), cudaSuccess);
    });
  }
}

// A whole decode step captured once: the new token's append, then causal
// attention over the request. Each launch appends the token that the
// device buffers and the host position hold at that launch (one launch
// fills a block, the next takes a new one) and attends, from the query
// position the host array holds then, over all tokens so far, two blocks
// of them lent to the peer. The last token is appended outside the graph,
// after the launches: the pool's books followed them.
TEST(DeviceKvPool, CapturedDecodeStepAppendsItsTokenAtEachLaunch) {
  REQUIRE_GPU();
  constexpr int kBlock = 4, kStart = 2 * kBlock + 1, kFinal = 3 * kBlock + 2;
  constexpr int64_t kReq = 100;
  for (attnDataType_t t : {attnFloat32, attnBfloat16}) {
    RunWithDevicePools(2, kBlock, t, [&](int rank, attnComm_t& comm, cudaStream_t st, attnKvPool_t pool) {
      const bool owner = rank == 0;
      ASSERT_NO_FATAL_FAILURE(StartLentRequest(pool, comm, st, t, rank, kReq, kStart, kFinal));
      const KvTokens x = RequestTokens(t, rank, kReq, kFinal);
      const size_t row = size_t(kKvHeads) * kKvDim * KvElemSize(t);
      const std::vector<Req> reqs = owner ? std::vector<Req>{{kReq, kStart, 1}} : std::vector<Req>{};
      const KvQueries qs = MakeKvQueries(rank, reqs, t, true);
      const size_t lseCount = size_t(qs.rows) * qs.cfg.num_q_heads;
      void *k = nullptr, *v = nullptr, *q = nullptr, *out = nullptr, *lse = nullptr;
      // The new token's position and the query's, written before each launch.
      int32_t *pos = nullptr, *qpos = nullptr;
      ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pos), sizeof(int32_t)), cudaSuccess);
      ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&qpos), sizeof(int32_t)), cudaSuccess);
      ASSERT_EQ(cudaMallocAsync(&k, row, st), cudaSuccess);
      ASSERT_EQ(cudaMallocAsync(&v, row, st), cudaSuccess);
      ASSERT_EQ(cudaMallocAsync(&q, qs.q.size() + 1, st), cudaSuccess);
      ASSERT_EQ(cudaMallocAsync(&out, qs.q.size() + 1, st), cudaSuccess);
      ASSERT_EQ(cudaMallocAsync(&lse, lseCount * sizeof(float) + 4, st), cudaSuccess);
      ASSERT_EQ(cudaMemcpyAsync(q, qs.q.data(), qs.q.size(), cudaMemcpyHostToDevice, st), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
      ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
      const attnResult_t appended = owner ? attnKvAppend(pool, kReq, k, v, pos, 1, AsStream(st)) : attnSuccess;
      const attnResult_t attended =
          attnKvAttention(pool, int(qs.ids.size()), qs.ids.data(), qs.offs.data(), q, owner ? qpos : nullptr, out,
                          static_cast<float*>(lse), &qs.cfg, AsStream(st));
      cudaGraph_t graph = nullptr;
      ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
      ATTN_ASSERT_OK(comm, appended);
      ATTN_ASSERT_OK(comm, attended);
      cudaGraphExec_t exec = nullptr;
      ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
      ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
      for (int len = kStart + 1; len < kFinal; ++len) {
        // The step's new token, as the model's kernels would leave it.
        ASSERT_EQ(cudaMemcpyAsync(k, x.k.data() + size_t(len - 1) * row, row, cudaMemcpyHostToDevice, st),
                  cudaSuccess);
        ASSERT_EQ(cudaMemcpyAsync(v, x.v.data() + size_t(len - 1) * row, row, cudaMemcpyHostToDevice, st),
                  cudaSuccess);
        *pos = x.pos[size_t(len - 1)];
        const KvQueries step = MakeKvQueries(rank, {{kReq, len, 1}}, t, true);
        if (owner) *qpos = step.qpos[0];
        std::vector<uint8_t> gotOut(qs.q.size());
        std::vector<float> gotLse(lseCount);
        ASSERT_NO_FATAL_FAILURE(LaunchAndDownload(exec, st, out, &gotOut, lse, &gotLse));
        if (!owner) continue;
        ExpectExact(CompareKvAttention(step, rank, {{kReq, len, 1}}, t, true, gotOut.data(), gotLse.data()), t,
                    "launch appending token " + std::to_string(len - 1));
        int64_t tokens = 0;
        ATTN_ASSERT_OK(comm, attnKvGetPlacement(pool, kReq, nullptr, &tokens));
        EXPECT_EQ(tokens, len);
      }
      attnResult_t async = attnInternalError;
      EXPECT_EQ(attnCommGetAsyncError(comm, &async), attnSuccess);
      EXPECT_EQ(async, attnSuccess) << attnGetLastError(comm);
      EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
      for (void* p : {k, v, q, out, lse}) EXPECT_EQ(cudaFreeAsync(p, st), cudaSuccess);
      if (owner) {
        ATTN_ASSERT_OK(comm, DeviceAppend(pool, st, t, rank, kReq, kFinal - 1, kFinal, kFinal));
        EXPECT_EQ(Holders(pool, 2, kReq), (std::vector<int64_t>{2, 2}));
      }
      ExpectExact(DeviceAttentionCall(pool, comm, st, rank, owner ? std::vector<Req>{{kReq, kFinal, 3}}
                                                                  : std::vector<Req>{}, t, true).Check(),
                  t, "the last token appended outside the graph");
      ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
      cudaFreeHost(pos);
      cudaFreeHost(qpos);
    });
  }
}

// A holder that serves several owners in one call: ranks 1 and 2 lend
// blocks of their requests to rank 0, which lends one of its own to rank 1.
// Rank 0 then computes for both peers in one batch on the GPU, their
// queries with different head counts (4 and 6 query heads over the 2 kv
// heads) and so different row sizes, and each reply must carry its own
// peer's partial.
TEST(DeviceKvPool, OneHolderServesSeveralOwnersInOneBatch) {
  REQUIRE_GPU();
  constexpr int kBlock = 4;
  for (attnDataType_t t : {attnFloat32, attnBfloat16}) {
    RunWithDevicePools(3, kBlock, t, [&](int rank, attnComm_t& comm, cudaStream_t st, attnKvPool_t pool) {
      const Req mine = {100 + rank, (4 + rank) * kBlock + rank, 3 + rank};
      ATTN_ASSERT_OK(comm, DeviceAppend(pool, st, t, rank, mine.id, 0, mine.len, mine.len));
      std::vector<attnKvMove_t> moves;
      if (rank == 0) moves = {{0, 1, 0, mine.id, 1}};
      else moves = {{rank, 0, rank, mine.id, 2}};
      ATTN_ASSERT_OK(comm, attnKvMigrate(pool, moves.data(), int(moves.size()), nullptr, AsStream(st)));
      const int hq = 2 + 2 * rank;  // query heads over the 2 kv heads
      ExpectExact(DeviceAttentionCall(pool, comm, st, rank, {mine}, t, true, hq).Check(), t,
                  "rank " + std::to_string(rank) + ", served at rank 0 with the other owner's queries");
      attnKvPoolStats_t stats{};
      ATTN_ASSERT_OK(comm, attnKvPoolGetStats(pool, &stats));
      EXPECT_EQ(stats.lent_in_blocks, rank == 0 ? 4 : rank == 1 ? 1 : 0) << "rank " << rank;
    });
  }
}

// A device pool follows attnCommShrink: rank 2 leaves; rank 0's request
// with a block there is lost, rank 1's blocks at rank 0 stay, and blocks
// move and attend exactly on the new device communicator.
TEST(DeviceKvPool, FollowsAShrink) {
  REQUIRE_GPU();
  constexpr attnDataType_t t = attnFloat32;
  constexpr int kBlock = 4, kVictim = 2;
  attnConfig_t cfg;
  attn_test::RunOptions opts = OnGpu0(&cfg);
  cfg.timeout_ms = 10000;
  RunThreads(3, [&](int rank, int, attnComm_t& comm) {
    cudaStream_t st = nullptr;
    ASSERT_EQ(cudaStreamCreate(&st), cudaSuccess);
    const attnKvPoolConfig_t pc = PoolCfg(kBlock, 32, t);
    attnKvPool_t pool = nullptr;
    ATTN_ASSERT_OK(comm, attnKvPoolCreate(comm, &pc, &pool));
    const Req mine = {100 + rank, 4 * kBlock + 1, 2};
    ATTN_ASSERT_OK(comm, DeviceAppend(pool, st, t, rank, mine.id, 0, mine.len, mine.len));
    std::vector<attnKvMove_t> moves;
    if (rank == 0) moves = {{0, 1, 0, 100, 2}, {0, 2, 0, 100, 1}};
    if (rank == 1) moves = {{1, 0, 1, 101, 1}};
    ATTN_ASSERT_OK(comm, attnKvMigrate(pool, moves.data(), int(moves.size()), nullptr, AsStream(st)));
    ExpectExact(DeviceAttentionCall(pool, comm, st, rank, {mine}, t, true).Check(), t, "lent out");
    if (rank == kVictim) {
      ATTN_EXPECT_OK(comm, attnKvPoolDestroy(pool));
      EXPECT_EQ(cudaStreamDestroy(st), cudaSuccess);
      EXPECT_EQ(attnCommAbort(comm), attnSuccess);
      comm = nullptr;
      return;
    }
    attnComm_t shrunk = nullptr;
    ATTN_ASSERT_OK(comm, attnCommShrink(comm, &kVictim, 1, &shrunk, nullptr, ATTN_SHRINK_ABORT));
    int64_t lost = -1;
    int numLost = -1;
    ATTN_ASSERT_OK(shrunk, attnKvPoolShrink(pool, shrunk, &lost, 1, &numLost));
    EXPECT_EQ(attnCommAbort(comm), attnSuccess);
    comm = shrunk;
    EXPECT_EQ(numLost, rank == 0 ? 1 : 0);
    if (rank == 0) EXPECT_EQ(lost, 100);
    attnKvPoolStats_t stats{};
    ATTN_ASSERT_OK(comm, attnKvPoolGetStats(pool, &stats));
    EXPECT_EQ(stats.lent_in_blocks, rank == 0 ? 1 : 0) << "rank " << rank;
    const std::vector<Req> kept = rank == 0 ? std::vector<Req>{} : std::vector<Req>{mine};
    ExpectExact(DeviceAttentionCall(pool, comm, st, rank, kept, t, true).Check(), t, "after the shrink");
    moves.clear();
    if (rank == 0) moves = {{0, 1, 1, 101, 1}};
    ATTN_ASSERT_OK(comm, attnKvMigrate(pool, moves.data(), int(moves.size()), nullptr, AsStream(st)));
    ExpectExact(DeviceAttentionCall(pool, comm, st, rank, kept, t, true).Check(), t, "returned");
    ATTN_ASSERT_OK(comm, attnKvPoolGetStats(pool, &stats));
    EXPECT_EQ(stats.lent_in_blocks + stats.lent_out_blocks, 0) << "rank " << rank;
    ATTN_ASSERT_OK(comm, attnKvPoolDestroy(pool));
    EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(st), cudaSuccess);
  }, opts);
}

}  // namespace
