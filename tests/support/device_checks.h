// Checks of device communicators shared by the device tests (staging and
// NCCL backends): each runs one operation on device buffers on this rank,
// copies the result back, and compares it with host-computed values (and
// guard zones / untouched gaps). Every rank of the communicator calls the
// same check with the same arguments (except rank). Header-only: only the
// CUDA builds compile it.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "attncomm.h"
#include "multirank.h"

namespace attn_test {

// A device copy of a TypedBuf, guard zones included, so out-of-bounds
// writes on the device show as damaged guards after Download.
// Stream-ordered allocation: cudaMalloc/cudaFree may synchronize the whole
// device, and with ranks as threads sharing a GPU that would wait for
// another rank's stream, itself waiting for this rank's next operation.
//
// Ranks that are processes call DevBufsFromCudaMalloc() first: stream-ordered
// pool memory cannot be exported by IPC handle, so the cuda_ipc backend
// would stage it; cudaMalloc memory peers open (and a process's cudaFree
// waits only for its own streams).
inline bool& DevBufsUseCudaMalloc() {
  static bool on = false;
  return on;
}
inline void DevBufsFromCudaMalloc() { DevBufsUseCudaMalloc() = true; }

class DevBuf {
 public:
  DevBuf(const TypedBuf& like, cudaStream_t s)
      : bytes_(like.bytes() + 2 * TypedBuf::kGuardBytes), s_(s), plain_(DevBufsUseCudaMalloc()) {
    ok_ = (plain_ ? cudaMalloc(&base_, bytes_) : cudaMallocAsync(&base_, bytes_, s_)) == cudaSuccess;
  }
  ~DevBuf() {
    if (base_ && plain_) cudaFree(base_);
    else if (base_) cudaFreeAsync(base_, s_);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  bool ok() const { return ok_; }
  void* data() { return static_cast<char*>(base_) + TypedBuf::kGuardBytes; }
  void Upload(const TypedBuf& b, cudaStream_t s) {
    const char* from = static_cast<const char*>(b.data()) - TypedBuf::kGuardBytes;
    ASSERT_EQ(cudaMemcpyAsync(base_, from, bytes_, cudaMemcpyHostToDevice, s), cudaSuccess);
  }
  void Download(TypedBuf* b, cudaStream_t s) {
    char* to = static_cast<char*>(b->data()) - TypedBuf::kGuardBytes;
    ASSERT_EQ(cudaMemcpyAsync(to, base_, bytes_, cudaMemcpyDeviceToHost, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  }

 private:
  void* base_ = nullptr;
  size_t bytes_ = 0;
  cudaStream_t s_;
  bool plain_;
  bool ok_ = false;
};

inline attnStream_t AsStream(cudaStream_t s) { return reinterpret_cast<attnStream_t>(s); }

// An input and an output on the host and their device copies, uploaded:
// `in` element i is fill(i), `out` holds the sentinel.
struct DevInOut {
  TypedBuf in, out;
  DevBuf din, dout;
  DevInOut(attnDataType_t t, size_t inCount, size_t outCount, const std::function<double(size_t)>& fill,
           cudaStream_t s)
      : in(t, inCount), out(t, outCount), din(in, s), dout(out, s) {
    for (size_t i = 0; i < inCount; ++i) in.Set(i, fill(i));
    out.Fill(Sentinel(t));
    if (!ok()) return;
    din.Upload(in, s);
    dout.Upload(out, s);
  }
  bool ok() const { return din.ok() && dout.ok(); }
};

// fp16/bf16, and NCCL's average (it may pre-scale by 1/n), are compared with
// a tolerance; everything else exactly.
inline ::testing::AssertionResult DevEquals(const TypedBuf& buf, size_t off, size_t n,
                                            const std::function<double(size_t)>& expect,
                                            bool approximate) {
  if (!approximate) return BufEquals(buf, off, n, expect);
  const bool half = buf.type() == attnFloat16 || buf.type() == attnBfloat16;
  const double rel = half ? 1.0 / 64 : 1e-5;
  for (size_t i = off; i < off + n; ++i) {
    const double got = buf.Get(i), want = expect(i);
    if (std::fabs(got - want) > rel * std::fabs(want) + rel)
      return ::testing::AssertionFailure() << "element " << i << ": got " << got << ", want " << want;
  }
  if (!buf.GuardsIntact()) return ::testing::AssertionFailure() << "guard zone damaged";
  return ::testing::AssertionSuccess();
}

inline std::string Case(const char* what, int rank, attnDataType_t t) {
  return std::string(what) + " " + TypeName(t) + " on rank " + std::to_string(rank);
}

inline void CheckDevAllGather(attnComm_t comm, int rank, int n, attnDataType_t t, size_t count,
                              cudaStream_t s) {
  SCOPED_TRACE(Case("all-gather", rank, t));
  TypedBuf in(t, count), out(t, count * n);
  for (size_t i = 0; i < count; ++i) in.Set(i, Pattern(t, rank, i));
  out.Fill(Sentinel(t));
  DevBuf din(in, s), dout(out, s);
  ASSERT_TRUE(din.ok() && dout.ok());
  din.Upload(in, s);
  dout.Upload(out, s);
  ASSERT_EQ(attnAllGather(din.data(), dout.data(), count, t, comm, AsStream(s)), attnSuccess)
      << attnGetLastError(comm);
  dout.Download(&out, s);
  EXPECT_TRUE(BufEquals(out, 0, count * n, [&](size_t i) { return Pattern(t, int(i / count), i % count); }));
}

inline void CheckDevAllReduce(attnComm_t comm, int rank, int n, attnDataType_t t, attnRedOp_t op,
                              size_t count, cudaStream_t s) {
  SCOPED_TRACE(Case(op == attnAvg ? "all-reduce avg" : "all-reduce", rank, t));
  DevInOut b(t, count, count, [&](size_t i) { return RedInput(op, t, rank, n, i); }, s);
  ASSERT_TRUE(b.ok());
  TypedBuf& out = b.out;
  DevBuf &din = b.din, &dout = b.dout;
  ASSERT_EQ(attnAllReduce(din.data(), dout.data(), count, t, op, comm, AsStream(s)), attnSuccess)
      << attnGetLastError(comm);
  dout.Download(&out, s);
  const bool approx = op == attnAvg || t == attnFloat16 || t == attnBfloat16;
  EXPECT_TRUE(DevEquals(out, 0, count, [&](size_t i) { return RedExpected(op, t, n, i); }, approx));
}

inline void CheckDevReduceScatter(attnComm_t comm, int rank, int n, attnDataType_t t, attnRedOp_t op,
                                  size_t recvcount, cudaStream_t s) {
  SCOPED_TRACE(Case("reduce-scatter", rank, t));
  DevInOut b(t, recvcount * n, recvcount, [&](size_t i) { return RedInput(op, t, rank, n, i); }, s);
  ASSERT_TRUE(b.ok());
  TypedBuf& out = b.out;
  DevBuf &din = b.din, &dout = b.dout;
  ASSERT_EQ(attnReduceScatter(din.data(), dout.data(), recvcount, t, op, comm, AsStream(s)), attnSuccess)
      << attnGetLastError(comm);
  dout.Download(&out, s);
  const bool approx = op == attnAvg || t == attnFloat16 || t == attnBfloat16;
  EXPECT_TRUE(DevEquals(out, 0, recvcount,
                        [&](size_t i) { return RedExpected(op, t, n, rank * recvcount + i); }, approx));
}

inline void CheckDevBroadcast(attnComm_t comm, int rank, int n, attnDataType_t t, size_t count, int root,
                              cudaStream_t s) {
  SCOPED_TRACE(Case("broadcast", rank, t));
  TypedBuf in(t, count), out(t, count);
  for (size_t i = 0; i < count; ++i) in.Set(i, Pattern(t, 1000 + root, i));
  out.Fill(Sentinel(t));
  DevBuf din(in, s), dout(out, s);
  ASSERT_TRUE(din.ok() && dout.ok());
  din.Upload(in, s);
  dout.Upload(out, s);
  void* send = rank == root ? din.data() : nullptr;  // non-roots may pass none
  ASSERT_EQ(attnBroadcast(send, dout.data(), count, t, root, comm, AsStream(s)), attnSuccess)
      << attnGetLastError(comm);
  dout.Download(&out, s);
  EXPECT_TRUE(BufEquals(out, 0, count, [&](size_t i) { return Pattern(t, 1000 + root, i); }));
}

// Non-roots pass no receive buffer; the root's must hold the reduction.
inline void CheckDevReduce(attnComm_t comm, int rank, int n, attnDataType_t t, attnRedOp_t op, size_t count,
                           int root, cudaStream_t s) {
  SCOPED_TRACE(Case("reduce", rank, t) + " root " + std::to_string(root));
  DevInOut b(t, count, count, [&](size_t i) { return RedInput(op, t, rank, n, i); }, s);
  ASSERT_TRUE(b.ok());
  TypedBuf& out = b.out;
  DevBuf &din = b.din, &dout = b.dout;
  void* recv = rank == root ? dout.data() : nullptr;
  ASSERT_EQ(attnReduce(din.data(), recv, count, t, op, root, comm, AsStream(s)), attnSuccess)
      << attnGetLastError(comm);
  dout.Download(&out, s);
  TypedBuf back(t, count);
  din.Download(&back, s);
  if (rank == root) {
    const bool approx = op == attnAvg || t == attnFloat16 || t == attnBfloat16;
    EXPECT_TRUE(DevEquals(out, 0, count, [&](size_t i) { return RedExpected(op, t, n, i); }, approx));
  }
  EXPECT_TRUE(BufEquals(back, 0, count, [&](size_t i) { return RedInput(op, t, rank, n, i); }))
      << "sendbuff was modified";
}

// What rank `from` sends to rank `to` in the all-to-all checks.
inline double A2a(attnDataType_t t, int from, int to, size_t i) { return Pattern(t, from * 64 + to, i); }

inline void CheckDevAllToAll(attnComm_t comm, int rank, int n, attnDataType_t t, size_t count,
                             cudaStream_t s) {
  SCOPED_TRACE(Case("all-to-all", rank, t));
  DevInOut b(t, count * n, count * n, [&](size_t j) { return A2a(t, rank, int(j / count), j % count); }, s);
  ASSERT_TRUE(b.ok());
  TypedBuf& out = b.out;
  DevBuf &din = b.din, &dout = b.dout;
  ASSERT_EQ(attnAllToAll(din.data(), dout.data(), count, t, comm, AsStream(s)), attnSuccess)
      << attnGetLastError(comm);
  dout.Download(&out, s);
  EXPECT_TRUE(BufEquals(out, 0, count * n,
                        [&](size_t i) { return A2a(t, int(i / count), rank, i % count); }));
}

// All-to-allv with per-peer counts and displacements (elements): rank
// `from` sends value(from, to, i) to rank `to`; the receive buffer's gaps
// must keep their contents.
inline void RunDevAllToAllv(attnComm_t comm, int rank, int n, attnDataType_t t, cudaStream_t s,
                            const std::vector<size_t>& sc, const std::vector<size_t>& sd,
                            const std::vector<size_t>& rc, const std::vector<size_t>& rd,
                            const std::function<double(int from, int to, size_t i)>& value) {
  size_t send = 0, recv = 0;
  for (int p = 0; p < n; ++p) {
    send = std::max(send, sd[p] + sc[p]);
    recv = std::max(recv, rd[p] + rc[p]);
  }
  TypedBuf in(t, send), out(t, recv);
  in.Fill(Sentinel(t));
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < sc[p]; ++i) in.Set(sd[p] + i, value(rank, p, i));
  out.Fill(Sentinel(t));
  DevBuf din(in, s), dout(out, s);
  ASSERT_TRUE(din.ok() && dout.ok());
  din.Upload(in, s);
  dout.Upload(out, s);
  ASSERT_EQ(attnAllToAllv(din.data(), sc.data(), sd.data(), dout.data(), rc.data(), rd.data(), t, comm,
                          AsStream(s)),
            attnSuccess)
      << attnGetLastError(comm);
  dout.Download(&out, s);
  EXPECT_TRUE(BufEquals(out, 0, recv, [&](size_t i) {
    for (int p = 0; p < n; ++p)
      if (i >= rd[p] && i < rd[p] + rc[p]) return value(p, rank, i - rd[p]);
    return Sentinel(t);
  }));
}

// Uneven counts (one pair sends nothing) and gaps between the receive
// blocks, which must keep their contents.
inline void CheckDevAllToAllv(attnComm_t comm, int rank, int n, attnDataType_t t, cudaStream_t s) {
  SCOPED_TRACE(Case("all-to-allv", rank, t));
  auto cnt = [n](int from, int to) -> size_t {
    return (from + 2 * to) % (n + 1) == 1 ? 0 : 5 + (from * 3 + to) % 4;
  };
  std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
  size_t send = 0, recv = 0;
  for (int p = 0; p < n; ++p) {
    sc[p] = cnt(rank, p);
    sd[p] = send;
    send += sc[p] + 1;
    rc[p] = cnt(p, rank);
    rd[p] = recv + 2;  // a gap before every block
    recv = rd[p] + rc[p];
  }
  RunDevAllToAllv(comm, rank, n, t, s, sc, sd, rc, rd,
                  [t](int from, int to, size_t i) { return A2a(t, from, to, i); });
}

// One group: a ring exchange (send to rank+1 on stream s, receive from
// rank-1 on stream s2) and a send/receive to self (on s). Only s2 is waited
// for: the group's operation runs on s, and s2 must wait for it.
inline void CheckDevGroupedRing(attnComm_t comm, int rank, int n, cudaStream_t s, cudaStream_t s2) {
  SCOPED_TRACE("grouped ring + self on rank " + std::to_string(rank));
  const attnDataType_t t = attnFloat32;
  const size_t count = 4099;
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  TypedBuf ring(t, count), got(t, count), self(t, count / 2), selfGot(t, count / 2);
  for (size_t i = 0; i < count; ++i) ring.Set(i, Pattern(t, rank, i));
  for (size_t i = 0; i < count / 2; ++i) self.Set(i, Pattern(t, 500 + rank, i));
  got.Fill(Sentinel(t));
  selfGot.Fill(Sentinel(t));
  DevBuf dring(ring, s), dgot(got, s), dself(self, s), dselfGot(selfGot, s);
  ASSERT_TRUE(dring.ok() && dgot.ok() && dself.ok() && dselfGot.ok());
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);  // allocated on s, used on s2 too
  dring.Upload(ring, s);
  dself.Upload(self, s);
  dselfGot.Upload(selfGot, s);
  dgot.Upload(got, s2);  // on s2: the group must wait for it
  ASSERT_EQ(attnGroupStart(), attnSuccess);
  ASSERT_EQ(attnSend(dring.data(), count, t, next, comm, AsStream(s)), attnSuccess) << attnGetLastError(comm);
  // With one rank the ring pair is a self pair too: self pairs match in
  // order, so the ring's receive comes before the self pair's.
  ASSERT_EQ(attnRecv(dgot.data(), count, t, prev, comm, AsStream(s2)), attnSuccess);
  ASSERT_EQ(attnRecv(dselfGot.data(), count / 2, t, rank, comm, AsStream(s)), attnSuccess);
  ASSERT_EQ(attnSend(dself.data(), count / 2, t, rank, comm, AsStream(s)), attnSuccess);
  ASSERT_EQ(attnGroupEnd(), attnSuccess) << attnGetLastError(comm);
  dgot.Download(&got, s2);
  EXPECT_TRUE(BufEquals(got, 0, count, [&](size_t i) { return Pattern(t, prev, i); }));
  dselfGot.Download(&selfGot, s2);
  EXPECT_TRUE(BufEquals(selfGot, 0, count / 2, [&](size_t i) { return Pattern(t, 500 + rank, i); }));
}

// Everything above, on one communicator, then a barrier and a clean async
// state.
inline void CheckDevSuite(attnComm_t comm, int rank, int n) {
  cudaStream_t s, s2;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
  for (attnDataType_t t : {attnFloat32, attnBfloat16}) {
    CheckDevAllGather(comm, rank, n, t, 1007, s);
    for (attnRedOp_t op : {attnSum, attnAvg}) {
      CheckDevAllReduce(comm, rank, n, t, op, 1031, s);
      CheckDevReduceScatter(comm, rank, n, t, op, 515, s);
    }
  }
  CheckDevBroadcast(comm, rank, n, attnFloat32, 2053, n - 1, s);
  CheckDevReduce(comm, rank, n, attnFloat32, attnSum, 2053, 0, s);
  CheckDevReduce(comm, rank, n, attnBfloat16, attnMax, 777, n - 1, s);
  CheckDevAllToAll(comm, rank, n, attnFloat32, 301, s);
  CheckDevAllToAllv(comm, rank, n, attnFloat32, s);
  CheckDevGroupedRing(comm, rank, n, s, s2);
  EXPECT_EQ(attnBarrier(comm, AsStream(s)), attnSuccess) << attnGetLastError(comm);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  attnResult_t async = attnInternalError;
  EXPECT_EQ(attnCommGetAsyncError(comm, &async), attnSuccess);
  EXPECT_EQ(async, attnSuccess) << attnGetLastError(comm);
  cudaStreamDestroy(s);
  cudaStreamDestroy(s2);
}

}  // namespace attn_test
