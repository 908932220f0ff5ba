// The NCCL backend (nccl_bridge.h): an engine's NCCL communicator under a
// device communicator (attnCommInitFromNccl, src/api/api_init_nccl.cc).
#include "src/device/backends/nccl/nccl_bridge.h"

#if ATTN_HAVE_NCCL

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "src/core/api_call.h"
#include "src/core/comm.h"
#include "src/core/datatype.h"
#include "src/core/log.h"
#include "src/device/cuda_check.h"
#include "src/device/device_route.h"
#include "src/device/device_scope.h"
#include "src/device/device_signature.h"
#include "src/device/device_state.h"
#include "src/device/retained_memory.h"

namespace attn {

struct NcclBridge {
  ncclComm_t nccl = nullptr;  // the engine's (it must outlive us), or owned
  bool owned = false;         // a split or shrunk child's: destroyed with us
  int device = -1;
  // One zeroed uint32: barriers all-reduce it in place. From the process's
  // cache (retained_memory.h): cudaFree would wait for the whole device,
  // where other ranks' NCCL kernels may wait for this rank.
  retained::Block scratchBlock;
  void* scratch = nullptr;
  ~NcclBridge() {
    if (scratch) retained::release(device, scratchBlock);
    if (!owned || !nccl) return;
    // A communicator with an error (a peer died) is aborted: destroying it
    // would wait for operations that cannot finish.
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(nccl, &async) != ncclSuccess || (async != ncclSuccess && async != ncclInProgress))
      (void)ncclCommAbort(nccl);
    else
      (void)ncclCommDestroy(nccl);
  }
};

void NcclBridgeDeleter::operator()(NcclBridge* b) const { delete b; }

namespace {

attnResult_t ncclFailure(ncclResult_t r, const char* what, ncclComm_t comm) {
  attnResult_t code;
  switch (r) {
    case ncclUnhandledCudaError: code = attnUnhandledCudaError; break;
    case ncclInvalidArgument: code = attnInvalidArgument; break;
    case ncclInvalidUsage: code = attnInvalidUsage; break;
    case ncclRemoteError: code = attnRemoteError; break;
    default: code = attnSystemError; break;  // ncclSystemError, ncclInternalError, ...
  }
  const char* last = ncclGetLastError(comm);
  return setError(code, "%s failed: NCCL %s%s%s", what, ncclGetErrorString(r),
                  last && *last ? ": " : "", last ? last : "");
}

// A non-blocking NCCL communicator answers ncclInProgress while it finishes
// the call; the call is stream-ordered only once that settles.
ncclResult_t settle(ncclComm_t comm, ncclResult_t r) {
  while (r == ncclInProgress) {
    std::this_thread::yield();
    if (ncclResult_t q = ncclCommGetAsyncError(comm, &r); q != ncclSuccess) return q;
  }
  return r;
}

// `what` names the NCCL call in the message.
#define ATTN_NCCL_CHECK(comm, what, call)                                          \
  do {                                                                             \
    ncclResult_t attn_nccl_r_ = settle((comm), (call));                            \
    if (attn_nccl_r_ != ncclSuccess) return ncclFailure(attn_nccl_r_, what, (comm)); \
  } while (0)

ncclDataType_t ncclType(attnDataType_t t) {
  switch (t) {
    case attnInt8: return ncclInt8;
    case attnUint8: return ncclUint8;
    case attnInt32: return ncclInt32;
    case attnInt64: return ncclInt64;
    case attnFloat16: return ncclFloat16;
    case attnFloat32: return ncclFloat32;
    case attnFloat64: return ncclFloat64;
    case attnBfloat16: return ncclBfloat16;
    default: break;
  }
  return ncclUint8;  // not reached: the API validated the type
}

ncclRedOp_t ncclOp(attnRedOp_t op) {
  switch (op) {
    case attnSum: return ncclSum;
    case attnProd: return ncclProd;
    case attnMax: return ncclMax;
    case attnMin: return ncclMin;
    case attnAvg: return ncclAvg;
    default: break;
  }
  return ncclSum;  // not reached
}

// This thread's NCCL group inside an attn group: opened at the first NCCL
// call, launched by ncclGroupFlush at the outermost attnGroupEnd.
thread_local bool tlsGroupOpen = false;
thread_local std::vector<ncclComm_t> tlsGroupComms;

ncclResult_t joinThreadGroup(ncclComm_t comm) {
  if (!inGroup()) return ncclSuccess;
  if (!tlsGroupOpen) {
    if (ncclResult_t r = ncclGroupStart(); r != ncclSuccess) return r;
    tlsGroupOpen = true;
  }
  if (std::find(tlsGroupComms.begin(), tlsGroupComms.end(), comm) == tlsGroupComms.end())
    tlsGroupComms.push_back(comm);
  return ncclSuccess;
}

// Sends and receives as one NCCL group; the group is closed even when a call
// in it fails (NCCL then drops the group and reports the error).
template <typename Body>
ncclResult_t p2pGroup(Body body) {
  if (ncclResult_t r = ncclGroupStart(); r != ncclSuccess) return r;
  ncclResult_t r = body();
  ncclResult_t end = ncclGroupEnd();
  return r != ncclSuccess ? r : end;
}

// Staged operations (attention) use the host engine on the proxy thread:
// they are let finish before the caller's thread uses it.
void waitForStagedWork(attnComm* comm) {
  while (deviceBusy(comm) && !comm->abortFlag.load())
    std::this_thread::sleep_for(std::chrono::microseconds(100));
}

// ATTN_CHECK=1: the same signature exchange as the host path, on the host
// engine, before the NCCL call (device_signature.h). Inside a group
// the check is skipped: one thread may drive several ranks there, and a
// blocking exchange would wait for a rank the thread has not reached.
attnResult_t checkNcclSignature(attnComm* comm, const DeviceOp& op) {
  CollSignature sig;
  if (!comm->config.checkSignatures || inGroup() || !deviceOpSignature(op, &sig)) return attnSuccess;
  waitForStagedWork(comm);
  return checkSignature(comm, sig);
}

// One block of elements to or from every peer (all-to-all[v]).
ncclResult_t exchange(ncclComm_t nc, const DeviceOp& op, cudaStream_t s, int nranks) {
  const size_t esz = dataTypeSize(op.type);
  const ncclDataType_t t = ncclType(op.type);
  const char* send = static_cast<const char*>(op.send);
  char* recv = static_cast<char*>(op.recv);
  const bool v = op.kind == DeviceOpKind::kAllToAllv;
  return p2pGroup([&]() -> ncclResult_t {
    for (int p = 0; p < nranks; ++p) {
      size_t sc = v ? op.sendcounts[p] : op.count, rc = v ? op.recvcounts[p] : op.count;
      size_t so = (v ? op.sdispls[p] : p * op.count) * esz, ro = (v ? op.rdispls[p] : p * op.count) * esz;
      // Zero-count blocks are left out on both sides (counts agree pairwise).
      if (sc) {
        if (ncclResult_t r = ncclSend(send + so, sc, t, p, nc, s); r != ncclSuccess) return r;
      }
      if (rc) {
        if (ncclResult_t r = ncclRecv(recv + ro, rc, t, p, nc, s); r != ncclSuccess) return r;
      }
    }
    return ncclSuccess;
  });
}

}  // namespace

