// C API: the standard collectives. Each entry validates its arguments, then
// dispatches a closure that checks the signature (ATTN_CHECK) and runs the
// algorithm from src/coll/. With signature checks on, a rank that refuses
// its arguments still takes part in the signature exchange (refuse()), so
// its peers fail the call too instead of waiting for it.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/reduce.h"
#include "src/coll/algo_select.h"
#include "src/coll/coll.h"
#include "src/coll/signature.h"
#include "src/core/api_call.h"
#include "src/device/device_route.h"
#include "src/core/datatype.h"

using namespace attn;

namespace {

attnResult_t checkCommon(attnComm* comm, attnDataType_t type, attnStream_t stream) {
  ATTN_REQUIRE(validDataType(type), "invalid datatype %d", (int)type);
  ATTN_REQUIRE(stream == nullptr || deviceRoute(comm),
               "a host-memory communicator takes a NULL stream (got %p)", (void*)stream);
  return attnSuccess;
}

// count elements of esz bytes, times `blocks` (ranks), must fit in memory.
attnResult_t checkCount(size_t count, size_t esz, size_t blocks) {
  size_t bytes;
  if (__builtin_mul_overflow(count, esz, &bytes) || __builtin_mul_overflow(bytes, blocks, &bytes) ||
      bytes > (size_t(1) << 56))
    return setError(attnInvalidArgument, "count %zu of %zu-byte elements (x%zu) is too large", count,
                    esz, blocks);
  return attnSuccess;
}

attnResult_t checkBuffers(const void* send, const void* recv, size_t count) {
  ATTN_REQUIRE(count == 0 || send != nullptr, "sendbuff is NULL with count %zu", count);
  ATTN_REQUIRE(count == 0 || recv != nullptr, "recvbuff is NULL with count %zu", count);
  return attnSuccess;
}

// A collective for the device backends (device_op.h): what it is, and its
// staged twin.
DeviceOp deviceColl(DeviceOpKind kind, const void* send, void* recv, size_t count, attnDataType_t type,
                    std::vector<DeviceSpan> spans, HostOp host) {
  DeviceOp d;
  d.kind = kind;
  d.send = send;
  d.recv = recv;
  d.count = count;
  d.type = type;
  d.spans = std::move(spans);
  d.hostOp = std::move(host);
  return d;
}

bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return an && bn && x < y + bn && y < x + an;
}

// The call's signature exchange (ATTN_CHECK). On a device communicator's
// proxy thread the call is the host half of a staged device collective,
// whose signature the proxy exchanged before staging it
// (src/device/device_signature.h).
attnResult_t checkCallSignature(attnComm* comm, const CollSignature& sig) {
  if (onDeviceProxy(comm)) return attnSuccess;
  return checkSignature(comm, sig);
}

// A call this rank refuses (`status`, whose text is the thread's last
// error). On a communicator checking signatures (ATTN_CHECK=1), the rank
// still takes part in the call's signature exchange with a refused
// signature, queued as the call would have been (now, in the group, on the
// non-blocking queue, on a device communicator's stream): its peers then
// fail the call naming this rank and every rank stays in step. Without the
// checks, as with NCCL, the peers wait for a call that will not come.
// Returns `status`.
attnResult_t refuse(attnComm* comm, attnStream_t stream, CollKind kind, attnResult_t status) {
  if (!comm->config.checkSignatures || comm->nranks == 1) return status;
  const std::string why = threadLastError();
  CollSignature sig;
  sig.kind = static_cast<uint32_t>(kind);
  sig.status = status;
  if (deviceRoute(comm))
    (void)deviceRefuse(comm, stream, sig);
  else
    (void)dispatch(comm, "refused collective", [comm, sig] { return sendRefusedSignature(comm, sig); });
  return restoreError(status, why);  // the exchange may have set a text of its own
}

// The argument checks of each collective: what the C API refuses.
attnResult_t checkAllGatherArgs(attnComm* comm, const void* send, void* recv, size_t count,
                                attnDataType_t type, attnStream_t stream) {
  ATTN_CHECK(checkCommon(comm, type, stream));
  ATTN_CHECK(checkBuffers(send, recv, count));
  ATTN_CHECK(checkCount(count, dataTypeSize(type), comm->nranks));
  const size_t bytes = count * dataTypeSize(type);
  char* out = static_cast<char*>(recv);
  if (send != out + comm->rank * bytes && overlaps(send, bytes, out, bytes * comm->nranks))
    return setError(attnInvalidArgument,
                    "all-gather: sendbuff overlaps recvbuff but is not this rank's slot (in place needs "
                    "sendbuff == recvbuff + rank*sendcount)");
  return attnSuccess;
}

