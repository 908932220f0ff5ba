// The emulated NCCL's operations: collectives, ncclSend / ncclRecv and
// groups. Each call is checked when issued (device memory, arguments), as
// NCCL checks, and gets its issue number when its group is launched: the
// n-th collective of a communicator meets the n-th of every peer, the n-th
// send from a to b the n-th receive of b from a. A launched group runs on
// its stream's thread (several streams of one communicator join first, as
// NCCL joins them): sends are posted, collectives run in order, receives
// take their sends, then the sends wait until taken. Every wait fails when
// a rank it needs aborted; failures are asynchronous errors of the
// communicator, as NCCL's.
#include <algorithm>
#include <cstring>
#include <functional>

#include "kernels/cpu/reduce.h"
#include "tests/cuda_emu/emu_core.h"
#include "tests/cuda_emu/nccl/emu_nccl.h"

namespace attn_emu::nccl {
namespace {

const char* kKindName[kKinds] = {"ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast",
                                 "ncclReduce"};

size_t typeSize(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;  // fp8 and unknown types: not emulated
  }
}

// The library's host reductions where attncomm has the type; NCCL's
// unsigned 32/64-bit types here.
template <typename U>
void reduceUnsigned(void* dst, const void* src, size_t n, ncclRedOp_t op) {
  U* d = static_cast<U*>(dst);
  const U* s = static_cast<const U*>(src);
  for (size_t i = 0; i < n; ++i) {
    switch (op) {
      case ncclProd: d[i] = U(d[i] * s[i]); break;
      case ncclMax: d[i] = std::max(d[i], s[i]); break;
      case ncclMin: d[i] = std::min(d[i], s[i]); break;
      default: d[i] = U(d[i] + s[i]); break;  // sum, avg
    }
  }
}

bool attnType(ncclDataType_t t, attnDataType_t* out) {
  switch (t) {
    case ncclInt8: *out = attnInt8; return true;
    case ncclUint8: *out = attnUint8; return true;
    case ncclInt32: *out = attnInt32; return true;
    case ncclInt64: *out = attnInt64; return true;
    case ncclFloat16: *out = attnFloat16; return true;
    case ncclFloat32: *out = attnFloat32; return true;
    case ncclFloat64: *out = attnFloat64; return true;
    case ncclBfloat16: *out = attnBfloat16; return true;
    default: return false;
  }
}

attnRedOp_t attnOp(ncclRedOp_t op) {
  switch (op) {
    case ncclProd: return attnProd;
    case ncclMax: return attnMax;
    case ncclMin: return attnMin;
    default: return attnSum;  // avg: sum, then divided
  }
}

void reduceInto(void* dst, const void* src, size_t n, ncclDataType_t t, ncclRedOp_t op) {
  attnDataType_t at;
  if (attnType(t, &at)) attn::cpu::reduceInto(dst, src, n, at, attnOp(op));
  else if (t == ncclUint32) reduceUnsigned<uint32_t>(dst, src, n, op);
  else reduceUnsigned<uint64_t>(dst, src, n, op);
}

void finishAvg(void* dst, size_t n, ncclDataType_t t, ncclRedOp_t op, int nranks) {
  if (op != ncclAvg) return;
  attnDataType_t at;
  if (attnType(t, &at)) {
    attn::cpu::divideInPlace(dst, n, at, nranks);
  } else if (t == ncclUint32) {
    for (size_t i = 0; i < n; ++i) static_cast<uint32_t*>(dst)[i] /= uint32_t(nranks);
  } else {
    for (size_t i = 0; i < n; ++i) static_cast<uint64_t*>(dst)[i] /= uint64_t(nranks);
  }
}

// One call of a group.
struct OpCall {
  enum What { kColl, kSend, kRecv } what = kColl;
  Clique::Call coll;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t bytes = 0;  // send / receive size
  int peer = -1;
  uint64_t seq = 0;  // given at launch
  cudaStream_t stream = nullptr;
  std::shared_ptr<RankState> st;
};

struct GroupState {
  int depth = 0;
  std::vector<OpCall> calls;
  ncclResult_t error = ncclSuccess;  // a call of the open group failed: the group is dropped
};
thread_local GroupState tlsGroup;

std::string callText(const Clique::Call& c) {
  return std::string(kKindName[c.kind]) + "(count " + std::to_string(c.count) + ", type " + std::to_string(c.type) +
         ", op " + std::to_string(c.op) + ", root " + std::to_string(c.root) + ")";
}

// The device must reach a buffer the operation reads or writes; else it
// faults, as a kernel does.
bool reachable(const void* p, size_t bytes, const char* what) {
  if (attn_emu::deviceAccessible(p, bytes)) return true;
  attn_emu::stickyFault(cudaErrorIllegalAddress, std::string("NCCL ") + what + ": " + std::to_string(bytes) +
                                                     " bytes that are not device memory");
  return false;
}

// Rank me's output of a collective, from every rank's send buffer.
std::vector<char> collOutput(const Clique::CollSlot& s, int me, int n) {
  const Clique::Call& c = s.calls[size_t(me)];
  const size_t esz = typeSize(c.type), bytes = c.count * esz;
  std::vector<char> out;
  switch (c.kind) {
    case kAllReduce:
    case kReduce:
    case kReduceScatter: {
      if (c.kind == kReduce && me != c.root) break;
      const size_t off = c.kind == kReduceScatter ? size_t(me) * bytes : 0;
      out.assign(static_cast<const char*>(s.send[0]) + off, static_cast<const char*>(s.send[0]) + off + bytes);
      for (int r = 1; r < n; ++r)
        reduceInto(out.data(), static_cast<const char*>(s.send[size_t(r)]) + off, c.count, c.type, c.op);
      finishAvg(out.data(), c.count, c.type, c.op, n);
      break;
    }
    case kAllGather:
      out.resize(bytes * size_t(n));
      for (int r = 0; r < n; ++r) std::memcpy(out.data() + size_t(r) * bytes, s.send[size_t(r)], bytes);
      break;
    case kBroadcast: {
      const char* from = static_cast<const char*>(s.send[size_t(c.root)]);
      out.assign(from, from + bytes);
      break;
    }
  }
  return out;
}

// One collective on rank st's stream thread: meet, compute, meet, write.
void runColl(RankState& st, const OpCall& call) {
  Clique& c = *st.clique;
  const int n = c.nranks, me = st.rank;
  const std::vector<int> all = everyRank(n);
  std::unique_lock<std::mutex> g(c.mu);
  Clique::CollSlot& s = c.colls[call.seq];
  if (s.calls.empty()) {
    s.calls.resize(size_t(n));
    s.send.resize(size_t(n));
    s.recv.resize(size_t(n));
  }
  s.calls[size_t(me)] = call.coll;
  s.send[size_t(me)] = call.send;
  s.recv[size_t(me)] = call.recv;
  for (int r = 0; r < n && s.mismatch.empty(); ++r) {
    const Clique::Call& o = s.calls[size_t(r)];
    if (o.kind < 0 || r == me) continue;
    if (o.kind != call.coll.kind || o.count != call.coll.count || o.type != call.coll.type ||
        (o.kind != kAllGather && o.kind != kBroadcast && o.op != call.coll.op) || o.root != call.coll.root)
      s.mismatch = "collective " + std::to_string(call.seq) + ": rank " + std::to_string(me) + " called " +
                   callText(call.coll) + ", rank " + std::to_string(r) + " " + callText(o);
  }
  ++s.arrived;
  c.cv.notify_all();
  std::string why;
  c.cv.wait(g, [&] { return s.arrived == n || !(why = c.broken(all)).empty(); });
  if (s.arrived < n) return st.failAsync(ncclRemoteError, std::string(kKindName[call.coll.kind]) + ": " + why);
  const std::string mismatch = s.mismatch;
  g.unlock();
  std::vector<char> out;
  if (mismatch.empty()) out = collOutput(s, me, n);
  g.lock();
  ++s.computed;
  c.cv.notify_all();
  c.cv.wait(g, [&] { return s.computed == n || !(why = c.broken(all)).empty(); });
  if (s.computed < n) return st.failAsync(ncclRemoteError, std::string(kKindName[call.coll.kind]) + ": " + why);
  if (++s.left == n) c.colls.erase(call.seq);
  g.unlock();
  // Nobody reads the inputs any more: in-place outputs are safe to write.
  if (!mismatch.empty()) return st.failAsync(ncclInvalidUsage, mismatch);
  if (!out.empty()) std::memcpy(call.recv, out.data(), out.size());
}

// A launched group of one rank, on its stream thread.
void runGroup(const std::shared_ptr<RankState>& stp, const std::vector<OpCall>& calls) {
  RankState& st = *stp;
  Clique& c = *st.clique;
  const int me = st.rank;
  for (const OpCall& o : calls) {
    const bool ok = o.what == OpCall::kColl ? true
                    : o.what == OpCall::kSend ? reachable(o.send, o.bytes, "ncclSend")
                                              : reachable(o.recv, o.bytes, "ncclRecv");
    if (!ok) return;
  }
  std::vector<std::pair<const OpCall*, std::shared_ptr<Clique::SendPost>>> posted;
  {
    std::lock_guard<std::mutex> g(c.mu);
    for (const OpCall& o : calls)
      if (o.what == OpCall::kSend) {
        auto p = std::make_shared<Clique::SendPost>(Clique::SendPost{o.send, o.bytes});
        c.sends[{me, o.peer, o.seq}] = p;
        posted.push_back({&o, p});
      }
    c.cv.notify_all();
  }
  // On failure, sends not yet taken are withdrawn: their buffers are the
  // caller's again once the stream moves on.
  auto withdraw = [&] {
    std::lock_guard<std::mutex> g(c.mu);
    for (auto& [o, p] : posted)
      if (!p->taken) c.sends.erase({me, o->peer, o->seq});
  };
  for (const OpCall& o : calls)
    if (o.what == OpCall::kColl) {
      runColl(st, o);
      if (st.asyncError.load() != ncclSuccess) return withdraw();
    }
  for (const OpCall& o : calls) {
    if (o.what != OpCall::kRecv) continue;
    std::unique_lock<std::mutex> g(c.mu);
    const auto key = std::make_tuple(o.peer, me, o.seq);
    std::string why;
    c.cv.wait(g, [&] { return c.sends.count(key) || !(why = c.broken({o.peer, me})).empty(); });
    if (!c.sends.count(key)) {
      g.unlock();
      withdraw();
      return st.failAsync(ncclRemoteError, "ncclRecv from rank " + std::to_string(o.peer) + ": " + why);
    }
    std::shared_ptr<Clique::SendPost> p = c.sends[key];
    c.sends.erase(key);
    g.unlock();
    const size_t sent = p->bytes;
    if (sent == o.bytes) std::memcpy(o.recv, p->buf, sent);
    g.lock();
    p->taken = true;
    c.cv.notify_all();
    g.unlock();
    if (sent != o.bytes) {
      withdraw();
      return st.failAsync(ncclInvalidUsage, "ncclRecv of " + std::to_string(o.bytes) + " bytes from rank " +
                                                std::to_string(o.peer) + " met a send of " + std::to_string(sent));
    }
  }
  for (auto& [o, p] : posted) {
    std::unique_lock<std::mutex> g(c.mu);
    std::string why;
    c.cv.wait(g, [&] { return p->taken || !(why = c.broken({o->peer, me})).empty(); });
    if (!p->taken) {
      g.unlock();
      withdraw();
      return st.failAsync(ncclRemoteError, "ncclSend to rank " + std::to_string(o->peer) + ": " + why);
    }
  }
}

// Several streams of one rank in a group: the others wait for the work,
// which waits for them to arrive, so it runs after each stream's earlier
// work and before its later work.
struct Join {
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  bool done = false;
};

ncclResult_t launchRank(std::shared_ptr<RankState> st, std::vector<OpCall> calls) {
  // Issue numbers, in the order the calls were made.
  for (OpCall& o : calls) {
    if (o.what == OpCall::kColl) o.seq = st->collSeq++;
    else if (o.what == OpCall::kSend) o.seq = st->sendSeq[size_t(o.peer)]++;
    else o.seq = st->recvSeq[size_t(o.peer)]++;
  }
  std::vector<cudaStream_t> streams;
  for (const OpCall& o : calls)
    if (std::find(streams.begin(), streams.end(), o.stream) == streams.end()) streams.push_back(o.stream);
  auto join = std::make_shared<Join>();
  const int others = int(streams.size()) - 1;
  for (size_t i = 1; i < streams.size(); ++i) {
    cudaError_t e = attn_emu::enqueue(streams[i], [join] {
      std::unique_lock<std::mutex> g(join->mu);
      ++join->arrived;
      join->cv.notify_all();
      join->cv.wait(g, [&] { return join->done; });
    });
    if (e != cudaSuccess) return fail(ncclUnhandledCudaError, "NCCL group: stream %zu: %s", i, cudaGetErrorString(e));
  }
  cudaError_t e = attn_emu::enqueue(streams[0], [st, calls = std::move(calls), join, others] {
    {
      std::unique_lock<std::mutex> g(join->mu);
      join->cv.wait(g, [&] { return join->arrived == others; });
    }
    runGroup(st, calls);
    std::lock_guard<std::mutex> g(join->mu);
    join->done = true;
    join->cv.notify_all();
  });
  if (e != cudaSuccess) return fail(ncclUnhandledCudaError, "NCCL launch: %s", cudaGetErrorString(e));
  return ncclSuccess;
}

// Each rank's calls in one piece of stream work, ranks in the order the
// group first named them.
ncclResult_t launch(std::vector<OpCall> calls) {
  std::vector<std::shared_ptr<RankState>> ranks;
  for (const OpCall& o : calls)
    if (std::find(ranks.begin(), ranks.end(), o.st) == ranks.end()) ranks.push_back(o.st);
  for (const auto& r : ranks) {
    std::vector<OpCall> mine;
    for (const OpCall& o : calls)
      if (o.st == r) mine.push_back(o);
    if (ncclResult_t e = launchRank(r, std::move(mine)); e != ncclSuccess) return e;
  }
  return ncclSuccess;
}

// The checks NCCL makes when a call is issued, then the call joins the
// open group or is launched alone.
ncclResult_t issue(const char* what, ncclComm_t comm, cudaStream_t stream, OpCall call,
                   std::initializer_list<std::pair<const void*, size_t>> buffers) {
  auto refuse = [&](ncclResult_t r, const std::string& why) {
    if (tlsGroup.depth > 0 && tlsGroup.error == ncclSuccess) tlsGroup.error = r;
    return fail(r, "%s: %s", what, why.c_str());
  };
  if (comm == nullptr || comm->st == nullptr) return refuse(ncclInvalidArgument, "comm is NULL");
  if (attn_emu::enter() != cudaSuccess) return refuse(ncclUnhandledCudaError, "the CUDA runtime is unusable");
  call.st = comm->st;
  call.stream = stream;
  const int n = comm->st->clique->nranks;
  if (call.what != OpCall::kColl && (call.peer < 0 || call.peer >= n))
    return refuse(ncclInvalidArgument, "peer " + std::to_string(call.peer) + " of " + std::to_string(n));
  if (call.what == OpCall::kColl) {
    if (typeSize(call.coll.type) == 0) return refuse(ncclInvalidArgument, "data type not emulated");
    if (call.coll.op < ncclSum || call.coll.op > ncclAvg) return refuse(ncclInvalidArgument, "reduction op");
    if (call.coll.root < 0 || call.coll.root >= n) return refuse(ncclInvalidArgument, "root out of range");
  }
  for (const auto& [p, bytes] : buffers)
    if (bytes && !attn_emu::deviceAccessible(p, bytes))
      return refuse(ncclInvalidArgument, "a buffer of " + std::to_string(bytes) + " bytes is not device memory");
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &cap) != cudaSuccess) return refuse(ncclInvalidArgument, "invalid stream");
  if (cap != cudaStreamCaptureStatusNone)
    return refuse(ncclInvalidUsage, "stream capture of NCCL calls is not emulated");
  if (tlsGroup.depth > 0) {
    tlsGroup.calls.push_back(std::move(call));
    return ncclSuccess;
  }
  return launch({std::move(call)});
}

