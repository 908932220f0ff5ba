// The standard collectives (reduce included) against host-computed exact results: every type x
// every reduction op x odd counts at N=3 threads; an N sweep (1..8) with a few
// types; ranks as processes for N in {2,3,4,5,8}; the shm and tcp transports
// forced by ATTN_TRANSPORT; in-place variants; a few >= 4 MiB cases.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "attncomm.h"
#include "src/coll/algo_select.h"  // the all-to-all schedule rule
#include "src/core/comm.h"         // to confirm which transport a forced run used
#include "tests/support/multirank.h"

using namespace attn_test;

namespace {

constexpr size_t kCounts[] = {0, 1, 7, 1023, 65537};

std::string TypeParamName(const ::testing::TestParamInfo<attnDataType_t>& info) {
  return TypeName(info.param);
}

// Every op, every count, in and out of place: AllReduce, ReduceScatter and
// Reduce (its root moving with the count).
void ReductionMatrix(attnComm_t comm, int rank, int n, attnDataType_t t) {
  for (attnRedOp_t op : kAllOps)
    for (size_t count : kCounts)
      for (bool inPlace : {false, true}) {
        CheckAllReduce(comm, rank, n, t, op, count, inPlace);
        CheckReduceScatter(comm, rank, n, t, op, count, inPlace);
        CheckReduce(comm, rank, n, t, op, count, int(count % size_t(n)), inPlace);
        if (::testing::Test::HasFatalFailure()) return;
      }
  CheckReduce(comm, rank, n, t, attnSum, 77, n - 1, false, /*nullRecvOnNonRoot=*/true);
}

// AllGather, Broadcast from every root, AllToAll, AllToAllv, for every count.
void DataMovementMatrix(attnComm_t comm, int rank, int n, attnDataType_t t) {
  for (size_t count : kCounts) {
    for (bool inPlace : {false, true}) {
      CheckAllGather(comm, rank, n, t, count, inPlace);
      for (int root = 0; root < n; ++root) CheckBroadcast(comm, rank, n, t, count, root, inPlace);
    }
    CheckAllToAll(comm, rank, n, t, count);
    if (::testing::Test::HasFatalFailure()) return;
  }
  CheckBroadcast(comm, rank, n, t, 77, n - 1, false, /*nullSendOnNonRoot=*/true);
  for (size_t scale : {0, 1, 5, 3001}) CheckAllToAllv(comm, rank, n, t, scale);
}

// ---------------------------------------------------------------------------
// Full type x op x count matrix at N = 3 threads.

class TypeMatrix : public ::testing::TestWithParam<attnDataType_t> {};

TEST_P(TypeMatrix, ReductionsAllOpsAllCountsThreadsN3) {
  const attnDataType_t t = GetParam();
  RunThreads(3, [&](int rank, int n, attnComm_t& comm) { ReductionMatrix(comm, rank, n, t); });
}

TEST_P(TypeMatrix, DataMovementAllCountsThreadsN3) {
  const attnDataType_t t = GetParam();
  RunThreads(3, [&](int rank, int n, attnComm_t& comm) {
    DataMovementMatrix(comm, rank, n, t);
  });
}

INSTANTIATE_TEST_SUITE_P(AllTypes, TypeMatrix, ::testing::ValuesIn(kAllTypes), TypeParamName);

TEST(Collectives, BarrierThreadsN3) {
  std::atomic<int64_t> counter{0};
  RunThreads(3, [&](int rank, int n, attnComm_t& comm) { CheckBarrier(comm, rank, n, counter, 5); });
}

// ---------------------------------------------------------------------------
// N sweep with threads: N in {1,2,3,4,5,8} x a few types.

using SweepParam = std::tuple<int, attnDataType_t>;

class NSweepThreads : public ::testing::TestWithParam<SweepParam> {};

void SweepBody(attnComm_t comm, int rank, int n, attnDataType_t t, std::atomic<int64_t>& counter) {
  const bool allOps = t == attnFloat32;
  for (size_t count : kCounts) {
    for (attnRedOp_t op : kAllOps) {
      if (!allOps && op != attnSum && op != attnMax && op != attnAvg) continue;
      if (count == 65537 && op != attnSum && op != attnAvg) continue;
      CheckAllReduce(comm, rank, n, t, op, count, false);
      CheckReduceScatter(comm, rank, n, t, op, count, false);
      CheckReduce(comm, rank, n, t, op, count, int((count + size_t(op)) % size_t(n)), false);
    }
    CheckAllGather(comm, rank, n, t, count, false);
    CheckAllToAll(comm, rank, n, t, count);
    if (count <= 1023)
      for (int root = 0; root < n; ++root) {
        CheckBroadcast(comm, rank, n, t, count, root, false);
        CheckReduce(comm, rank, n, t, attnSum, count, root, root == 0);
      }
    if (::testing::Test::HasFatalFailure()) return;
  }
  CheckBroadcast(comm, rank, n, t, 65537, n / 2, false);
  // In place, once each.
  CheckAllReduce(comm, rank, n, t, attnMin, 1023, true);
  CheckReduceScatter(comm, rank, n, t, attnSum, 1023, true);
  CheckAllGather(comm, rank, n, t, 1023, true);
  CheckBroadcast(comm, rank, n, t, 1023, n - 1, true);
  for (size_t scale : {0, 1, 7, 1023}) CheckAllToAllv(comm, rank, n, t, scale);
  CheckBarrier(comm, rank, n, counter, 2);
}

TEST_P(NSweepThreads, AllCollectives) {
  const auto [n, t] = GetParam();
  std::atomic<int64_t> counter{0};
  // Bindings are copied into the lambda: clang 14 cannot capture them.
  RunThreads(n, [&, t = t](int rank, int nr, attnComm_t& comm) {
    SweepBody(comm, rank, nr, t, counter);
  });
}

INSTANTIATE_TEST_SUITE_P(
    Sweep, NSweepThreads,
    ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 8),
                       ::testing::Values(attnFloat32, attnInt32, attnBfloat16)),
    [](const ::testing::TestParamInfo<SweepParam>& info) {
      return "N" + std::to_string(std::get<0>(info.param)) + "_" +
             TypeName(std::get<1>(info.param));
    });