attnResult_t checkReduceScatterArgs(attnComm* comm, const void* send, void* recv, size_t count,
                                    attnDataType_t type, attnRedOp_t op, attnStream_t stream) {
  ATTN_CHECK(checkCommon(comm, type, stream));
  ATTN_CHECK(checkBuffers(send, recv, count));
  ATTN_REQUIRE(validRedOp(op), "invalid reduction op %d", (int)op);
  ATTN_CHECK(checkCount(count, dataTypeSize(type), comm->nranks));
  const size_t bytes = count * dataTypeSize(type);
  const char* in = static_cast<const char*>(send);
  if (recv != in + comm->rank * bytes && overlaps(in, bytes * comm->nranks, recv, bytes))
    return setError(attnInvalidArgument,
                    "reduce-scatter: recvbuff overlaps sendbuff but is not this rank's block (in place "
                    "needs recvbuff == sendbuff + rank*recvcount)");
  return attnSuccess;
}

attnResult_t checkAllReduceArgs(attnComm* comm, const void* send, void* recv, size_t count,
                                attnDataType_t type, attnRedOp_t op, attnStream_t stream) {
  ATTN_CHECK(checkCommon(comm, type, stream));
  ATTN_CHECK(checkBuffers(send, recv, count));
  ATTN_REQUIRE(validRedOp(op), "invalid reduction op %d", (int)op);
  ATTN_CHECK(checkCount(count, dataTypeSize(type), 1));
  const size_t bytes = count * dataTypeSize(type);
  ATTN_REQUIRE(send == recv || !overlaps(send, bytes, recv, bytes), "all-reduce: buffers overlap partially");
  return attnSuccess;
}

attnResult_t checkReduceArgs(attnComm* comm, const void* send, void* recv, size_t count, attnDataType_t type,
                             attnRedOp_t op, int root, attnStream_t stream) {
  ATTN_CHECK(checkCommon(comm, type, stream));
  ATTN_REQUIRE(validRedOp(op), "invalid reduction op %d", (int)op);
  ATTN_REQUIRE(root >= 0 && root < comm->nranks, "root %d is outside [0, %d)", root, comm->nranks);
  ATTN_REQUIRE(count == 0 || send != nullptr, "sendbuff is NULL with count %zu", count);
  ATTN_REQUIRE(comm->rank != root || count == 0 || recv != nullptr, "recvbuff is NULL on the root");
  ATTN_CHECK(checkCount(count, dataTypeSize(type), 1));
  const size_t bytes = count * dataTypeSize(type);
  ATTN_REQUIRE(comm->rank != root || send == recv || !overlaps(send, bytes, recv, bytes),
               "reduce: buffers overlap partially");
  return attnSuccess;
}

attnResult_t checkBroadcastArgs(attnComm* comm, const void* send, void* recv, size_t count,
                                attnDataType_t type, int root, attnStream_t stream) {
  ATTN_CHECK(checkCommon(comm, type, stream));
  ATTN_REQUIRE(root >= 0 && root < comm->nranks, "root %d is outside [0, %d)", root, comm->nranks);
  ATTN_REQUIRE(count == 0 || recv != nullptr, "recvbuff is NULL with count %zu", count);
  ATTN_CHECK(checkCount(count, dataTypeSize(type), 1));
  ATTN_REQUIRE(comm->rank != root || count == 0 || send != nullptr, "sendbuff is NULL on the root");
  return attnSuccess;
}

attnResult_t checkAllToAllArgs(attnComm* comm, const void* send, void* recv, size_t count,
                               attnDataType_t type, attnStream_t stream) {
  ATTN_CHECK(checkCommon(comm, type, stream));
  ATTN_CHECK(checkBuffers(send, recv, count));
  ATTN_CHECK(checkCount(count, dataTypeSize(type), comm->nranks));
  const size_t total = count * dataTypeSize(type) * comm->nranks;
  ATTN_REQUIRE(!overlaps(send, total, recv, total), "all-to-all cannot run in place: buffers overlap");
  return attnSuccess;
}

