// Device communicators read a layout where it lives (src/attn/device/
// device_layout.h): arrays in device or pinned memory when the call runs,
// so one captured CUDA graph serves every decode step as positions and
// lengths advance; pageable arrays at the call. And the LSE of a device
// call in its config's convention (base 2, head-major). Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "attncomm.h"
#include "support/attn_fixtures.h"
#include "support/gpu.h"
#include "support/lse_conventions.h"
#include "support/multirank.h"

namespace {

using attn_test::RunOptions;
using attn_test::RunThreads;

RunOptions OnGpu0(attnConfig_t* cfg) {
  *cfg = ATTN_CONFIG_INITIALIZER;
  cfg->device = 0;
  RunOptions o;
  o.config = cfg;
  return o;
}

// Where the test keeps a layout's arrays.
enum class Home { kDevice, kPinned };

// One rank's buffers for a run of steps whose shards differ: sized for the
// largest, uploaded step by step on the rank's stream.
struct StepBuffers {
  cudaStream_t s = nullptr;
  Home home = Home::kDevice;
  void *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr;
  float* lse = nullptr;
  int32_t *qOff = nullptr, *qPos = nullptr, *kvOff = nullptr, *kvPos = nullptr;
  attnSeqLayout_t layout{};
  size_t outCap = 0, lseCap = 0;

  StepBuffers(const std::vector<attn_test::RankShard>& steps, int numSeqs, int hq, Home h) : home(h) {
    size_t qb = 1, kb = 1, qr = 1, kr = 1;
    for (const auto& sh : steps) {
      qb = std::max(qb, sh.q.size());
      kb = std::max(kb, sh.k.size());
      qr = std::max(qr, sh.q_pos.size());
      kr = std::max(kr, sh.kv_pos.size());
    }
    outCap = qb;
    lseCap = qr * size_t(hq);
    EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    for (auto [p, n] : {std::pair<void**, size_t>{&q, qb}, {&k, kb}, {&v, kb}, {&out, qb},
                        {reinterpret_cast<void**>(&lse), lseCap * 4}})
      EXPECT_EQ(cudaMallocAsync(p, n, s), cudaSuccess);
    const size_t offBytes = (size_t(numSeqs) + 1) * 4;
    for (auto [p, n] : {std::pair<int32_t**, size_t>{&qOff, offBytes}, {&kvOff, offBytes}, {&qPos, qr * 4},
                        {&kvPos, kr * 4}}) {
      if (home == Home::kDevice)
        EXPECT_EQ(cudaMallocAsync(reinterpret_cast<void**>(p), n, s), cudaSuccess);
      else
        EXPECT_EQ(cudaMallocHost(reinterpret_cast<void**>(p), n), cudaSuccess);
    }
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    layout = {numSeqs, qOff, qPos, kvOff, kvPos};
  }
  ~StepBuffers() {
    for (void* p : {q, k, v, out, static_cast<void*>(lse)}) cudaFreeAsync(p, s);
    for (int32_t* p : {qOff, qPos, kvOff, kvPos}) {
      if (home == Home::kDevice)
        cudaFreeAsync(p, s);
      else
        cudaFreeHost(p);
    }
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }

  // Step `sh`'s tensors and layout, in stream order (device) or now
  // (pinned: the stream is idle, the caller synchronised it).
  void upload(const attn_test::RankShard& sh) {
    auto up = [&](void* d, const void* h, size_t n) {
      if (n) EXPECT_EQ(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, s), cudaSuccess);
    };
    up(q, sh.q.data(), sh.q.size());
    up(k, sh.k.data(), sh.k.size());
    up(v, sh.v.data(), sh.v.size());
    EXPECT_EQ(cudaMemsetAsync(out, 0xff, outCap, s), cudaSuccess);  // NaN in every dtype: no stale rows pass
    auto ints = [&](int32_t* d, const std::vector<int32_t>& h) {
      if (home == Home::kDevice)
        up(d, h.data(), h.size() * 4);
      else
        std::memcpy(d, h.data(), h.size() * 4);
    };
    ints(qOff, sh.q_off);
    ints(kvOff, sh.kv_off);
    ints(qPos, sh.q_pos);
    ints(kvPos, sh.kv_pos);
  }

