#include "src/device/backends/cuda_ipc/ipc_p2p.h"

#include <memory>
#include <string>
#include <vector>

#include "src/core/comm.h"
#include "src/core/error.h"
#include "src/core/log.h"
#include "src/device/cuda_check.h"
#include "src/device/backends/staging/staged_p2p.h"
#include "src/device/backends/direct/transport_direct.h"
#include "src/device/backends/cuda_ipc/ipc_stats.h"

namespace attn::ipc {
namespace {

// Sender -> receiver, once per send to a peer on this host.
struct SendDesc {
  AgreeCard card;
  IpcBuffer buf;  // usable: device memory of the sender's GPU; hasHandle: exportable
};
// Receiver -> sender, once per such send, after the receiver's copy.
struct Reply {
  int32_t pulled = 0;  // 1: the receiver copied the bytes (or failed to); 0: send them
  int32_t status = attnSuccess;
};
static_assert(std::is_trivially_copyable_v<SendDesc> && std::is_trivially_copyable_v<Reply>);

class P2pGroup {
 public:
  P2pGroup(attnComm* comm, IpcState& st, const DeviceOp& op, cudaStream_t copy)
      : comm_(comm), e_(*comm->engine), st_(st), ops_(op.p2p), copy_(copy), chunk_(op.stageChunk), me_(comm->rank),
        n_(ops_.size()), desc_(n_), reply_(n_), viaHost_(n_, false), req_(new Request[3 * n_]) {}

  attnResult_t run() {
    copySelfPairs();
    ATTN_CHECK(describe());
    const attnResult_t pulls = pull();
    ATTN_CHECK(answer());
    ATTN_CHECK(moveTheRest());
    if (pulls != attnSuccess) return pulls;
    for (size_t i = 0; i < n_; ++i)
      if (ops_[i].isSend && local(i) && reply_[i].status != attnSuccess)
        return setError(attnRemoteError, "cuda_ipc send to rank %d: its copy failed (%s); see its error",
                        ops_[i].peer, attnGetErrorString(attnResult_t(reply_[i].status)));
    return attnSuccess;
  }

 private:
  // A pair on this host, not a self pair: it exchanges descriptors.
  bool local(size_t i) const {
    const int p = ops_[i].peer;
    return p != me_ && comm_->peers[p].hostHash == comm_->peers[me_].hostHash;
  }
  Request* req(size_t i, int phase) { return &req_[3 * i + phase]; }

  // Self sends and receives pair up in order (checked at attnGroupEnd).
  void copySelfPairs() {
    std::vector<size_t> sends, recvs;
    for (size_t i = 0; i < n_; ++i)
      if (ops_[i].peer == me_) (ops_[i].isSend ? sends : recvs).push_back(i);
    for (size_t k = 0; k < sends.size() && k < recvs.size(); ++k)
      selfCopies_.push_back({sends[k], recvs[k]});
  }

  // Phase 1: each send's descriptor to its receiver. All are made before
  // any is posted, so a failure here leaves nothing in flight.
  attnResult_t describe() {
    std::string why;
    mine_ = st_.card(comm_, &why);
    for (size_t i = 0; i < n_; ++i) {
      const P2pOp& o = ops_[i];
      if (!local(i) || !o.isSend) continue;
      SendDesc& d = desc_[i];
      d.card = mine_;
      // Usable at all (device memory here), then exportable for a peer in
      // another process: a stream-ordered pool buffer is the first and not
      // the second, and a peer of this process reads it anyway.
      ATTN_CHECK(st_.exporter().describe(o.buf, o.bytes, st_.device(), false, &d.buf, &why));
      if (d.buf.usable && o.bytes) {
        IpcBuffer exported;
        ATTN_CHECK(st_.exporter().describe(o.buf, o.bytes, st_.device(), true, &exported, &why));
        if (exported.usable) d.buf = exported;
      }
    }
    return alongPairs(desc_, 0, /*fromSender=*/true);
  }