// Also turns the counts into byte blocks (sb, rb) for the caller.
attnResult_t checkAllToAllvArgs(attnComm* comm, const void* send, const size_t* sendcounts,
                                const size_t* sdispls, void* recv, const size_t* recvcounts,
                                const size_t* rdispls, attnDataType_t type, attnStream_t stream,
                                std::vector<Block>* sb, std::vector<Block>* rb) {
  ATTN_CHECK(checkCommon(comm, type, stream));
  ATTN_REQUIRE(sendcounts && sdispls && recvcounts && rdispls,
               "all-to-allv: a count or displacement array is NULL");
  const size_t esz = dataTypeSize(type);
  const int n = comm->nranks;
  sb->assign(n, Block{});
  rb->assign(n, Block{});
  size_t sendTotal = 0, recvTotal = 0;
  for (int p = 0; p < n; ++p) {
    ATTN_CHECK(checkCount(sendcounts[p] + sdispls[p], esz, 1));
    ATTN_CHECK(checkCount(recvcounts[p] + rdispls[p], esz, 1));
    ATTN_REQUIRE(sendcounts[p] + sdispls[p] >= sdispls[p] && recvcounts[p] + rdispls[p] >= rdispls[p],
                 "all-to-allv: count + displacement overflows");
    (*sb)[p] = {sdispls[p] * esz, sendcounts[p] * esz};
    (*rb)[p] = {rdispls[p] * esz, recvcounts[p] * esz};
    sendTotal += sendcounts[p];
    recvTotal += recvcounts[p];
  }
  ATTN_REQUIRE(!(sendTotal && !send) && !(recvTotal && !recv), "all-to-allv: NULL buffer with non-zero counts");
  for (int p = 0; p < n; ++p)
    for (int q = p + 1; q < n; ++q)
      ATTN_REQUIRE(!overlaps((char*)recv + (*rb)[p].offset, (*rb)[p].bytes, (char*)recv + (*rb)[q].offset,
                             (*rb)[q].bytes),
                   "all-to-allv: receive blocks of peers %d and %d overlap", p, q);
  return attnSuccess;
}

}  // namespace

extern "C" {

attnResult_t attnAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           attnDataType_t datatype, attnComm_t comm, attnStream_t stream) {
  return guardedEntry([&]() -> attnResult_t {
    ApiCall call(comm);
    ATTN_CHECK(call.finish(call.check()));
    if (attnResult_t r = checkAllGatherArgs(comm, sendbuff, recvbuff, sendcount, datatype, stream); r != attnSuccess)
      return call.finish(refuse(comm, stream, CollKind::kAllGather, r));
    const size_t esz = dataTypeSize(datatype), bytes = sendcount * esz;
    const int n = comm->nranks, me = comm->rank;
    char* out = static_cast<char*>(recvbuff);
    if (deviceRoute(comm)) {
      DeviceOp d = deviceColl(DeviceOpKind::kAllGather, sendbuff, out, sendcount, datatype,
                              {{sendbuff, bytes, true, false}, {out, bytes * n, false, true}}, [=](char* const* h) {
                                return attnAllGather(h[0], h[1], sendcount, datatype, comm, nullptr);
                              });
      d.sliceOp = [=](char* in, char* o, size_t c) { return attnAllGather(in, o, c, datatype, comm, nullptr); };
      return call.finish(deviceEnqueue(comm, stream, std::move(d)));
    }
    AlgoSetting algo;
    ATTN_CHECK(call.finish(readAlgoSetting(&algo)));
    return call.finish(dispatch(comm, "AllGather", [=] {
      ATTN_CHECK(checkCallSignature(comm, {(uint32_t)CollKind::kAllGather, datatype, -1, -1, sendcount}));
      if (sendbuff != out + me * bytes) std::memcpy(out + me * bytes, sendbuff, bytes);
      std::vector<Block> blocks(n);
      for (int i = 0; i < n; ++i) blocks[i] = {i * bytes, bytes};
      return runAllGather(comm, algo, "AllGather", out, blocks, esz);
    }));
  });
}

