// C API: the standard collectives. Each entry validates its arguments, then
// launches the call: on a device communicator, to the device backends
// (src/device/device_route.h); else as a closure, run now, in the group or
// on the executor, that checks the signature (ATTN_CHECK) and runs the
// library's internal collective entry (src/coll/coll_entry.h). With
// signature checks on, a rank that refuses its arguments still takes part
// in the signature exchange (src/api/refuse.h), so its peers fail the call
// too instead of waiting for it.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "src/coll/coll.h"
#include "src/coll/coll_entry.h"
#include "src/api/refuse.h"
#include "src/coll/signature.h"
#include "src/core/api_call.h"
#include "src/core/datatype.h"
#include "src/device/device_route.h"

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

bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return an && bn && x < y + bn && y < x + an;
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

// The signature every rank's call is checked against (ATTN_CHECK).
CollSignature signatureOf(const CollArgs& a) {
  const bool reduces = a.kind == CollKind::kReduceScatter || a.kind == CollKind::kAllReduce || a.kind == CollKind::kReduce;
  const bool rooted = a.kind == CollKind::kReduce || a.kind == CollKind::kBroadcast;
  CollSignature sig;
  sig.kind = static_cast<uint32_t>(a.kind);
  sig.datatype = a.kind == CollKind::kBarrier ? -1 : a.type;
  sig.op = reduces ? a.op : -1;
  sig.root = rooted ? a.root : -1;
  sig.count = a.count;
  return sig;
}

DeviceOpKind deviceKindOf(CollKind k) {
  switch (k) {
    case CollKind::kAllGather: return DeviceOpKind::kAllGather;
    case CollKind::kReduceScatter: return DeviceOpKind::kReduceScatter;
    case CollKind::kAllReduce: return DeviceOpKind::kAllReduce;
    case CollKind::kBroadcast: return DeviceOpKind::kBroadcast;
    case CollKind::kReduce: return DeviceOpKind::kReduce;
    case CollKind::kAllToAll: return DeviceOpKind::kAllToAll;
    case CollKind::kAllToAllv: return DeviceOpKind::kAllToAllv;
    default: return DeviceOpKind::kBarrier;
  }
}

// Launches a validated call. A device communicator's backends get the
// operation with the buffers staging would copy ([0] send, [1] receive);
// a host communicator runs it now, in the group or on the executor. The
// algorithm settings are read here, at the call, for both.
attnResult_t launch(attnComm* comm, attnStream_t stream, const char* name, CollArgs a,
                    std::vector<DeviceSpan> spans) {
  CollSettings settings;
  ATTN_CHECK(readCollSettings(a.kind, &settings));
  if (deviceRoute(comm)) {
    DeviceOp d;
    d.kind = deviceKindOf(a.kind);
    d.send = a.send;
    d.recv = a.recv;
    d.count = a.count;
    d.type = a.type;
    d.op = a.op;
    d.root = a.root;
    d.sendcounts = std::move(a.sendcounts);
    d.sdispls = std::move(a.sdispls);
    d.recvcounts = std::move(a.recvcounts);
    d.rdispls = std::move(a.rdispls);
    d.spans = std::move(spans);
    d.settings = settings;
    return deviceEnqueue(comm, stream, std::move(d));
  }
  const CollSignature sig = signatureOf(a);
  return dispatch(comm, name, [comm, a = std::move(a), settings, sig] {
    ATTN_CHECK(checkSignature(comm, sig));
    return runHostCollective(comm, a, settings);
  });
}

CollArgs argsOf(CollKind kind, const void* send, void* recv, size_t count, attnDataType_t type) {
  CollArgs a;
  a.kind = kind;
  a.send = send;
  a.recv = recv;
  a.count = count;
  a.type = type;
  return a;
}

}  // namespace

extern "C" {

attnResult_t attnAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           attnDataType_t datatype, attnComm_t comm, attnStream_t stream) {
  return guardedEntry([&]() -> attnResult_t {
    ApiCall call(comm);
    ATTN_CHECK(call.finish(call.check()));
    if (attnResult_t r = checkAllGatherArgs(comm, sendbuff, recvbuff, sendcount, datatype, stream); r != attnSuccess)
      return call.finish(refuseCollective(comm, stream, CollKind::kAllGather, r));
    const size_t bytes = sendcount * dataTypeSize(datatype);
    return call.finish(launch(comm, stream, "AllGather",
                              argsOf(CollKind::kAllGather, sendbuff, recvbuff, sendcount, datatype),
                              {{sendbuff, bytes, true, false}, {recvbuff, bytes * comm->nranks, false, true}}));
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
      return call.finish(refuseCollective(comm, stream, CollKind::kReduceScatter, r));
    const size_t bytes = recvcount * dataTypeSize(datatype);
    CollArgs a = argsOf(CollKind::kReduceScatter, sendbuff, recvbuff, recvcount, datatype);
    a.op = op;
    return call.finish(launch(comm, stream, "ReduceScatter", std::move(a),
                              {{sendbuff, bytes * comm->nranks, true, false}, {recvbuff, bytes, false, true}}));
  });
}