attnResult_t ncclRefuse(attnComm* comm, const CollSignature& refused) {
  if (!comm->config.checkSignatures || inGroup()) return attnSuccess;
  waitForStagedWork(comm);
  return sendRefusedSignature(comm, refused);
}

attnResult_t ncclEnqueue(attnComm* comm, NcclBridge* b, attnStream_t stream, DeviceOp& op) {
  ATTN_CHECK(checkNcclSignature(comm, op));
  DeviceScope dev;
  ATTN_CHECK(dev.enter(b->device));
  ncclComm_t nc = b->nccl;
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  ATTN_NCCL_CHECK(nc, "ncclGroupStart", joinThreadGroup(nc));
  const ncclDataType_t t = ncclType(op.type);
  switch (op.kind) {
    case DeviceOpKind::kAllGather:
      if (op.count)
        ATTN_NCCL_CHECK(nc, "ncclAllGather", ncclAllGather(op.send, op.recv, op.count, t, nc, s));
      return attnSuccess;
    case DeviceOpKind::kReduceScatter:
      if (op.count)
        ATTN_NCCL_CHECK(nc, "ncclReduceScatter",
                        ncclReduceScatter(op.send, op.recv, op.count, t, ncclOp(op.op), nc, s));
      return attnSuccess;
    case DeviceOpKind::kAllReduce:
      if (op.count)
        ATTN_NCCL_CHECK(nc, "ncclAllReduce",
                        ncclAllReduce(op.send, op.recv, op.count, t, ncclOp(op.op), nc, s));
      return attnSuccess;
    case DeviceOpKind::kBroadcast:
      // Non-roots may pass no sendbuff; NCCL reads it only on the root.
      if (op.count)
        ATTN_NCCL_CHECK(nc, "ncclBroadcast",
                        ncclBroadcast(op.send ? op.send : op.recv, op.recv, op.count, t, op.root, nc, s));
      return attnSuccess;
    case DeviceOpKind::kReduce:
      // Non-roots pass no recvbuff; NCCL writes it only on the root.
      if (op.count)
        ATTN_NCCL_CHECK(nc, "ncclReduce",
                        ncclReduce(op.send, op.recv, op.count, t, ncclOp(op.op), op.root, nc, s));
      return attnSuccess;
    case DeviceOpKind::kAllToAll:
    case DeviceOpKind::kAllToAllv:
      ATTN_NCCL_CHECK(nc, "all-to-all as ncclSend/ncclRecv", exchange(nc, op, s, comm->nranks));
      return attnSuccess;
    case DeviceOpKind::kP2pGroup:
      // Self pairs included: NCCL matches a send and a receive to its own
      // rank inside one group. Empty messages are left out on both sides
      // (sizes match exactly, so they pair with each other).
      ATTN_NCCL_CHECK(nc, "grouped ncclSend/ncclRecv", p2pGroup([&]() -> ncclResult_t {
        for (const P2pOp& o : op.p2p) {
          if (o.bytes == 0) continue;
          ncclResult_t r = o.isSend ? ncclSend(o.buf, o.bytes, ncclUint8, o.peer, nc, s)
                                    : ncclRecv(o.buf, o.bytes, ncclUint8, o.peer, nc, s);
          if (r != ncclSuccess) return r;
        }
        return ncclSuccess;
      }));
      return attnSuccess;
    case DeviceOpKind::kBarrier:
      // Every rank's stream passes this point only once all ranks reached it.
      ATTN_NCCL_CHECK(nc, "barrier (ncclAllReduce)",
                      ncclAllReduce(b->scratch, b->scratch, 1, ncclUint32, ncclSum, nc, s));
      return attnSuccess;
  }
  return setError(attnInternalError, "operation kind %d has no NCCL form", (int)op.kind);
}