attnResult_t attnReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               attnDataType_t datatype, attnRedOp_t op, attnComm_t comm,
                               attnStream_t stream) {
  return guardedEntry([&]() -> attnResult_t {
    ApiCall call(comm);
    ATTN_CHECK(call.finish(call.check()));
    if (attnResult_t r = checkReduceScatterArgs(comm, sendbuff, recvbuff, recvcount, datatype, op, stream);
        r != attnSuccess)
      return call.finish(refuse(comm, stream, CollKind::kReduceScatter, r));
    const size_t esz = dataTypeSize(datatype), bytes = recvcount * esz;
    const int n = comm->nranks;
    const char* in = static_cast<const char*>(sendbuff);
    char* out = static_cast<char*>(recvbuff);
    if (deviceRoute(comm)) {
      DeviceOp d = deviceColl(DeviceOpKind::kReduceScatter, in, out, recvcount, datatype,
                              {{in, bytes * n, true, false}, {out, bytes, false, true}}, [=](char* const* h) {
                                return attnReduceScatter(h[0], h[1], recvcount, datatype, op, comm, nullptr);
                              });
      d.op = op;
      d.sliceOp = [=](char* in, char* o, size_t c) {
        return attnReduceScatter(in, o, c, datatype, op, comm, nullptr);
      };
      return call.finish(deviceEnqueue(comm, stream, std::move(d)));
    }
    AlgoSetting algo;
    ATTN_CHECK(call.finish(readAlgoSetting(&algo)));
    return call.finish(dispatch(comm, "ReduceScatter", [=] {
      ATTN_CHECK(checkCallSignature(comm, {(uint32_t)CollKind::kReduceScatter, datatype, op, -1, recvcount}));
      std::vector<Block> blocks(n);
      for (int i = 0; i < n; ++i) blocks[i] = {i * bytes, bytes};
      return runReduceScatter(comm, algo, "ReduceScatter", in, out, blocks, datatype, op);
    }));
  });
}

attnResult_t attnAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           attnDataType_t datatype, attnRedOp_t op, attnComm_t comm,
                           attnStream_t stream) {
  return guardedEntry([&]() -> attnResult_t {
    ApiCall call(comm);
    ATTN_CHECK(call.finish(call.check()));
    if (attnResult_t r = checkAllReduceArgs(comm, sendbuff, recvbuff, count, datatype, op, stream); r != attnSuccess)
      return call.finish(refuse(comm, stream, CollKind::kAllReduce, r));
    const size_t esz = dataTypeSize(datatype);
    if (deviceRoute(comm)) {
      DeviceOp d = deviceColl(DeviceOpKind::kAllReduce, sendbuff, recvbuff, count, datatype,
                              {{sendbuff, count * esz, true, false}, {recvbuff, count * esz, false, true}},
                              [=](char* const* h) {
                                return attnAllReduce(h[0], h[1], count, datatype, op, comm, nullptr);
                              });
      d.op = op;
      d.sliceOp = [=](char* in, char* o, size_t c) { return attnAllReduce(in, o, c, datatype, op, comm, nullptr); };
      return call.finish(deviceEnqueue(comm, stream, std::move(d)));
    }
    AlgoSetting algo;
    AllReduceSetting arAlgo;
    ATTN_CHECK(call.finish(readAlgoSetting(&algo)));
    ATTN_CHECK(call.finish(readAllReduceSetting(&arAlgo)));
    return call.finish(dispatch(comm, "AllReduce", [=] {
      ATTN_CHECK(checkCallSignature(comm, {(uint32_t)CollKind::kAllReduce, datatype, op, -1, count}));
      return runAllReduce(comm, arAlgo, algo, static_cast<const char*>(sendbuff), static_cast<char*>(recvbuff),
                          count, datatype, op);
    }));
  });
}