attnResult_t attnAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           attnDataType_t datatype, attnRedOp_t op, attnComm_t comm,
                           attnStream_t stream) {
  return guardedEntry([&]() -> attnResult_t {
    ApiCall call(comm);
    ATTN_CHECK(call.finish(call.check()));
    if (attnResult_t r = checkAllReduceArgs(comm, sendbuff, recvbuff, count, datatype, op, stream); r != attnSuccess)
      return call.finish(refuseCollective(comm, stream, CollKind::kAllReduce, r));
    const size_t bytes = count * dataTypeSize(datatype);
    CollArgs a = argsOf(CollKind::kAllReduce, sendbuff, recvbuff, count, datatype);
    a.op = op;
    return call.finish(launch(comm, stream, "AllReduce", std::move(a),
                              {{sendbuff, bytes, true, false}, {recvbuff, bytes, false, true}}));
  });
}

attnResult_t attnReduce(const void* sendbuff, void* recvbuff, size_t count, attnDataType_t datatype,
                        attnRedOp_t op, int root, attnComm_t comm, attnStream_t stream) {
  return guardedEntry([&]() -> attnResult_t {
    ApiCall call(comm);
    ATTN_CHECK(call.finish(call.check()));
    if (attnResult_t r = checkReduceArgs(comm, sendbuff, recvbuff, count, datatype, op, root, stream); r != attnSuccess)
      return call.finish(refuseCollective(comm, stream, CollKind::kReduce, r));
    const size_t bytes = count * dataTypeSize(datatype);
    const bool isRoot = comm->rank == root;
    void* out = isRoot ? recvbuff : nullptr;  // only the root's is written
    CollArgs a = argsOf(CollKind::kReduce, sendbuff, out, count, datatype);
    a.op = op;
    a.root = root;
    return call.finish(launch(comm, stream, "Reduce", std::move(a),
                              {{sendbuff, bytes, true, false}, {out, isRoot ? bytes : 0, false, true}}));
  });
}

attnResult_t attnBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           attnDataType_t datatype, int root, attnComm_t comm,
                           attnStream_t stream) {
  return guardedEntry([&]() -> attnResult_t {
    ApiCall call(comm);
    ATTN_CHECK(call.finish(call.check()));
    if (attnResult_t r = checkBroadcastArgs(comm, sendbuff, recvbuff, count, datatype, root, stream); r != attnSuccess)
      return call.finish(refuseCollective(comm, stream, CollKind::kBroadcast, r));
    const size_t bytes = count * dataTypeSize(datatype);
    CollArgs a = argsOf(CollKind::kBroadcast, sendbuff, recvbuff, count, datatype);
    a.root = root;
    return call.finish(launch(comm, stream, "Broadcast", std::move(a),
                              {{sendbuff, comm->rank == root ? bytes : 0, true, false}, {recvbuff, bytes, false, true}}));
  });
}

attnResult_t attnAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                          attnDataType_t datatype, attnComm_t comm, attnStream_t stream) {
  return guardedEntry([&]() -> attnResult_t {
    ApiCall call(comm);
    ATTN_CHECK(call.finish(call.check()));
    if (attnResult_t r = checkAllToAllArgs(comm, sendbuff, recvbuff, count, datatype, stream); r != attnSuccess)
      return call.finish(refuseCollective(comm, stream, CollKind::kAllToAll, r));
    const size_t total = count * dataTypeSize(datatype) * comm->nranks;
    return call.finish(launch(comm, stream, "AllToAll",
                              argsOf(CollKind::kAllToAll, sendbuff, recvbuff, count, datatype),
                              {{sendbuff, total, true, false}, {recvbuff, total, false, true}}));
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
      return call.finish(refuseCollective(comm, stream, CollKind::kAllToAllv, r));
    const int n = comm->nranks;
    // Extents of both buffers for staging; the receive side is also copied
    // in, so the gaps between blocks keep their contents. Counts are copied
    // now: the operation may run later.
    size_t sendEnd = 0, recvEnd = 0;
    for (int p = 0; p < n; ++p) {
      if (sb[p].bytes) sendEnd = std::max(sendEnd, sb[p].offset + sb[p].bytes);
      if (rb[p].bytes) recvEnd = std::max(recvEnd, rb[p].offset + rb[p].bytes);
    }
    CollArgs a = argsOf(CollKind::kAllToAllv, sendbuff, recvbuff, 0, datatype);
    a.sendcounts.assign(sendcounts, sendcounts + n);
    a.sdispls.assign(sdispls, sdispls + n);
    a.recvcounts.assign(recvcounts, recvcounts + n);
    a.rdispls.assign(rdispls, rdispls + n);
    return call.finish(launch(comm, stream, "AllToAllv", std::move(a),
                              {{sendbuff, sendEnd, true, false}, {recvbuff, recvEnd, true, true}}));
  });
}

attnResult_t attnBarrier(attnComm_t comm, attnStream_t stream) {
  return guardedEntry([&]() -> attnResult_t {
    ApiCall call(comm);
    ATTN_CHECK(call.finish(call.check()));
    if (stream != nullptr && !deviceRoute(comm))
      return call.finish(refuseCollective(comm, stream, CollKind::kBarrier,
                                setError(attnInvalidArgument, "a host-memory communicator takes a NULL stream")));
    return call.finish(launch(comm, stream, "Barrier", argsOf(CollKind::kBarrier, nullptr, nullptr, 0, attnUint8), {}));
  });
}

}  // extern "C"