// ---------------------------------------------------------------------------
// Ranks as processes: N in {2,3,4,5,8}, fewer types.

class NSweepProcesses : public ::testing::TestWithParam<int> {};

void ProcessBody(attnComm_t comm, int rank, int n, std::atomic<int64_t>& counter) {
  for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(1023), size_t(65537)}) {
    CheckAllReduce(comm, rank, n, attnFloat32, attnSum, count, false);
    CheckReduceScatter(comm, rank, n, attnFloat32, attnMax, count, false);
    CheckAllGather(comm, rank, n, attnFloat32, count, false);
    CheckAllToAll(comm, rank, n, attnFloat32, count);
    CheckBroadcast(comm, rank, n, attnFloat32, count, int(count % size_t(n)), false);
    CheckReduce(comm, rank, n, attnFloat32, attnSum, count, int((count + 1) % size_t(n)), count == 7);
    if (::testing::Test::HasFatalFailure()) return;
  }
  for (attnDataType_t t : {attnInt8, attnFloat16}) {
    for (attnRedOp_t op : kAllOps) CheckAllReduce(comm, rank, n, t, op, 1023, false);
    CheckReduceScatter(comm, rank, n, t, attnAvg, 7, false);
    CheckAllGather(comm, rank, n, t, 1023, true);
    for (int root = 0; root < n; ++root) CheckBroadcast(comm, rank, n, t, 7, root, root % 2 == 0);
    CheckAllToAll(comm, rank, n, t, 7);
  }
  CheckAllReduce(comm, rank, n, attnInt64, attnProd, 1023, true);
  CheckReduceScatter(comm, rank, n, attnFloat64, attnMin, 1023, true);
  for (size_t scale : {0, 1, 1023}) CheckAllToAllv(comm, rank, n, attnFloat32, scale);
  CheckBarrier(comm, rank, n, counter, 3);
}