attnResult_t attnReduce(const void* sendbuff, void* recvbuff, size_t count, attnDataType_t datatype,
                        attnRedOp_t op, int root, attnComm_t comm, attnStream_t stream) {
  return guardedEntry([&]() -> attnResult_t {
    ApiCall call(comm);
    ATTN_CHECK(call.finish(call.check()));
    if (attnResult_t r = checkReduceArgs(comm, sendbuff, recvbuff, count, datatype, op, root, stream); r != attnSuccess)
      return call.finish(refuse(comm, stream, CollKind::kReduce, r));
    const size_t esz = dataTypeSize(datatype), bytes = count * esz;
    const bool isRoot = comm->rank == root;
    if (deviceRoute(comm)) {
      DeviceOp d = deviceColl(DeviceOpKind::kReduce, sendbuff, isRoot ? recvbuff : nullptr, count, datatype,
                              {{sendbuff, bytes, true, false}, {isRoot ? recvbuff : nullptr, isRoot ? bytes : 0, false, true}},
                              [=](char* const* h) {
                                return attnReduce(h[0], h[1], count, datatype, op, root, comm, nullptr);
                              });
      d.op = op;
      d.root = root;
      d.sliceOp = [=](char* in, char* o, size_t c) { return attnReduce(in, o, c, datatype, op, root, comm, nullptr); };
      return call.finish(deviceEnqueue(comm, stream, std::move(d)));
    }
    ReduceSetting algo;
    ATTN_CHECK(call.finish(readReduceSetting(&algo)));
    return call.finish(dispatch(comm, "Reduce", [=] {
      ATTN_CHECK(checkCallSignature(comm, {(uint32_t)CollKind::kReduce, datatype, op, root, count}));
      return runReduce(comm, algo, root, static_cast<const char*>(sendbuff), isRoot ? static_cast<char*>(recvbuff) : nullptr,
                       count, datatype, op);
    }));
  });
}

attnResult_t attnBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           attnDataType_t datatype, int root, attnComm_t comm,
                           attnStream_t stream) {
  return guardedEntry([&]() -> attnResult_t {
    ApiCall call(comm);
    ATTN_CHECK(call.finish(call.check()));
    if (attnResult_t r = checkBroadcastArgs(comm, sendbuff, recvbuff, count, datatype, root, stream); r != attnSuccess)
      return call.finish(refuse(comm, stream, CollKind::kBroadcast, r));
    const size_t esz = dataTypeSize(datatype), bytes = count * esz;
    const int me = comm->rank;
    if (deviceRoute(comm)) {
      DeviceOp d = deviceColl(DeviceOpKind::kBroadcast, sendbuff, recvbuff, count, datatype,
                              {{sendbuff, me == root ? bytes : 0, true, false}, {recvbuff, bytes, false, true}},
                              [=](char* const* h) {
                                return attnBroadcast(h[0], h[1], count, datatype, root, comm, nullptr);
                              });
      d.root = root;
      d.sliceOp = [=](char* in, char* o, size_t c) { return attnBroadcast(in, o, c, datatype, root, comm, nullptr); };
      return call.finish(deviceEnqueue(comm, stream, std::move(d)));
    }
    BroadcastSetting algo;
    ATTN_CHECK(call.finish(readBroadcastSetting(&algo)));
    return call.finish(dispatch(comm, "Broadcast", [=] {
      ATTN_CHECK(checkCallSignature(comm, {(uint32_t)CollKind::kBroadcast, datatype, -1, root, count}));
      char* buf = static_cast<char*>(recvbuff);
      if (me == root && sendbuff != recvbuff) std::memmove(buf, sendbuff, bytes);
      return runBroadcast(comm, algo, root, buf, bytes, esz);
    }));
  });
}

attnResult_t attnAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                          attnDataType_t datatype, attnComm_t comm, attnStream_t stream) {
  return guardedEntry([&]() -> attnResult_t {
    ApiCall call(comm);
    ATTN_CHECK(call.finish(call.check()));
    if (attnResult_t r = checkAllToAllArgs(comm, sendbuff, recvbuff, count, datatype, stream); r != attnSuccess)
      return call.finish(refuse(comm, stream, CollKind::kAllToAll, r));
    const size_t esz = dataTypeSize(datatype), bytes = count * esz;
    const int n = comm->nranks;
    if (deviceRoute(comm)) {
      DeviceOp d = deviceColl(DeviceOpKind::kAllToAll, sendbuff, recvbuff, count, datatype,
                              {{sendbuff, bytes * n, true, false}, {recvbuff, bytes * n, false, true}},
                              [=](char* const* h) { return attnAllToAll(h[0], h[1], count, datatype, comm, nullptr); });
      d.sliceOp = [=](char* in, char* o, size_t c) { return attnAllToAll(in, o, c, datatype, comm, nullptr); };
      return call.finish(deviceEnqueue(comm, stream, std::move(d)));
    }
    AllToAllSetting schedule;
    ATTN_CHECK(call.finish(readAllToAllSetting(&schedule)));
    return call.finish(dispatch(comm, "AllToAll", [=] {
      ATTN_CHECK(checkCallSignature(comm, {(uint32_t)CollKind::kAllToAll, datatype, -1, -1, count}));
      std::vector<Block> blocks(n);
      for (int i = 0; i < n; ++i) blocks[i] = {i * bytes, bytes};
      return pairwiseAllToAllv(*comm->engine, static_cast<const char*>(sendbuff), blocks,
                               static_cast<char*>(recvbuff), blocks,
                               pickAllToAllSchedule(comm, schedule, bytes));
    }));
  });
}

