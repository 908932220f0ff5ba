// Point-to-point: attnSend / attnRecv inside and outside groups. Ring
// exchange for every type and odd counts, self send/recv, all-pairs with
// uneven sizes, posting-order matching, one thread driving every rank in one
// group, collectives inside groups, ranks as threads and as processes over
// shm and tcp, and the size-mismatch rule.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <tuple>
#include <vector>

#include "attncomm.h"
#include "tests/support/multirank.h"

using namespace attn_test;

namespace {

constexpr size_t kCounts[] = {0, 1, 7, 1023, 65537};

// ---------------------------------------------------------------------------
// Ring exchange, every type and count, threads.

using RingParam = std::tuple<int, attnDataType_t>;
class RingThreads : public ::testing::TestWithParam<RingParam> {};

TEST_P(RingThreads, EveryCount) {
  const auto [n, t] = GetParam();
  RunThreads(n, [&, t = t](int rank, int nr, attnComm_t& comm) {
    for (size_t count : kCounts) CheckRingExchange(comm, rank, nr, t, count);
  });
}

INSTANTIATE_TEST_SUITE_P(
    Types, RingThreads,
    ::testing::Combine(::testing::Values(3), ::testing::ValuesIn(kAllTypes)),
    [](const ::testing::TestParamInfo<RingParam>& info) {
      return "N" + std::to_string(std::get<0>(info.param)) + "_" + TypeName(std::get<1>(info.param));
    });
INSTANTIATE_TEST_SUITE_P(
    Sizes, RingThreads,
    ::testing::Combine(::testing::Values(1, 2, 4, 5, 8), ::testing::Values(attnFloat32)),
    [](const ::testing::TestParamInfo<RingParam>& info) {
      return "N" + std::to_string(std::get<0>(info.param)) + "_" + TypeName(std::get<1>(info.param));
    });

// ---------------------------------------------------------------------------
// Self send/recv in a group, alone and mixed with real peers.

TEST(P2p, SelfSendRecvInGroup) {
  RunThreads(3, [&](int rank, int n, attnComm_t& comm) {
    for (size_t count : kCounts) {
      TypedBuf send(attnInt64, count), recv(attnInt64, count);
      for (size_t i = 0; i < count; ++i) send.Set(i, Pattern(attnInt64, rank + 10, i));
      recv.Fill(Sentinel(attnInt64));
      ATTN_ASSERT_OK(comm, attnGroupStart());
      ATTN_ASSERT_OK(comm, attnRecv(recv.data(), count, attnInt64, rank, comm, nullptr));
      ATTN_ASSERT_OK(comm, attnSend(send.data(), count, attnInt64, rank, comm, nullptr));
      ATTN_ASSERT_OK(comm, attnGroupEnd());
      EXPECT_TRUE(BufEquals(recv, 0, count, [&](size_t i) { return Pattern(attnInt64, rank + 10, i); }))
          << "self exchange of " << count << " on rank " << rank;
    }
    // Self and both neighbours in one group, two self messages in order.
    const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    TypedBuf s1(attnFloat32, 100), s2(attnFloat32, 33), sn(attnFloat32, 1000);
    TypedBuf r1(attnFloat32, 100), r2(attnFloat32, 33), rp(attnFloat32, 1000);
    for (size_t i = 0; i < 100; ++i) s1.Set(i, Pattern(attnFloat32, 1, i));
    for (size_t i = 0; i < 33; ++i) s2.Set(i, Pattern(attnFloat32, 2, i));
    for (size_t i = 0; i < 1000; ++i) sn.Set(i, Pattern(attnFloat32, rank + 100, i));
    ATTN_ASSERT_OK(comm, attnGroupStart());
    ATTN_ASSERT_OK(comm, attnSend(s1.data(), 100, attnFloat32, rank, comm, nullptr));
    ATTN_ASSERT_OK(comm, attnSend(sn.data(), 1000, attnFloat32, next, comm, nullptr));
    ATTN_ASSERT_OK(comm, attnRecv(r1.data(), 100, attnFloat32, rank, comm, nullptr));
    ATTN_ASSERT_OK(comm, attnRecv(rp.data(), 1000, attnFloat32, prev, comm, nullptr));
    ATTN_ASSERT_OK(comm, attnSend(s2.data(), 33, attnFloat32, rank, comm, nullptr));
    ATTN_ASSERT_OK(comm, attnRecv(r2.data(), 33, attnFloat32, rank, comm, nullptr));
    ATTN_ASSERT_OK(comm, attnGroupEnd());
    EXPECT_TRUE(BufEquals(r1, 0, 100, [&](size_t i) { return Pattern(attnFloat32, 1, i); }));
    EXPECT_TRUE(BufEquals(r2, 0, 33, [&](size_t i) { return Pattern(attnFloat32, 2, i); }));
    EXPECT_TRUE(BufEquals(rp, 0, 1000, [&](size_t i) { return Pattern(attnFloat32, prev + 100, i); }));
  });
}

// Self sends and receives that do not pair up fail the group with
// attnInvalidUsage, but only after its messages to the other ranks have
// run: the neighbours' groups complete with the data, and the communicator
// stays usable. (Before, the group returned with those messages still
// posted on memory it freed: a crash, found by python_coll_fuzz.)
TEST(P2p, UnpairedSelfSendFailsTheGroupAfterItsPeerMessages) {
  RunThreads(3, [&](int rank, int n, attnComm_t& comm) {
    const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    for (int variant = 0; variant < 2; ++variant) {
      const bool bad = rank == 1;
      TypedBuf sn(attnInt32, 5000), rp(attnInt32, 5000), self(attnInt32, 8), selfIn(attnInt32, 4);
      for (size_t i = 0; i < 5000; ++i) sn.Set(i, Pattern(attnInt32, rank, i));
      rp.Fill(Sentinel(attnInt32));
      ATTN_ASSERT_OK(comm, attnGroupStart());
      ATTN_ASSERT_OK(comm, attnSend(sn.data(), 5000, attnInt32, next, comm, nullptr));
      if (bad) {
        ATTN_ASSERT_OK(comm, attnSend(self.data(), 8, attnInt32, rank, comm, nullptr));
        if (variant == 1)  // a receive of another size
          ATTN_ASSERT_OK(comm, attnRecv(selfIn.data(), 4, attnInt32, rank, comm, nullptr));
      }
      ATTN_ASSERT_OK(comm, attnRecv(rp.data(), 5000, attnInt32, prev, comm, nullptr));
      const attnResult_t r = attnGroupEnd();
      const std::string why = attnGetLastError(comm);
      if (bad) {
        EXPECT_EQ(r, attnInvalidUsage) << why;
        EXPECT_NE(why.find(variant == 0 ? "1 send(s) to self but 0 receive(s)" : "met a receive of 16 bytes"),
                  std::string::npos)
            << why;
      } else {
        EXPECT_EQ(r, attnSuccess) << why;
      }
      EXPECT_TRUE(BufEquals(rp, 0, 5000, [&](size_t i) { return Pattern(attnInt32, prev, i); }))
          << "rank " << rank << ", variant " << variant;
      CheckAllReduce(comm, rank, n, attnInt32, attnSum, 10, false);  // still usable
    }
  }, RunOptions{30000});
}

// A self send outside a group cannot match; it must fail, not hang.
TEST(P2p, SelfSendOutsideGroupFailsFast) {
  RunThreads(2, [&](int rank, int n, attnComm_t& comm) {
    int x = 1;
    const attnResult_t r = attnSend(&x, 1, attnInt32, rank, comm, nullptr);
    EXPECT_NE(r, attnSuccess);
    EXPECT_NE(r, attnInProgress);
    EXPECT_STRNE(attnGetLastError(comm), "");
  }, RunOptions{30000});
}

// ---------------------------------------------------------------------------
// All pairs with uneven sizes (some zero), posted in a scrambled order.

void AllPairs(attnComm_t comm, int rank, int n, attnDataType_t t) {
  auto cnt = [](int src, int dst) { return size_t(((src * 3 + dst * 5) % 7) * 111); };
  std::vector<TypedBuf> send, recv;
  for (int p = 0; p < n; ++p) {
    send.emplace_back(t, cnt(rank, p));
    recv.emplace_back(t, cnt(p, rank));
    for (size_t i = 0; i < cnt(rank, p); ++i) send[p].Set(i, Pattern(t, rank * 16 + p, i));
    recv[p].Fill(Sentinel(t));
  }
  ATTN_ASSERT_OK(comm, attnGroupStart());
  for (int k = 0; k < n; ++k) {  // receives first, from far to near
    const int p = (rank + n - k) % n;
    ATTN_ASSERT_OK(comm, attnRecv(recv[p].data(), cnt(p, rank), t, p, comm, nullptr));
  }
  for (int k = 0; k < n; ++k) {
    const int p = (rank + k) % n;
    ATTN_ASSERT_OK(comm, attnSend(send[p].data(), cnt(rank, p), t, p, comm, nullptr));
  }
  const attnResult_t e = attnGroupEnd();
  ASSERT_EQ(e, attnSuccess) << "rank " << rank << ": " << attnGetLastError(comm);
  for (int p = 0; p < n; ++p)
    EXPECT_TRUE(BufEquals(recv[p], 0, cnt(p, rank), [&](size_t i) { return Pattern(t, p * 16 + rank, i); }))
        << "rank " << rank << " from " << p;
}

TEST(P2p, AllPairsUnevenThreadsN5) {
  RunThreads(5, [&](int rank, int n, attnComm_t& comm) {
    AllPairs(comm, rank, n, attnFloat16);
    AllPairs(comm, rank, n, attnInt8);
  });
}

// Several messages to the same peer match receives in posting order, inside
// one group and across groups and plain calls.
TEST(P2p, PostingOrderToSamePeer) {
  RunThreads(2, [&](int rank, int n, attnComm_t& comm) {
    const int peer = 1 - rank;
    const size_t sizes[] = {5, 0, 1024, 3, 70000, 1};
    std::vector<TypedBuf> bufs;
    for (size_t k = 0; k < 6; ++k) {
      bufs.emplace_back(attnInt32, sizes[k]);
      if (rank == 0)
        for (size_t i = 0; i < sizes[k]; ++i) bufs[k].Set(i, Pattern(attnInt32, 200 + k, i));
      else
        bufs[k].Fill(Sentinel(attnInt32));
    }
    ATTN_ASSERT_OK(comm, attnGroupStart());
    for (size_t k = 0; k < 6; ++k) {
      if (rank == 0)
        ATTN_ASSERT_OK(comm, attnSend(bufs[k].data(), sizes[k], attnInt32, peer, comm, nullptr));
      else
        ATTN_ASSERT_OK(comm, attnRecv(bufs[k].data(), sizes[k], attnInt32, peer, comm, nullptr));
    }
    ATTN_ASSERT_OK(comm, attnGroupEnd());
    for (size_t k = 0; k < 6; ++k)
      EXPECT_TRUE(BufEquals(bufs[k], 0, sizes[k], [&](size_t i) { return Pattern(attnInt32, 200 + k, i); }))
          << "message " << k << " on rank " << rank;
    // Plain (blocking) calls, back and forth.
    for (int round = 0; round < 4; ++round) {
      TypedBuf b(attnFloat64, 4099);
      const bool sender = (round % 2) == rank;
      if (sender) {
        for (size_t i = 0; i < 4099; ++i) b.Set(i, Pattern(attnFloat64, 300 + round, i));
        ATTN_ASSERT_OK(comm, attnSend(b.data(), 4099, attnFloat64, peer, comm, nullptr));
      } else {
        ATTN_ASSERT_OK(comm, attnRecv(b.data(), 4099, attnFloat64, peer, comm, nullptr));
        EXPECT_TRUE(BufEquals(b, 0, 4099, [&](size_t i) { return Pattern(attnFloat64, 300 + round, i); }))
            << "round " << round;
      }
    }
  });
}

// Nested groups: only the outermost attnGroupEnd runs the operations.
TEST(P2p, NestedGroups) {
  RunThreads(3, [&](int rank, int n, attnComm_t& comm) {
    const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    TypedBuf s(attnUint8, 777), r(attnUint8, 777);
    for (size_t i = 0; i < 777; ++i) s.Set(i, Pattern(attnUint8, rank, i));
    r.Fill(Sentinel(attnUint8));
    ATTN_ASSERT_OK(comm, attnGroupStart());
    ATTN_ASSERT_OK(comm, attnGroupStart());
    ATTN_ASSERT_OK(comm, attnRecv(r.data(), 777, attnUint8, prev, comm, nullptr));
    ATTN_ASSERT_OK(comm, attnGroupEnd());
    // Nothing ran yet: the receive must still be pending.
    EXPECT_TRUE(BufEquals(r, 0, 777, [&](size_t) { return Sentinel(attnUint8); }));
    ATTN_ASSERT_OK(comm, attnSend(s.data(), 777, attnUint8, next, comm, nullptr));
    ATTN_ASSERT_OK(comm, attnGroupEnd());
    EXPECT_TRUE(BufEquals(r, 0, 777, [&](size_t i) { return Pattern(attnUint8, prev, i); }));
  });
}

TEST(P2p, GroupEndWithoutStartIsInvalidUsage) {
  EXPECT_EQ(attnGroupEnd(), attnInvalidUsage);
  EXPECT_STRNE(attnGetLastError(nullptr), "");
}

// ---------------------------------------------------------------------------
// One thread drives every rank of an attnCommInitAll set in one group.

TEST(P2p, SingleThreadDrivesAllRanksInOneGroup) {
  const int n = 4;
  std::vector<attnComm_t> comms(n);
  ATTN_ASSERT_OK(nullptr, attnCommInitAll(comms.data(), n, nullptr));
  std::vector<TypedBuf> send, recv;
  for (int r = 0; r < n; ++r) {
    send.emplace_back(attnFloat32, 5001);
    recv.emplace_back(attnFloat32, 5001);
    for (size_t i = 0; i < 5001; ++i) send[r].Set(i, Pattern(attnFloat32, r, i));
  }
  ATTN_ASSERT_OK(nullptr, attnGroupStart());
  for (int r = 0; r < n; ++r) {
    ATTN_ASSERT_OK(comms[r], attnSend(send[r].data(), 5001, attnFloat32, (r + 1) % n, comms[r], nullptr));
    ATTN_ASSERT_OK(comms[r], attnRecv(recv[r].data(), 5001, attnFloat32, (r + n - 1) % n, comms[r], nullptr));
  }
  ATTN_ASSERT_OK(nullptr, attnGroupEnd());
  for (int r = 0; r < n; ++r)
    EXPECT_TRUE(BufEquals(recv[r], 0, 5001, [&](size_t i) { return Pattern(attnFloat32, (r + n - 1) % n, i); }))
        << "rank " << r;

  // Collectives of every rank from one thread, in one group.
  std::vector<TypedBuf> in, out;
  for (int r = 0; r < n; ++r) {
    in.emplace_back(attnInt32, 999);
    out.emplace_back(attnInt32, 999);
    for (size_t i = 0; i < 999; ++i) in[r].Set(i, RedInput(attnSum, attnInt32, r, n, i));
  }
  ATTN_ASSERT_OK(nullptr, attnGroupStart());
  for (int r = 0; r < n; ++r)
    ATTN_ASSERT_OK(comms[r], attnAllReduce(in[r].data(), out[r].data(), 999, attnInt32, attnSum, comms[r], nullptr));
  ATTN_ASSERT_OK(nullptr, attnGroupEnd());
  for (int r = 0; r < n; ++r)
    EXPECT_TRUE(BufEquals(out[r], 0, 999, [&](size_t i) { return RedExpected(attnSum, attnInt32, n, i); }))
        << "rank " << r;
  for (auto c : comms) EXPECT_EQ(attnCommDestroy(c), attnSuccess);
}

// Collectives and point-to-point in one group on each rank's own thread.
TEST(P2p, CollectivesInsideGroup) {
  RunThreads(3, [&](int rank, int n, attnComm_t& comm) {
    TypedBuf a(attnFloat64, 1001), b(attnFloat64, 1001), g(attnInt8, 3 * 50), gs(attnInt8, 50);
    for (size_t i = 0; i < 1001; ++i) a.Set(i, RedInput(attnMax, attnFloat64, rank, n, i));
    for (size_t i = 0; i < 50; ++i) gs.Set(i, Pattern(attnInt8, rank, i));
    ATTN_ASSERT_OK(comm, attnGroupStart());
    ATTN_ASSERT_OK(comm, attnAllReduce(a.data(), b.data(), 1001, attnFloat64, attnMax, comm, nullptr));
    ATTN_ASSERT_OK(comm, attnAllGather(gs.data(), g.data(), 50, attnInt8, comm, nullptr));
    ATTN_ASSERT_OK(comm, attnGroupEnd());
    EXPECT_TRUE(BufEquals(b, 0, 1001, [&](size_t i) { return RedExpected(attnMax, attnFloat64, n, i); }));
    EXPECT_TRUE(BufEquals(g, 0, 150, [&](size_t j) { return Pattern(attnInt8, int64_t(j / 50), j % 50); }));
  });
}

// ---------------------------------------------------------------------------
// A receive of another size than the message fails on both sides
// (attnInvalidUsage), and does not hang.

// A receive that names another size than the message fails with
// attnInvalidUsage. A shorter message is delivered whole, so its sender
// succeeds; a longer one breaks the link, which a small (eager) send may
// have left already, so its sender may or may not fail.
TEST(P2p, SizeMismatchFailsTheReceive) {
  for (size_t sent : {size_t(10), size_t(14)}) {
    attnConfig_t cfg = ATTN_CONFIG_INITIALIZER;
    cfg.timeout_ms = 5000;
    RunOptions opts;
    opts.config = &cfg;
    opts.deadline_ms = 60000;
    RunThreads(2, [&](int rank, int n, attnComm_t& comm) {
      TypedBuf b(attnFloat32, 64);
      b.Fill(1);
      const attnResult_t r = rank == 0 ? attnSend(b.data(), sent, attnFloat32, 1, comm, nullptr)
                                       : attnRecv(b.data(), 12, attnFloat32, 0, comm, nullptr);
      if (rank == 1) {
        EXPECT_EQ(r, attnInvalidUsage) << "sent " << sent << ": " << ResultName(r) << ": "
                                       << attnGetLastError(comm);
        EXPECT_STRNE(attnGetLastError(comm), "");
      } else if (sent < 12) {
        EXPECT_EQ(r, attnSuccess) << attnGetLastError(comm);
      }
      EXPECT_TRUE(b.GuardsIntact());
      attnCommAbort(comm);
      comm = nullptr;
    }, opts);
  }
}

// ---------------------------------------------------------------------------
// Processes, over each transport.

using ProcParam = std::tuple<int, std::string>;
class P2pProcesses : public ::testing::TestWithParam<ProcParam> {};

TEST_P(P2pProcesses, RingAllPairsAndSelf) {
  const auto [n, transport] = GetParam();
  RunOptions opts;
  opts.env = {{"ATTN_TRANSPORT", transport}};
  opts.deadline_ms = 120000;
  RunProcesses(n, [&](int rank, int nr, attnComm_t& comm) {
    for (size_t count : kCounts) CheckRingExchange(comm, rank, nr, attnFloat32, count);
    CheckRingExchange(comm, rank, nr, attnBfloat16, 100001);
    CheckRingExchange(comm, rank, nr, attnInt64, (size_t(4) << 20) / 8 + 3);  // >= 4 MiB
    AllPairs(comm, rank, nr, attnUint8);
    AllPairs(comm, rank, nr, attnFloat64);
  }, opts);
}

INSTANTIATE_TEST_SUITE_P(Transports, P2pProcesses,
                         ::testing::Combine(::testing::Values(2, 3, 4), ::testing::Values("shm", "tcp")),
                         [](const ::testing::TestParamInfo<ProcParam>& info) {
                           return "N" + std::to_string(std::get<0>(info.param)) + "_" +
                                  std::get<1>(info.param);
                         });

TEST(P2p, RingTcpThreadsN3) {
  RunOptions opts;
  opts.env = {{"ATTN_TRANSPORT", "tcp"}};
  RunThreads(3, [&](int rank, int n, attnComm_t& comm) {
    for (size_t count : kCounts) CheckRingExchange(comm, rank, n, attnInt8, count);
    AllPairs(comm, rank, n, attnFloat32);
  }, opts);
}

}  // namespace