TEST_P(NSweepProcesses, AllCollectives) {
  const int n = GetParam();
  SharedCounters counter(1);
  RunOptions opts;
  opts.deadline_ms = 180000;
  RunProcesses(n, [&](int rank, int nr, attnComm_t& comm) { ProcessBody(comm, rank, nr, counter[0]); },
               opts);
}

INSTANTIATE_TEST_SUITE_P(Sweep, NSweepProcesses, ::testing::Values(2, 3, 4, 5, 8),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "N" + std::to_string(info.param);
                         });

// Every type as processes at N = 3 (reductions with every op, small counts).
class TypeProcesses : public ::testing::TestWithParam<attnDataType_t> {};

TEST_P(TypeProcesses, N3) {
  const attnDataType_t t = GetParam();
  RunProcesses(3, [&](int rank, int n, attnComm_t& comm) {
    for (attnRedOp_t op : kAllOps) {
      CheckAllReduce(comm, rank, n, t, op, 1023, op == attnMax);
      CheckReduceScatter(comm, rank, n, t, op, 7, op == attnMin);
      CheckReduce(comm, rank, n, t, op, 1023, int(op) % n, op == attnProd);
    }
    CheckAllGather(comm, rank, n, t, 65537, false);
    for (int root = 0; root < n; ++root) CheckBroadcast(comm, rank, n, t, 1023, root, root == 1);
    CheckAllToAll(comm, rank, n, t, 1023);
    CheckAllToAllv(comm, rank, n, t, 13);
    CheckRingExchange(comm, rank, n, t, 1023);
  });
}

INSTANTIATE_TEST_SUITE_P(AllTypes, TypeProcesses, ::testing::ValuesIn(kAllTypes), TypeParamName);

// ---------------------------------------------------------------------------
// Forced transports (ATTN_TRANSPORT), threads and processes.

using TransportParam = std::tuple<std::string, bool>;  // transport, processes?

class ForcedTransport : public ::testing::TestWithParam<TransportParam> {};

void TransportBody(attnComm_t comm, int rank, int n, const std::string& transport,
                   std::atomic<int64_t>& counter) {
  // The forced transport is the one in use for every peer.
  for (int p = 0; p < n; ++p) {
    if (p == rank) continue;
    ASSERT_NE(comm->engine, nullptr);
    EXPECT_EQ(std::string(comm->engine->transportName(p)), transport)
        << "rank " << rank << " reaches peer " << p << " by another transport";
  }
  for (size_t count : {size_t(1), size_t(7), size_t(65537), size_t(300001)}) {
    CheckAllReduce(comm, rank, n, attnFloat32, attnSum, count, false);
    CheckAllGather(comm, rank, n, attnInt32, count, false);
    CheckReduceScatter(comm, rank, n, attnBfloat16, attnMax, count, count == 7);
    CheckBroadcast(comm, rank, n, attnUint8, count, 1 % n, false);
    CheckReduce(comm, rank, n, attnFloat32, attnAvg, count, n - 1, count == 65537);
    CheckAllToAll(comm, rank, n, attnFloat64, count);
  }
  CheckAllToAllv(comm, rank, n, attnInt8, 1001);
  CheckRingExchange(comm, rank, n, attnFloat16, 100003);
  CheckBarrier(comm, rank, n, counter, 2);
}