attnResult_t ncclGroupFlush() {
  if (!tlsGroupOpen) return attnSuccess;
  tlsGroupOpen = false;
  std::vector<ncclComm_t> comms = std::move(tlsGroupComms);
  tlsGroupComms.clear();
  ncclResult_t r = ncclGroupEnd();
  if (r == ncclInProgress) {  // non-blocking NCCL communicators: wait until each has it
    r = ncclSuccess;
    for (ncclComm_t c : comms)
      if (ncclResult_t q = settle(c, ncclInProgress); q != ncclSuccess && r == ncclSuccess) r = q;
  }
  if (r != ncclSuccess)
    return ncclFailure(r, "ncclGroupEnd (the group's NCCL calls)", comms.empty() ? nullptr : comms[0]);
  return attnSuccess;
}

namespace {

// Rank 0's attnUniqueId, sent to every rank over NCCL itself. The first byte
// says whether rank 0 could make one, so a failure there reaches every rank
// instead of leaving them waiting.
constexpr size_t kScratchBytes = 256;
static_assert(kNcclIdMessageBytes <= kScratchBytes, "the id travels through the scratch buffer");

attnResult_t makeBridge(ncclComm_t nc, int device, NcclBridgePtr* out) {
  NcclBridgePtr b(new NcclBridge);
  b->nccl = nc;
  b->device = device;
  DeviceScope dev;
  ATTN_CHECK(dev.enter(device));
  ATTN_CHECK(retained::acquire(device, kScratchBytes, &b->scratchBlock));
  b->scratch = b->scratchBlock.ptr;
  *out = std::move(b);
  return attnSuccess;
}

// Broadcasts msg from rank 0 through the bridge's scratch buffer, then zeroes
// the buffer for barriers. A private non-blocking stream: waiting on the
// legacy stream or the device could wait for other ranks' NCCL kernels
// (ranks may be threads sharing the GPU) that wait for us.
attnResult_t broadcastId(NcclBridge& b, char* msg) {
  DeviceScope dev;
  ATTN_CHECK(dev.enter(b.device));
  cudaStream_t s = nullptr;
  ATTN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  struct Cleanup {
    cudaStream_t s;
    ~Cleanup() { cudaStreamDestroy(s); }
  } cleanup{s};
  ncclComm_t nc = b.nccl;
  ATTN_CUDA_CHECK(cudaMemcpyAsync(b.scratch, msg, kNcclIdMessageBytes, cudaMemcpyHostToDevice, s));
  ATTN_NCCL_CHECK(nc, "ncclBroadcast of the unique id",
                  ncclBroadcast(b.scratch, b.scratch, kNcclIdMessageBytes, ncclUint8, 0, nc, s));
  ATTN_CUDA_CHECK(cudaMemcpyAsync(msg, b.scratch, kNcclIdMessageBytes, cudaMemcpyDeviceToHost, s));
  ATTN_CUDA_CHECK(cudaMemsetAsync(b.scratch, 0, kScratchBytes, s));  // 0 + 0 stays 0: no overflow
  ATTN_CUDA_CHECK(cudaStreamSynchronize(s));
  return attnSuccess;
}

// A child's NCCL communicator, once NCCL has finished making it.
attnResult_t adoptChild(ncclComm_t parentNccl, ncclResult_t made, ncclComm_t child, int device, const char* what,
                        NcclBridgePtr* out) {
  made = settle(child ? child : parentNccl, made);
  if (made != ncclSuccess) {
    const attnResult_t r = ncclFailure(made, what, parentNccl);
    if (child) (void)ncclCommAbort(child);
    return r;
  }
  if (!child) return attnSuccess;  // this rank is in no child
  NcclBridgePtr b;
  if (attnResult_t r = makeBridge(child, device, &b); r != attnSuccess) {
    (void)ncclCommAbort(child);
    return r;
  }
  b->owned = true;
  *out = std::move(b);
  return attnSuccess;
}

}  // namespace