  // Phase 2: this rank's receives from peers it can read, and the self
  // copies, on the copy stream; then waits for them.
  attnResult_t pull() {
    attnResult_t r = attnSuccess;
    st_.importer().beginOp();
    for (auto [s, d] : selfCopies_)
      if (r == attnSuccess && ops_[s].bytes)
        r = cuda(cudaMemcpyAsync(ops_[d].buf, ops_[s].buf, ops_[s].bytes, cudaMemcpyDefault, copy_));
    for (size_t i = 0; i < n_; ++i) {
      if (ops_[i].isSend || ops_[i].peer == me_) continue;
      if (!local(i)) {
        viaHost_[i] = true;
        continue;
      }
      const SendDesc& d = desc_[i];
      Reply& rep = reply_[i];
      if (d.buf.bytes > ops_[i].bytes) {
        rep = {1, attnInvalidUsage};
        if (r == attnSuccess)
          r = setError(attnInvalidUsage, "receive of %zu bytes from rank %d met a send of %llu bytes",
                       ops_[i].bytes, ops_[i].peer, (unsigned long long)d.buf.bytes);
        continue;
      }
      const char* src = nullptr;
      std::string why;
      if (r == attnSuccess && readable(i, &why) && st_.importer().map(ops_[i].peer, sameProcess_, d.buf, &src) == attnSuccess) {
        rep.pulled = 1;
        if (d.buf.bytes) r = cuda(cudaMemcpyAsync(ops_[i].buf, src, d.buf.bytes, cudaMemcpyDefault, copy_));
        ipcCounters().p2pPulls.fetch_add(1, std::memory_order_relaxed);
      } else {
        if (why.empty()) why = threadLastError();
        st_.noteStaged(me_, why);
        viaHost_[i] = true;
      }
    }
    const attnResult_t synced = cuda(cudaStreamSynchronize(copy_));
    if (r == attnSuccess) r = synced;
    st_.importer().endOp();
    for (size_t i = 0; i < n_; ++i)
      if (!ops_[i].isSend && local(i) && reply_[i].pulled && reply_[i].status == attnSuccess) reply_[i].status = r;
    return r;
  }

  // Whether receive i can copy out of its sender's buffer; sets
  // sameProcess_ for the map that follows.
  bool readable(size_t i, std::string* why) {
    const SendDesc& d = desc_[i];
    if (!mine_.wants || !d.card.wants) {
      *why = "cuda_ipc is not allowed (ATTN_TRANSPORT) on rank " + std::to_string(mine_.wants ? ops_[i].peer : me_);
      return false;
    }
    if (!d.buf.usable) {
      *why = "rank " + std::to_string(ops_[i].peer) + "'s send buffer is not device memory of its GPU";
      return false;
    }
    IpcPeer way;
    bool ok = false;
    if (st_.reachOne(mine_, d.card, ops_[i].peer, &way, &ok, why) != attnSuccess) {
      *why = threadLastError();
      return false;
    }
    sameProcess_ = way.sameProcess;
    if (ok && !way.sameProcess && !d.buf.hasHandle) {
      *why = "rank " + std::to_string(ops_[i].peer) + "'s send buffer cannot be exported (stream-ordered pool?)";
      return false;
    }
    return ok;
  }

  // Phase 3: answers to the senders (in group order, which is the order
  // they expect them in), and theirs to this rank's sends.
  attnResult_t answer() { return alongPairs(reply_, 1, /*fromSender=*/false); }

  // records[i] of every op with a peer on this host, in group order, from
  // one side of its pair to the other (the sender's side or the
  // receiver's), as request `phase` of the op.
  template <class T>
  attnResult_t alongPairs(std::vector<T>& records, int phase, bool fromSender) {
    std::vector<Request*> wait;
    for (size_t i = 0; i < n_; ++i) {
      if (!local(i)) continue;
      const int peer = ops_[i].peer;
      if (ops_[i].isSend == fromSender) ATTN_CHECK(e_.isend(peer, &records[i], sizeof(T), req(i, phase)));
      else ATTN_CHECK(e_.irecv(peer, &records[i], sizeof(T), req(i, phase)));
      wait.push_back(req(i, phase));
    }
    return waitFor(wait);
  }