TEST_P(ForcedTransport, N3) {
  const auto [transport, processes] = GetParam();
  RunOptions opts;
  opts.env = {{"ATTN_TRANSPORT", transport}};
  opts.deadline_ms = 180000;
  if (processes) {
    SharedCounters counter(1);
    RunProcesses(3, [&, transport = transport](int rank, int n, attnComm_t& comm) {
      TransportBody(comm, rank, n, transport, counter[0]);
    }, opts);
  } else {
    std::atomic<int64_t> counter{0};
    RunThreads(3, [&, transport = transport](int rank, int n, attnComm_t& comm) {
      TransportBody(comm, rank, n, transport, counter);
    }, opts);
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, ForcedTransport,
                         ::testing::Combine(::testing::Values("shm", "tcp"), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<TransportParam>& info) {
                           return std::get<0>(info.param) +
                                  (std::get<1>(info.param) ? "_processes" : "_threads");
                         });

// The same through attnConfig_t.transports instead of the environment.
TEST(ForcedTransportConfig, TcpThreadsN4) {
  attnConfig_t cfg = ATTN_CONFIG_INITIALIZER;
  cfg.transports = "tcp";
  RunOptions opts;
  opts.config = &cfg;
  RunThreads(4, [&](int rank, int n, attnComm_t& comm) {
    for (int p = 0; p < n; ++p)
      if (p != rank) EXPECT_STREQ(comm->engine->transportName(p), "tcp");
    CheckAllReduce(comm, rank, n, attnFloat32, attnAvg, 65537, true);
    CheckAllToAllv(comm, rank, n, attnInt64, 333);
  }, opts);
}

// Both reduce algorithms forced (ATTN_REDUCE_ALGO), every root, in and out of
// place, counts from empty to several chain chunks and uneven slices; over
// tcp between processes too (where auto always runs the chain).
class ForcedReduce : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(ForcedReduce, EveryRootN4) {
  const auto [algo, processes] = GetParam();
  RunOptions opts;
  opts.env = {{"ATTN_REDUCE_ALGO", algo}, {"ATTN_CHUNK_SIZE", "8192"}};
  if (processes) opts.env.push_back({"ATTN_TRANSPORT", "tcp"});
  opts.deadline_ms = 180000;
  auto body = [](int rank, int n, attnComm_t& comm) {
    for (int root = 0; root < n; ++root)
      for (size_t count : {size_t(0), size_t(3), size_t(1023), size_t(30011)}) {
        CheckReduce(comm, rank, n, attnFloat32, attnSum, count, root, root % 2 == 1);
        CheckReduce(comm, rank, n, attnBfloat16, attnAvg, count, root, false);
        CheckReduce(comm, rank, n, attnInt64, attnMin, count, root, root == 0, /*nullRecvOnNonRoot=*/true);
        if (::testing::Test::HasFatalFailure()) return;
      }
  };
  ScopedEnv env(opts.env);  // read at every call
  if (processes) RunProcesses(4, body, opts);
  else RunThreads(4, body, opts);
}

INSTANTIATE_TEST_SUITE_P(Algos, ForcedReduce,
                         ::testing::Combine(::testing::Values("tree", "chain", "scatter", "direct"), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, bool>>& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) ? "_processes_tcp" : "_threads");
                         });

// The binomial tree where n is not a power of two (ranks whose subtrees are
// cut short), and the direct reduce, with every rank the root once.
class ForcedReduceOddSizes : public ::testing::TestWithParam<std::string> {};