ncclResult_t collective(int kind, const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  OpCall call;
  call.what = OpCall::kColl;
  call.coll = Clique::Call{kind, count, type, op, root};
  call.send = send;
  call.recv = recv;
  const size_t bytes = count * typeSize(type);
  const int n = comm && comm->st ? comm->st->clique->nranks : 1, me = comm && comm->st ? comm->st->rank : 0;
  // What each rank reads and writes (the root alone for a reduce's output
  // and a broadcast's input).
  size_t in = bytes, out = bytes;
  if (kind == kAllGather) out = bytes * size_t(n);
  if (kind == kReduceScatter) in = bytes * size_t(n);
  if (kind == kBroadcast && me != root) in = 0;
  if (kind == kReduce && me != root) out = 0;
  return issue(kKindName[kind], comm, stream, call, {{send, in}, {recv, out}});
}

ncclResult_t pointToPoint(OpCall::What what, void* buf, size_t count, ncclDataType_t type, int peer,
                          ncclComm_t comm, cudaStream_t stream) {
  const char* name = what == OpCall::kSend ? "ncclSend" : "ncclRecv";
  if (typeSize(type) == 0) return fail(ncclInvalidArgument, "%s: data type not emulated", name);
  OpCall call;
  call.what = what;
  if (what == OpCall::kSend) call.send = buf;
  else call.recv = buf;
  call.bytes = count * typeSize(type);
  call.peer = peer;
  return issue(name, comm, stream, call, {{buf, call.bytes}});
}

}  // namespace
}  // namespace attn_emu::nccl

using namespace attn_emu::nccl;

extern "C" {

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return collective(kAllReduce, sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return collective(kAllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return collective(kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return collective(kBroadcast, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}

ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
  return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  return collective(kReduce, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return pointToPoint(OpCall::kSend, const_cast<void*>(sendbuff), count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return pointToPoint(OpCall::kRecv, recvbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclGroupStart() {
  ++tlsGroup.depth;
  return ncclSuccess;
}

// The outermost end launches the group, or drops it when one of its calls
// was refused (that call's error is returned again).
ncclResult_t ncclGroupEnd() {
  if (tlsGroup.depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--tlsGroup.depth > 0) return ncclSuccess;
  std::vector<OpCall> calls = std::move(tlsGroup.calls);
  tlsGroup.calls.clear();
  const ncclResult_t refused = tlsGroup.error;
  tlsGroup.error = ncclSuccess;
  if (refused != ncclSuccess) return refused;
  return calls.empty() ? ncclSuccess : launch(std::move(calls));
}

}  // extern "C"