attnResult_t attnAllToAllv(const void* sendbuff, const size_t* sendcounts, const size_t* sdispls,
                           void* recvbuff, const size_t* recvcounts, const size_t* rdispls,
                           attnDataType_t datatype, attnComm_t comm, attnStream_t stream) {
  return guardedEntry([&]() -> attnResult_t {
    ApiCall call(comm);
    ATTN_CHECK(call.finish(call.check()));
    std::vector<Block> sb, rb;
    if (attnResult_t r = checkAllToAllvArgs(comm, sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls,
                                            datatype, stream, &sb, &rb);
        r != attnSuccess)
      return call.finish(refuse(comm, stream, CollKind::kAllToAllv, r));
    const int n = comm->nranks;
    if (deviceRoute(comm)) {
      // Extents of both buffers; the receive side is also copied in, so the
      // gaps between blocks keep their contents. Counts are copied now: the
      // operation runs later, in stream order.
      size_t sendEnd = 0, recvEnd = 0;
      for (int p = 0; p < n; ++p) {
        if (sb[p].bytes) sendEnd = std::max(sendEnd, sb[p].offset + sb[p].bytes);
        if (rb[p].bytes) recvEnd = std::max(recvEnd, rb[p].offset + rb[p].bytes);
      }
      std::vector<size_t> sc(sendcounts, sendcounts + n), sd(sdispls, sdispls + n),
          rc(recvcounts, recvcounts + n), rd(rdispls, rdispls + n);
      DeviceOp d = deviceColl(DeviceOpKind::kAllToAllv, sendbuff, recvbuff, 0, datatype,
                              {{sendbuff, sendEnd, true, false}, {recvbuff, recvEnd, true, true}},
                              [=](char* const* h) {
                                return attnAllToAllv(h[0], sc.data(), sd.data(), h[1], rc.data(), rd.data(),
                                                     datatype, comm, nullptr);
                              });
      d.sendcounts = sc;
      d.sdispls = sd;
      d.recvcounts = rc;
      d.rdispls = rd;
      return call.finish(deviceEnqueue(comm, stream, std::move(d)));
    }
    AllToAllSetting schedule;
    ATTN_CHECK(call.finish(readAllToAllSetting(&schedule)));
    size_t maxBlock = 0;
    for (int p = 0; p < n; ++p) maxBlock = std::max({maxBlock, sb[p].bytes, rb[p].bytes});
    return call.finish(dispatch(comm, "AllToAllv", [=] {
      ATTN_CHECK(checkCallSignature(comm, {(uint32_t)CollKind::kAllToAllv, datatype, -1, -1, 0}));
      return pairwiseAllToAllv(*comm->engine, static_cast<const char*>(sendbuff), sb,
                               static_cast<char*>(recvbuff), rb, pickAllToAllSchedule(comm, schedule, maxBlock));
    }));
  });
}

attnResult_t attnBarrier(attnComm_t comm, attnStream_t stream) {
  return guardedEntry([&]() -> attnResult_t {
    ApiCall call(comm);
    ATTN_CHECK(call.finish(call.check()));
    if (deviceRoute(comm))
      return call.finish(deviceEnqueue(comm, stream,
                                       deviceColl(DeviceOpKind::kBarrier, nullptr, nullptr, 0, attnUint8, {},
                                                  [=](char* const*) { return attnBarrier(comm, nullptr); })));
    if (stream != nullptr)
      return call.finish(refuse(comm, stream, CollKind::kBarrier,
                                setError(attnInvalidArgument, "a host-memory communicator takes a NULL stream")));
    return call.finish(dispatch(comm, "Barrier", [=] {
      ATTN_CHECK(checkCallSignature(comm, {(uint32_t)CollKind::kBarrier, -1, -1, -1, 0}));
      return disseminationBarrier(*comm->engine);
    }));
  });
}

}  // extern "C"
