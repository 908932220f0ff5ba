// ATTN_CHECK=1 on device communicators (src/device/device_signature.h).
// Every backend exchanges a collective's signature before any of its data
// moves: cuda_ipc between threads and between processes, pinned staging in
// slices, staging across emulated hosts, and UCX with device memory where
// the installed UCX has it. So on each of them:
//  - matching calls still give exact results;
//  - mismatched calls fail on every rank (attnCommGetAsyncError gives
//    attnInvalidUsage naming the mismatch), with nothing written;
//  - a rank that refuses its arguments returns attnInvalidArgument, and its
//    peers' call fails naming it (attnRemoteError) instead of waiting for
//    it; the next call works everywhere.
// A device communicator's async error is sticky, so each failing case gets
// communicators of its own. On the emulated runtime in CI; skips without a
// GPU in the real-CUDA build.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "attncomm.h"
#include "src/device/backends/staging/stage_pipeline.h"
#include "src/device/backends/direct/transport_direct.h"
#include "support/device_checks.h"
#include "support/gpu.h"
#include "support/multirank.h"
#include "support/ucx_cuda.h"
#include "src/device/backends/cuda_ipc/ipc_stats.h"

namespace {

using attn_test::AsStream;
using attn_test::DevBuf;
using attn_test::RunOptions;
using attn_test::Sentinel;
using attn_test::TypedBuf;

// Which backend moves the collectives' data.
enum class Path { kCudaIpc, kStagedSlices, kUcxDirect };

struct Backend {
  const char* name;
  Path path;
  bool processes;
  std::vector<std::pair<std::string, std::string>> env;
  bool twoHosts = false;  // ranks alternate between two emulated hosts (ATTN_HOSTID)
};

void PrintTo(const Backend& b, std::ostream* os) { *os << b.name; }

const Backend kBackends[] = {
    {"CudaIpcThreads", Path::kCudaIpc, false, {}},
    {"CudaIpcProcesses", Path::kCudaIpc, true, {}},
    {"StagedInSlicesThreads", Path::kStagedSlices, false,
     {{"ATTN_TRANSPORT", "shm,tcp"}, {"ATTN_DEVICE_STAGE_CHUNK", "4096"}}},
    {"StagedAcrossHostsProcesses", Path::kStagedSlices, true, {{"ATTN_DEVICE_STAGE_CHUNK", "4096"}}, true},
    {"UcxDeviceMemoryThreads", Path::kUcxDirect, false, {{"ATTN_TRANSPORT", "ucx"}}},
};

// The counter that moves when `path` runs a collective (process-wide).
uint64_t PathCount(Path path) {
  switch (path) {
    case Path::kCudaIpc: return attn::ipc::ipcCounters().ops.load();
    case Path::kStagedSlices: return attn::stagedSlices().load();
    case Path::kUcxDirect: return attn::directCounters().ops.load();
  }
  return 0;
}

// Runs `body` on n ranks of a device communicator with ATTN_CHECK=1 over
// backend `b`.
template <class Body>
void OnBackend(const Backend& b, int n, Body body) {
  attnConfig_t cfg = ATTN_CONFIG_INITIALIZER;
  cfg.device = 0;
  cfg.timeout_ms = 30000;  // a regression fails, not hangs
  RunOptions o;
  o.config = &cfg;
  o.env = b.env;
  o.env.push_back({"ATTN_CHECK", "1"});
  o.deadline_ms = 120000;
  if (b.twoHosts)
    o.child_setup = [](int rank) { setenv("ATTN_HOSTID", ("check-host-" + std::to_string(rank % 2)).c_str(), 1); };
  auto run = [&](int rank, int nranks, attnComm_t& comm) {
    if (b.processes) attn_test::DevBufsFromCudaMalloc();
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    body(rank, nranks, comm, s);
    cudaStreamDestroy(s);
  };
  if (b.processes) {
    attn_test::RunProcesses(n, run, o);
  } else {
    attn_test::ScopedEnv env(o.env);  // UCX settings are read after init: keep them set
    attn_test::RunThreads(n, run, o);
  }
}

class DeviceCheck : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam().processes) {
      REQUIRE_FORKABLE_CUDA();
    } else {
      REQUIRE_GPU();
    }
    if (GetParam().path == Path::kUcxDirect) REQUIRE_UCX_CUDA();
  }
};

// An input of ones and an output of sentinels, uploaded on `s`.
struct InOut : attn_test::DevInOut {
  InOut(size_t inCount, size_t outCount, cudaStream_t s)
      : DevInOut(attnFloat32, inCount, outCount, [](size_t) { return 1.0; }, s) {}
};

// The async error once the stream's work has run.
attnResult_t AsyncAfter(attnComm_t comm, cudaStream_t s) {
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  attnResult_t async = attnInProgress;
  while (async == attnInProgress)
    if (attnCommGetAsyncError(comm, &async) != attnSuccess) return attnInternalError;
  return async;
}

// Also shows the backend is the one named: its counter moves.
TEST_P(DeviceCheck, MatchingCallsStayExact) {
  const Path path = GetParam().path;
  OnBackend(GetParam(), 3, [path](int rank, int n, attnComm_t comm, cudaStream_t) {
    const uint64_t before = PathCount(path);
    attn_test::CheckDevSuite(comm, rank, n);
    EXPECT_GT(PathCount(path), before) << "rank " << rank << ": the collectives took another backend";
  });
}

// The last rank disagrees with the others on one thing.
enum class Mismatch { kOp, kCount, kKind, kRoot };