  // Phase 4: what was not pulled, over the host transport (every pair on
  // another host, and those that could not pull): the buffer itself where
  // the transport takes device memory, else through pinned host memory,
  // large messages in slices (staged_p2p.h).
  attnResult_t moveTheRest() {
    std::vector<Request*> wait;
    StagedP2p staged(e_, copy_, chunk_);
    size_t stagedOps = 0;
    for (size_t i = 0; i < n_; ++i) {
      const P2pOp& o = ops_[i];
      if (o.peer == me_) continue;
      if (o.isSend) viaHost_[i] = !local(i) || !reply_[i].pulled;
      if (!viaHost_[i]) continue;
      // Both ends of a pair get the same answer (ucx_connection.h): a
      // whole message on one side never meets slices on the other.
      if (e_.takesDeviceMemory(o.peer)) {
        viaHost_[i] = false;
        if (o.isSend) ATTN_CHECK(e_.isendDevice(o.peer, o.buf, o.bytes, req(i, 2)));
        else ATTN_CHECK(e_.irecvDevice(o.peer, o.buf, o.bytes, req(i, 2)));
        wait.push_back(req(i, 2));
        continue;
      }
      staged.add(o.peer, o.isSend, o.buf, o.bytes);
      ++stagedOps;
    }
    if (!wait.empty()) directCounters().p2p.fetch_add(wait.size(), std::memory_order_relaxed);
    if (!staged.empty()) {
      const attnResult_t r = staged.run(st_.p2pStage(), st_.p2pSliceEvents());
      // The device requests above point into this group, which is about to go.
      if (r != attnSuccess && !wait.empty() && !e_.broken()) e_.breakWith(r, threadLastError());
      ATTN_CHECK(r);
    }
    ATTN_CHECK(waitFor(wait));
    ipcCounters().p2pViaHost.fetch_add(stagedOps, std::memory_order_relaxed);
    return attnSuccess;
  }

  attnResult_t waitFor(const std::vector<Request*>& reqs) {
    for (Request* r : reqs) ATTN_CHECK(e_.wait(r));
    return attnSuccess;
  }

  attnResult_t cuda(cudaError_t e) {
    if (e == cudaSuccess) return attnSuccess;
    return setError(attnUnhandledCudaError, "cuda_ipc send/recv: %s (%s)", cudaGetErrorString(e),
                    cudaGetErrorName(e));
  }

  attnComm* comm_;
  Engine& e_;
  IpcState& st_;
  const std::vector<P2pOp>& ops_;
  cudaStream_t copy_;
  const size_t chunk_;  // ATTN_DEVICE_STAGE_CHUNK at the call
  const int me_;
  const size_t n_;
  AgreeCard mine_;
  std::vector<SendDesc> desc_;  // a send's own descriptor, or a receive's sender's
  std::vector<Reply> reply_;    // a receive's answer, or a send's receiver's
  std::vector<bool> viaHost_;
  std::vector<std::pair<size_t, size_t>> selfCopies_;  // (send, receive)
  bool sameProcess_ = false;
  std::unique_ptr<Request[]> req_;  // three phases per op; outlive the waits
};

}  // namespace

attnResult_t runP2pGroup(attnComm* comm, IpcState& st, const DeviceOp& op, cudaStream_t copy) {
  P2pGroup g(comm, st, op, copy);
  const attnResult_t r = g.run();
  if (r == attnSuccess) ipcCounters().p2pGroups.fetch_add(1, std::memory_order_relaxed);
  return r;
}

}  // namespace attn::ipc