TEST_P(ForcedReduceOddSizes, EveryRoot) {
  ScopedEnv env(std::vector<std::pair<std::string, std::string>>{{"ATTN_REDUCE_ALGO", GetParam()}});
  for (int n : {3, 5, 6, 7}) {
    RunThreads(n, [](int rank, int n, attnComm_t& comm) {
      for (int root = 0; root < n; ++root) {
        CheckReduce(comm, rank, n, attnFloat64, attnSum, 777, root, root % 2 == 0);
        CheckReduce(comm, rank, n, attnFloat16, attnAvg, 64, root, false, /*nullRecvOnNonRoot=*/true);
        CheckReduce(comm, rank, n, attnUint8, attnMax, 1, root, true);
        if (::testing::Test::HasFatalFailure()) return;
      }
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Algos, ForcedReduceOddSizes, ::testing::Values("tree", "direct"));

// Both all-reduce algorithms forced (ATTN_ALLREDUCE_ALGO) at every N from 1
// to 8: recursive doubling where N is not a power of two folds the first
// ranks in pairs before and after; counts span empty to past the auto limit.
class ForcedAllReduce : public ::testing::TestWithParam<std::string> {};

TEST_P(ForcedAllReduce, EveryNThreads) {
  ScopedEnv env(std::vector<std::pair<std::string, std::string>>{{"ATTN_ALLREDUCE_ALGO", GetParam()}});
  for (int n = 1; n <= 8; ++n) {
    RunThreads(n, [](int rank, int n, attnComm_t& comm) {
      for (size_t count : {size_t(0), size_t(1), size_t(33), size_t(20001)}) {
        CheckAllReduce(comm, rank, n, attnFloat32, attnSum, count, count % 2 == 1);
        CheckAllReduce(comm, rank, n, attnBfloat16, attnAvg, count, false);
        CheckAllReduce(comm, rank, n, attnInt64, attnMin, count, true);
        CheckAllReduce(comm, rank, n, attnUint8, attnProd, count, false);
        if (::testing::Test::HasFatalFailure()) return;
      }
    });
  }
}

// Between processes over tcp and over shm, N = 5 (three pairs fold).
TEST_P(ForcedAllReduce, ProcessesN5) {
  for (const char* transport : {"tcp", "shm"}) {
    RunOptions opts;
    opts.env = {{"ATTN_ALLREDUCE_ALGO", GetParam()}, {"ATTN_TRANSPORT", transport}};
    opts.deadline_ms = 180000;
    ScopedEnv env(opts.env);
    RunProcesses(5, [](int rank, int n, attnComm_t& comm) {
      for (size_t count : {size_t(7), size_t(4099), size_t(70001)}) {
        CheckAllReduce(comm, rank, n, attnFloat32, attnSum, count, count == 7);
        CheckAllReduce(comm, rank, n, attnFloat16, attnMax, count, true);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }, opts);
  }
}

// Inputs whose sums round: every rank must still end with the same bits
// (engines compare or reuse the result on every rank), and near the exact sum.
TEST_P(ForcedAllReduce, EveryRankGetsTheSameBits) {
  ScopedEnv env(std::vector<std::pair<std::string, std::string>>{{"ATTN_ALLREDUCE_ALGO", GetParam()}});
  for (int n : {3, 4, 6}) {
    RunThreads(n, [](int rank, int n, attnComm_t& comm) {
      constexpr size_t kCount = 1000;
      auto input = [](int r, size_t i) {
        uint32_t h = uint32_t(r) * 2654435761u ^ uint32_t(i) * 40503u;
        h ^= h >> 13;
        h *= 0x5bd1e995u;
        return (float(h % 2000003u) / 2000003.0f - 0.5f) * float(1 + (i % 7) * 1000);
      };
      std::vector<float> in(kCount), out(kCount), all(kCount * size_t(n));
      for (size_t i = 0; i < kCount; ++i) in[i] = input(rank, i);
      ASSERT_EQ(attnAllReduce(in.data(), out.data(), kCount, attnFloat32, attnSum, comm, nullptr), attnSuccess)
          << attnGetLastError(comm);
      ASSERT_EQ(attnAllGather(out.data(), all.data(), kCount, attnFloat32, comm, nullptr), attnSuccess)
          << attnGetLastError(comm);
      for (int r = 1; r < n; ++r)
        ASSERT_EQ(std::memcmp(all.data(), all.data() + size_t(r) * kCount, kCount * sizeof(float)), 0)
            << "rank " << r << "'s result differs from rank 0's";
      for (size_t i = 0; i < kCount; ++i) {
        double exact = 0, mag = 0;
        for (int r = 0; r < n; ++r) exact += input(r, i), mag += std::fabs(input(r, i));
        ASSERT_NEAR(out[i], exact, 1e-6 * mag * n + 1e-30) << "element " << i;
      }
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Algos, ForcedAllReduce, ::testing::Values("doubling", "scatter"));

// Every broadcast algorithm forced (ATTN_BROADCAST_ALGO) at every N from 1
// to 8, every root: the tree where N is not a power of two has subtrees cut
// short; counts reach past several chain chunks.
class ForcedBroadcast : public ::testing::TestWithParam<std::string> {};

TEST_P(ForcedBroadcast, EveryNEveryRootThreads) {
  RunOptions opts;
  opts.env = {{"ATTN_BROADCAST_ALGO", GetParam()}, {"ATTN_CHUNK_SIZE", "8192"}};
  ScopedEnv env(opts.env);
  for (int n = 1; n <= 8; ++n) {
    RunThreads(n, [](int rank, int n, attnComm_t& comm) {
      for (int root = 0; root < n; ++root)
        for (size_t count : {size_t(0), size_t(1), size_t(4097)}) {
          CheckBroadcast(comm, rank, n, attnFloat32, count, root, root % 2 == 0);
          CheckBroadcast(comm, rank, n, attnBfloat16, count, root, false, /*nullSendOnNonRoot=*/true);
          if (::testing::Test::HasFatalFailure()) return;
        }
    }, opts);
  }
}

TEST_P(ForcedBroadcast, ProcessesN5) {
  for (const char* transport : {"tcp", "shm"}) {
    RunOptions opts;
    opts.env = {{"ATTN_BROADCAST_ALGO", GetParam()}, {"ATTN_TRANSPORT", transport}};
    opts.deadline_ms = 180000;
    ScopedEnv env(opts.env);
    RunProcesses(5, [](int rank, int n, attnComm_t& comm) {
      for (int root : {0, 3})
        for (size_t count : {size_t(5), size_t(70001)}) {
          CheckBroadcast(comm, rank, n, attnInt32, count, root, root == 3);
          if (::testing::Test::HasFatalFailure()) return;
        }
    }, opts);
  }
}

INSTANTIATE_TEST_SUITE_P(Algos, ForcedBroadcast, ::testing::Values("tree", "chain", "direct"));

// ---------------------------------------------------------------------------
// At least 4 MiB per buffer.

TEST(Large, FourMiBThreadsN3) {
  const size_t f32 = (size_t(4) << 20) / 4 + 3;  // 4 MiB + 12 bytes of float32
  RunThreads(3, [&](int rank, int n, attnComm_t& comm) {
    CheckAllReduce(comm, rank, n, attnFloat32, attnSum, f32, false);
    CheckAllReduce(comm, rank, n, attnBfloat16, attnAvg, (size_t(4) << 20) / 2 + 1, true);
    CheckReduceScatter(comm, rank, n, attnFloat64, attnMax, (size_t(4) << 20) / 8 + 1, false);
    CheckAllGather(comm, rank, n, attnInt8, (size_t(4) << 20) + 5, true);
    CheckBroadcast(comm, rank, n, attnUint8, (size_t(4) << 20) + 1, 2, false);
    // Many more chunks than the chain's window of slots.
    CheckReduce(comm, rank, n, attnFloat32, attnSum, f32, 1, true);
    CheckReduce(comm, rank, n, attnBfloat16, attnMax, (size_t(4) << 20) / 2 + 1, 0, false);
    CheckAllToAll(comm, rank, n, attnInt32, (size_t(4) << 20) / 4 / 3 + 7);
  });
}

TEST(Large, FourMiBProcessesN2) {
  const size_t f32 = (size_t(4) << 20) / 4 + 3;
  RunOptions opts;
  opts.deadline_ms = 180000;
  RunProcesses(2, [&](int rank, int n, attnComm_t& comm) {
    CheckAllReduce(comm, rank, n, attnFloat32, attnSum, f32, false);
    CheckAllGather(comm, rank, n, attnFloat16, (size_t(4) << 20) / 2 + 9, false);
    CheckBroadcast(comm, rank, n, attnInt64, (size_t(4) << 20) / 8 + 1, 1, true);
    CheckReduce(comm, rank, n, attnFloat32, attnSum, f32, 0, false);
    CheckRingExchange(comm, rank, n, attnFloat32, f32);
  }, opts);
}

// ---------------------------------------------------------------------------
// Buffers from attnMemAlloc, ranks as processes: shm peers map each other's
// regions instead of copying with CMA (transports/shm/shm_peer_regions.h).
// Every collective, odd counts, in and out of place; with a cache of one
// region per peer, mappings are dropped and made again all the time.

class ShareableBuffers : public ::testing::TestWithParam<const char*> {};  // ATTN_SHM_MAP_CACHE

TEST_P(ShareableBuffers, ProcessesN4) {
  RunOptions opts;
  opts.env = {{"ATTN_SHM_MAP_CACHE", GetParam()}};
  opts.deadline_ms = 180000;
  RunProcesses(4, [&](int rank, int n, attnComm_t& comm) {
    UseShareableBuffers(true);
    for (size_t count : {size_t(7), size_t(65537), size_t(300001)}) {
      CheckAllGather(comm, rank, n, attnInt32, count, count == 7);
      CheckAllToAll(comm, rank, n, attnFloat32, count);
      CheckAllReduce(comm, rank, n, attnFloat32, attnSum, count, count == 65537);
      CheckReduceScatter(comm, rank, n, attnBfloat16, attnMax, count, false);
      CheckBroadcast(comm, rank, n, attnUint8, count, 1, count == 300001);
      CheckReduce(comm, rank, n, attnInt32, attnSum, count, 2, count == 7);
    }
    CheckAllToAllv(comm, rank, n, attnInt8, 100001);
    CheckRingExchange(comm, rank, n, attnFloat16, 100003);
    UseShareableBuffers(false);
  }, opts);
}

INSTANTIATE_TEST_SUITE_P(MapCache, ShareableBuffers, ::testing::Values("64", "1"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string("Cache") + info.param;
                         });

// ---------------------------------------------------------------------------
// A long mixed sequence: every rank issues the same varied program; results
// must stay exact and ordered.

TEST(Collectives, MixedSequenceThreadsN4) {
  std::atomic<int64_t> counter{0};
  RunThreads(4, [&](int rank, int n, attnComm_t& comm) {
    for (int step = 0; step < 60; ++step) {
      const attnDataType_t t = kAllTypes[step % 8];
      const attnRedOp_t op = kAllOps[(step / 8) % 5];
      const size_t count = size_t((step * 7919) % 3001);
      switch (step % 7) {
        case 0: CheckAllReduce(comm, rank, n, t, op, count, step % 4 == 0); break;
        case 1: CheckReduceScatter(comm, rank, n, t, op, count, step % 4 == 1); break;
        case 2: CheckAllGather(comm, rank, n, t, count, step % 4 == 2); break;
        case 3: CheckBroadcast(comm, rank, n, t, count, step % n, step % 4 == 3); break;
        case 4: CheckAllToAll(comm, rank, n, t, count % 500); break;
        case 5: CheckAllToAllv(comm, rank, n, t, count % 97); break;
        case 6: CheckReduce(comm, rank, n, t, op, count, (step / 7) % n, step % 3 == 0); break;
      }
      if (::testing::Test::HasFatalFailure()) return;
    }
    CheckBarrier(comm, rank, n, counter, 1);
  });
}

// Several communicators at once in one process: two InitAll sets, used
// alternately from the same threads.
TEST(Collectives, TwoCommunicatorsInterleavedThreads) {
  const int n = 3;
  std::vector<attnComm_t> a(n), b(n);
  ATTN_ASSERT_OK(nullptr, attnCommInitAll(a.data(), n, nullptr));
  ATTN_ASSERT_OK(nullptr, attnCommInitAll(b.data(), n, nullptr));
  RunThreadsRaw(n, [&](int rank) {
    for (int i = 0; i < 5; ++i) {
      CheckAllReduce(a[rank], rank, n, attnFloat32, attnSum, 1023 + i, false);
      CheckAllGather(b[rank], rank, n, attnInt32, 7 + i, false);
    }
    EXPECT_EQ(attnCommDestroy(a[rank]), attnSuccess);
    EXPECT_EQ(attnCommDestroy(b[rank]), attnSuccess);
  });
}

// ---------------------------------------------------------------------------
// All-to-all schedules (ATTN_ALLTOALL): concurrent and stepped.

TEST(AllToAllSchedule, AutoStepsOnlyOffShmForLargeBlocks) {
  using attn::AllToAllSchedule;
  using attn::AllToAllSetting;
  const size_t big = attn::kSteppedMinBlock, small = attn::kSteppedMinBlock - 1;
  EXPECT_EQ(attn::chooseAllToAllSchedule(AllToAllSetting::kAuto, false, big), AllToAllSchedule::kStepped);
  EXPECT_EQ(attn::chooseAllToAllSchedule(AllToAllSetting::kAuto, false, small),
            AllToAllSchedule::kConcurrent);
  EXPECT_EQ(attn::chooseAllToAllSchedule(AllToAllSetting::kAuto, true, big), AllToAllSchedule::kConcurrent);
  EXPECT_EQ(attn::chooseAllToAllSchedule(AllToAllSetting::kStepped, true, 0), AllToAllSchedule::kStepped);
  EXPECT_EQ(attn::chooseAllToAllSchedule(AllToAllSetting::kConcurrent, false, big),
            AllToAllSchedule::kConcurrent);
}

void AllToAllMatrix(attnComm_t comm, int rank, int n) {
  for (attnDataType_t t : {attnInt8, attnFloat32, attnFloat64})
    for (size_t count : {size_t(0), size_t(1), size_t(1023), size_t(70001)}) {
      CheckAllToAll(comm, rank, n, t, count);
      if (::testing::Test::HasFatalFailure()) return;
    }
  for (size_t scale : {0, 1, 13, 5003}) CheckAllToAllv(comm, rank, n, attnInt32, scale);
}

// Every rank stepped, as threads (shm) and over TCP processes. The
// setting is read at every call, so threads need it for the whole run.
TEST(AllToAllSchedule, SteppedThreadsAndTcpProcesses) {
  ScopedEnv stepped(std::vector<std::pair<std::string, std::string>>{{"ATTN_ALLTOALL", "stepped"}});
  for (int n : {2, 3, 5}) RunThreads(n, [](int rank, int n, attnComm_t& comm) { AllToAllMatrix(comm, rank, n); });
  RunOptions o;
  o.env = {{"ATTN_TRANSPORT", "tcp"}};
  RunProcesses(4, [](int rank, int n, attnComm_t& comm) { AllToAllMatrix(comm, rank, n); }, o);
}

// Ranks may disagree on the schedule: each pair still exchanges one
// message each way. Even ranks step, odd ranks post everything at once.
TEST(AllToAllSchedule, MixedSchedulesAgree) {
  RunOptions o;
  o.child_setup = [](int rank) { setenv("ATTN_ALLTOALL", rank % 2 ? "concurrent" : "stepped", 1); };
  RunProcesses(5, [](int rank, int n, attnComm_t& comm) { AllToAllMatrix(comm, rank, n); }, o);
}

TEST(AllToAllSchedule, UnknownSettingIsInvalidArgument) {
  ScopedEnv bad(std::vector<std::pair<std::string, std::string>>{{"ATTN_ALLTOALL", "sideways"}});
  RunThreads(2, [](int rank, int n, attnComm_t& comm) {
    std::vector<float> in(n), out(n);
    EXPECT_EQ(attnAllToAll(in.data(), out.data(), 1, attnFloat32, comm, nullptr), attnInvalidArgument);
    EXPECT_NE(std::string(attnGetLastError(comm)).find("ATTN_ALLTOALL"), std::string::npos)
        << attnGetLastError(comm);
    (void)rank;
  });
}

}  // namespace