TEST_P(DeviceCheck, MismatchedCallsFailEveryRankWithNothingWritten) {
  for (Mismatch m : {Mismatch::kOp, Mismatch::kCount, Mismatch::kKind, Mismatch::kRoot}) {
    SCOPED_TRACE("mismatch " + std::to_string(int(m)));
    OnBackend(GetParam(), 3, [m](int rank, int n, attnComm_t comm, cudaStream_t s) {
      const bool odd = rank == n - 1;
      InOut b(64, 64 * size_t(n), s);
      ASSERT_TRUE(b.ok());
      TypedBuf& out = b.out;
      DevBuf &din = b.din, &dout = b.dout;
      attnResult_t r = attnSuccess;
      switch (m) {
        case Mismatch::kOp:
          r = attnAllReduce(din.data(), dout.data(), 64, attnFloat32, odd ? attnMax : attnSum, comm, AsStream(s));
          break;
        case Mismatch::kCount:
          r = attnAllGather(din.data(), dout.data(), odd ? 9 : 8, attnFloat32, comm, AsStream(s));
          break;
        case Mismatch::kKind:
          r = odd ? attnAllGather(din.data(), dout.data(), 16, attnFloat32, comm, AsStream(s))
                  : attnAllReduce(din.data(), dout.data(), 16, attnFloat32, attnSum, comm, AsStream(s));
          break;
        case Mismatch::kRoot:
          r = attnReduce(din.data(), dout.data(), 64, attnFloat32, attnSum, odd ? 1 : 0, comm, AsStream(s));
          break;
      }
      ASSERT_EQ(r, attnSuccess) << "rank " << rank << ": the call itself is valid: " << attnGetLastError(comm);
      EXPECT_EQ(AsyncAfter(comm, s), attnInvalidUsage) << "rank " << rank << ": " << attnGetLastError(comm);
      const std::string why = attnGetLastError(comm);
      EXPECT_NE(why.find("mismatch"), std::string::npos) << "rank " << rank << ": " << why;
      dout.Download(&out, s);
      EXPECT_TRUE(out.GuardsIntact()) << "rank " << rank << ": write outside the receive buffer";
      EXPECT_TRUE(attn_test::BufEquals(out, 0, 64 * size_t(n), [](size_t) { return Sentinel(attnFloat32); }))
          << "rank " << rank << ": data moved although the collective was refused";
    });
  }
}

// Each collective refused by one rank (another rank each time): a reduction
// op out of range, a root out of range, a misplaced in-place send, a NULL
// receive buffer, an all-to-all in place, overlapping all-to-allv receive
// blocks, a reduce root out of range.
TEST_P(DeviceCheck, ArgumentsRefusedOnOneRankFailThePeersCallNamingIt) {
  for (int variant = 0; variant < 7; ++variant) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    OnBackend(GetParam(), 3, [variant](int rank, int n, attnComm_t comm, cudaStream_t s) {
      const int refuser = variant % n;
      const bool refuses = rank == refuser;
      InOut b(64 * size_t(n), 64 * size_t(n), s);
      ASSERT_TRUE(b.ok());
      float* src = static_cast<float*>(b.din.data());
      float* dst = static_cast<float*>(b.dout.data());
      std::vector<size_t> counts(n, 8), displs(n);
      for (int p = 0; p < n; ++p) displs[p] = 8 * p;
      std::vector<size_t> bad = displs;
      bad[0] = bad[1];
      const attnStream_t st = AsStream(s);
      attnResult_t r = attnSuccess;
      switch (variant) {
        case 0: r = attnAllReduce(src, dst, 16, attnFloat32, refuses ? attnRedOp_t(42) : attnSum, comm, st); break;
        case 1: r = attnBroadcast(src, dst, 16, attnFloat32, refuses ? n : 0, comm, st); break;
        case 2: r = attnAllGather(refuses ? dst + 1 : src, dst, 8, attnFloat32, comm, st); break;
        case 3: r = attnReduceScatter(src, refuses ? nullptr : dst, 8, attnFloat32, attnSum, comm, st); break;
        case 4: r = attnAllToAll(src, refuses ? src : dst, 8, attnFloat32, comm, st); break;
        case 5:
          r = attnAllToAllv(src, counts.data(), displs.data(), dst, counts.data(), refuses ? bad.data() : displs.data(),
                            attnFloat32, comm, st);
          break;
        case 6: r = attnReduce(src, dst, 16, attnFloat32, attnMax, refuses ? -2 : 1, comm, st); break;
      }
      const std::string what = "rank " + std::to_string(rank) + ": ";
      if (refuses) {
        EXPECT_EQ(r, attnInvalidArgument) << what << attnGetLastError(comm);
        EXPECT_EQ(AsyncAfter(comm, s), attnSuccess) << what << "its refusal went through: " << attnGetLastError(comm);
      } else {
        ASSERT_EQ(r, attnSuccess) << what << attnGetLastError(comm);
        EXPECT_EQ(AsyncAfter(comm, s), attnRemoteError) << what << attnGetLastError(comm);
        const std::string why = attnGetLastError(comm);
        EXPECT_NE(why.find("rank " + std::to_string(refuser) + " could not take part"), std::string::npos)
            << what << why;
      }
      // Every rank is still in step: the next call works.
      attn_test::CheckDevAllReduce(comm, rank, n, attnFloat32, attnSum, 100, s);
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceCheck, ::testing::ValuesIn(kBackends),
                         [](const ::testing::TestParamInfo<Backend>& info) { return std::string(info.param.name); });

}  // namespace