  // The call's output and LSE, compared with the step's reference; lse
  // converted back from `cfg`'s convention first.
  attn_test::AttnErrorStats download(const attn_test::AttnCase& c, const attn_test::RankShard& sh) {
    std::vector<uint8_t> o(sh.q.size());
    const int64_t rows = int64_t(sh.q_pos.size());
    const int hq = c.cfg.num_q_heads;
    std::vector<float> l(size_t(rows) * hq);
    if (!o.empty()) EXPECT_EQ(cudaMemcpyAsync(o.data(), out, o.size(), cudaMemcpyDeviceToHost, s), cudaSuccess);
    if (!l.empty())
      EXPECT_EQ(cudaMemcpyAsync(l.data(), lse, l.size() * 4, cudaMemcpyDeviceToHost, s), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    const std::vector<float> natural =
        attn_test::FromLseConvention(l.data(), rows, hq, c.cfg.lse_base, c.cfg.lse_layout);
    return attn_test::CompareShard(c, sh, o.data(), natural.data());
  }
};

void ExpectNoAsyncError(attnComm_t comm) {
  attnResult_t async = attnInternalError;
  ASSERT_EQ(attnCommGetAsyncError(comm, &async), attnSuccess);
  EXPECT_EQ(async, attnSuccess) << attnGetLastError(comm);
}

// Decode steps of two sequences: one new token each over caches that grow
// by one a step, with new data and a new random placement every step (a
// rank's row counts change too).
std::vector<attn_test::AttnCase> DecodeSteps(const attnAttnConfig_t& shape, int steps) {
  std::vector<attn_test::AttnCase> cases;
  for (int s = 0; s < steps; ++s)
    cases.push_back(attn_test::MakeCase("step " + std::to_string(s),
                                        attn_test::PrefillSpec(shape, {1, 1}, {29 + s, 50 + s}), 40 + s));
  return cases;
}

// One graph captured at step 0 and replayed at every step, its layout in
// device (or pinned) memory rewritten before each replay: each replay
// computes its own step's attention. (A layout copied at the capture would
// replay step 0's lengths and positions: the later steps would fail.)
TEST(DeviceLayout, OneCapturedGraphServesEveryDecodeStep) {
  REQUIRE_GPU();
  constexpr attnAttnConfig_t shape = ATTN_ATTN_CONFIG(8, 2, 64, attnBfloat16, 0.f, 1);
  const std::vector<attn_test::AttnCase> cases = DecodeSteps(shape, 3);
  for (Home home : {Home::kDevice, Home::kPinned})
    for (attnAttnMode_t mode : {attnModePassKV, attnModePassQ, attnModeShipQ, attnModeHeadParallel, attnModeAuto}) {
      SCOPED_TRACE(std::string(attn_test::ModeName(mode)) + (home == Home::kDevice ? ", device layout" : ", pinned layout"));
      attnConfig_t cfg;
      RunThreads(3, [&](int rank, int nranks, attnComm_t& comm) {
        std::vector<attn_test::RankShard> shards;
        for (size_t i = 0; i < cases.size(); ++i)
          shards.push_back(attn_test::GatherShard(
              cases[i], attn_test::RandomPlacement(cases[i], nranks, 7 + i, -1), rank));
        StepBuffers b(shards, 2, shape.num_q_heads, home);
        b.upload(shards[0]);
        ASSERT_EQ(cudaStreamSynchronize(b.s), cudaSuccess);
        attnResult_t rc = attnInternalError;
        ASSERT_EQ(cudaStreamBeginCapture(b.s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
        rc = attnRingAttention(b.q, b.k, b.v, b.out, b.lse, &b.layout, &shape, mode, comm, (attnStream_t)b.s);
        cudaGraph_t graph = nullptr;
        ASSERT_EQ(cudaStreamEndCapture(b.s, &graph), cudaSuccess);
        ASSERT_EQ(rc, attnSuccess) << attnGetLastError(comm);
        cudaGraphExec_t exec = nullptr;
        ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
        ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
        for (size_t i = 0; i < cases.size(); ++i) {
          if (i > 0) b.upload(shards[i]);
          ASSERT_EQ(cudaGraphLaunch(exec, b.s), cudaSuccess);
          const attn_test::AttnErrorStats st = b.download(cases[i], shards[i]);
          EXPECT_TRUE(attn_test::WithinBounds(st, shape.dtype, cases[i].name)) << cases[i].name;
          ExpectNoAsyncError(comm);
        }
        EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
      }, OnGpu0(&cfg));
    }
}

// Every LSE convention on a device communicator, in every mode and in
// level attention, with the layout in device memory and without a graph.
TEST(DeviceLayout, DeviceCallsWriteTheLseConventionOfTheirConfig) {
  REQUIRE_GPU();
  for (attnLseBase_t base : {attnLseNatural, attnLseBase2})
    for (attnLseLayout_t lay : {attnLseTokenMajor, attnLseHeadMajor}) {
      attnAttnConfig_t shape = ATTN_ATTN_CONFIG(4, 2, 32, attnFloat16, 0.f, 1);
      shape.lse_base = base;
      shape.lse_layout = lay;
      const attn_test::AttnCase c =
          attn_test::MakeCase("lse", attn_test::PrefillSpec(shape, {37, 20}, {11, 0}), 3);
      for (int mode = -1; mode <= int(attnModeHeadParallel); ++mode) {  // -1: attnLevelAttention
        SCOPED_TRACE((mode < 0 ? std::string("level") : attn_test::ModeName(attnAttnMode_t(mode))) +
                     (base == attnLseBase2 ? " base 2" : " natural") + (lay == attnLseHeadMajor ? " [H, T]" : " [T, H]"));
        attnConfig_t cfg;
        RunThreads(2, [&](int rank, int nranks, attnComm_t& comm) {
          const std::vector<attn_test::RankShard> shards = {
              attn_test::GatherShard(c, attn_test::RandomPlacement(c, nranks, 5, -1), rank)};
          StepBuffers b(shards, 2, shape.num_q_heads, Home::kDevice);
          b.upload(shards[0]);
          const attnResult_t rc =
              mode < 0 ? attnLevelAttention(b.q, b.k, b.v, b.out, b.lse, &b.layout, &shape, nullptr, comm,
                                            (attnStream_t)b.s)
                       : attnRingAttention(b.q, b.k, b.v, b.out, b.lse, &b.layout, &shape, attnAttnMode_t(mode),
                                           comm, (attnStream_t)b.s);
          ASSERT_EQ(rc, attnSuccess) << attnGetLastError(comm);
          EXPECT_TRUE(attn_test::WithinBounds(b.download(c, shards[0]), shape.dtype, "lse"));
          ExpectNoAsyncError(comm);
        }, OnGpu0(&cfg));
      }
    }
}

// A layout read when the call runs is checked then: offsets that decrease
// fail the call on the rank that gave them and, naming it, on its peers;
// every stream is released and the communicators stay usable. A layout
// half in pageable memory is refused at the call.
TEST(DeviceLayout, BadLayoutsReadAtRunFailOnEveryRank) {
  REQUIRE_GPU();
  constexpr attnAttnConfig_t shape = ATTN_ATTN_CONFIG(4, 2, 32, attnFloat32, 0.f, 1);
  const std::vector<attn_test::AttnCase> cases = DecodeSteps(shape, 1);
  attnConfig_t cfg;
  RunThreads(2, [&](int rank, int nranks, attnComm_t& comm) {
    const std::vector<attn_test::RankShard> shards = {
        attn_test::GatherShard(cases[0], attn_test::RandomPlacement(cases[0], nranks, 9, -1), rank)};
    StepBuffers b(shards, 2, shape.num_q_heads, Home::kDevice);
    b.upload(shards[0]);
    if (rank == 1) {  // kv_offsets {0, 5, 2}
      const int32_t bad[3] = {0, 5, 2};
      ASSERT_EQ(cudaMemcpyAsync(b.kvOff, bad, sizeof bad, cudaMemcpyHostToDevice, b.s), cudaSuccess);
    }
    // Accepted at the call (nothing of the layout is read then), failed when it runs.
    ASSERT_EQ(attnRingAttention(b.q, b.k, b.v, b.out, b.lse, &b.layout, &shape, attnModePassKV, comm,
                                (attnStream_t)b.s),
              attnSuccess)
        << attnGetLastError(comm);
    ASSERT_EQ(cudaStreamSynchronize(b.s), cudaSuccess);
    attnResult_t async = attnSuccess;
    ASSERT_EQ(attnCommGetAsyncError(comm, &async), attnSuccess);
    const std::string why = attnGetLastError(comm);
    if (rank == 1) {
      EXPECT_EQ(async, attnInvalidArgument) << why;
      EXPECT_NE(why.find("kv_offsets decreases"), std::string::npos) << why;
    } else {
      EXPECT_EQ(async, attnRemoteError) << why;
      EXPECT_NE(why.find("rank 1"), std::string::npos) << why;
    }

    // Half pageable: refused at the call, on every rank alike.
    std::vector<int32_t> hostPos = shards[0].q_pos;
    attnSeqLayout_t mixed = b.layout;
    mixed.q_pos = hostPos.data();
    EXPECT_EQ(attnRingAttention(b.q, b.k, b.v, b.out, b.lse, &mixed, &shape, attnModePassKV, comm,
                                (attnStream_t)b.s),
              attnInvalidArgument);
    const std::string refused = attnGetLastError(comm);
    EXPECT_NE(refused.find("pageable"), std::string::npos) << refused;
    ASSERT_EQ(cudaStreamSynchronize(b.s), cudaSuccess);
  }, OnGpu0(&cfg));
}

}  // namespace