bool ncclBacked(const attnComm* comm) { return comm->device && comm->device->nccl; }

attnResult_t ncclSplitChild(attnComm* parent, int color, int newRank, NcclBridgePtr* child) {
  NcclBridge& p = *parent->device->nccl;
  DeviceScope dev;
  ATTN_CHECK(dev.enter(p.device));
  ncclComm_t made = nullptr;
  // The key is the rank attncomm gave this rank: both children order alike.
  const ncclResult_t r =
      ncclCommSplit(p.nccl, color == ATTN_SPLIT_NOCOLOR ? NCCL_SPLIT_NOCOLOR : color, newRank, &made, nullptr);
  return adoptChild(p.nccl, r, made, p.device, "ncclCommSplit", child);
}

attnResult_t ncclShrinkChild(attnComm* parent, const std::vector<int>& excluded, bool abort, NcclBridgePtr* child) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
  NcclBridge& p = *parent->device->nccl;
  DeviceScope dev;
  ATTN_CHECK(dev.enter(p.device));
  std::vector<int> list(excluded);
  ncclComm_t made = nullptr;
  const ncclResult_t r = ncclCommShrink(p.nccl, list.data(), static_cast<int>(list.size()), &made, nullptr,
                                        abort ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT);
  return adoptChild(p.nccl, r, made, p.device, "ncclCommShrink", child);
#else
  (void)parent, (void)excluded, (void)abort, (void)child;
  ATTN_INFO(kLogInit, "attnCommShrink: NCCL %d has no ncclCommShrink; the shrunk communicator runs on attncomm's "
            "device path", NCCL_VERSION_CODE);
  return attnSuccess;
#endif
}

void ncclAdopt(attnComm* comm, NcclBridgePtr child) {
  if (child && comm->device) comm->device->nccl = std::move(child);
}

attnResult_t ncclOpen(void* handle, int* rank, int* nranks, int* device, NcclBridgePtr* bridge) {
  ncclComm_t nc = static_cast<ncclComm_t>(handle);
  ATTN_NCCL_CHECK(nc, "ncclCommUserRank", ncclCommUserRank(nc, rank));
  ATTN_NCCL_CHECK(nc, "ncclCommCount", ncclCommCount(nc, nranks));
  ATTN_NCCL_CHECK(nc, "ncclCommCuDevice", ncclCommCuDevice(nc, device));
  return makeBridge(nc, *device, bridge);
}

attnResult_t ncclBroadcastIdMessage(NcclBridge* bridge, char* msg) { return broadcastId(*bridge, msg); }

attnResult_t ncclAsyncError(NcclBridge* nccl) {
  ncclResult_t async = ncclSuccess;
  if (ncclResult_t q = ncclCommGetAsyncError(nccl->nccl, &async); q != ncclSuccess)
    return ncclFailure(q, "ncclCommGetAsyncError", nccl->nccl);
  if (async == ncclSuccess || async == ncclInProgress) return attnSuccess;
  return ncclFailure(async, "an NCCL operation (asynchronous error)", nccl->nccl);
}

}  // namespace attn

#else  // no NCCL in this build: the bridge never exists (api_nccl_absent.cc answers)

namespace attn {
struct NcclBridge {};
void NcclBridgeDeleter::operator()(NcclBridge* b) const { delete b; }
}  // namespace attn

#endif
