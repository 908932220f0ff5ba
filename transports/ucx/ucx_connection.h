// One peer of the UCX transport: a ucp endpoint to the peer's worker and
// tagged sends/receives on this rank's worker.
//
// Tags: (sender rank << 40) | per-direction sequence number, matched with a
// full mask, so the k-th receive posted for a peer takes exactly the peer's
// k-th send to us — FIFO per connection no matter how UCX schedules lanes
// and protocols, and a message longer than its receive is reported by UCX
// as truncated (attnInvalidUsage).
//
// Failures: the endpoint runs in UCP_ERR_HANDLING_MODE_PEER; its error
// handler marks the peer gone (a killed process). A closing connection also
// says goodbye: a message on a reserved tag carrying how many messages it
// sent, so the peer fails at once exactly the receives that can never be
// matched and its sends, instead of waiting for a timeout. Either way the
// next progress() with such work queued fails it with attnRemoteError
// naming the peer.
#pragma once

#include <ucp/api/ucp.h>

#include <string>
#include <vector>

#include "src/core/transport.h"
#include "transports/ucx/ucx_context.h"
#include "transports/ucx/ucx_memreg.h"

namespace attn::ucx {

class UcxConnection : public Connection {
 public:
  UcxConnection(int peer, int myRank, UcxWorker* worker, UcxRegCache* cache);
  ~UcxConnection() override;

  // Creates the endpoint to the peer's worker address. `peerTakesDevice`:
  // the peer's UCX moves CUDA memory too (exchanged with the address).
  attnResult_t connectTo(const std::vector<uint8_t>& peerAddress, bool peerTakesDevice);
  // Connect-time handshake: an empty message each way, so the endpoint is
  // wired up (and the peer known reachable) before any real traffic or a
  // goodbye needs it. Caller holds the worker mutex; the transport drives
  // the worker until helloDone().
  attnResult_t startHello();
  bool helloDone(attnResult_t* failed);

  attnResult_t postSend(const void* buf, size_t bytes, Request* req) override;
  attnResult_t postRecv(void* buf, size_t capacity, Request* req) override;
  // UCX built with CUDA (UcxWorker::deviceMemory) on both sides: it
  // detects device buffers itself and moves them (cuda_copy, cuda_ipc,
  // GPUDirect RDMA). Both sides, so that the two ends of a pair agree on
  // whether its device messages are staged (and then maybe sliced).
  bool takesDeviceMemory() const override { return worker_->deviceMemory() && peerTakesDevice_; }
  attnResult_t postDeviceSend(const void* buf, size_t bytes, Request* req) override;
  attnResult_t postDeviceRecv(void* buf, size_t capacity, Request* req) override;
  attnResult_t progress(bool* progressed) override;
  bool idle() const override { return inflight_.empty(); }
  void close() override;

  // An operation UCX holds. Freed when UCX completes it; if the connection
  // goes first, it is orphaned (conn = nullptr), the quarantined worker
  // keeps it (orphanOf) and UCX's callback, if ever, drops it there.
  struct Op {
    UcxConnection* conn;
    Request* req;
    UcxRegCache::Entry* reg;
    size_t bytes;  // send: length; receive: capacity
    bool recv;
    uint64_t seq;  // position in its direction
    void* ucxReq = nullptr;  // UCX's request handle (for cancel)
    // UCX may run the callback inside the posting call, before it returned
    // the request: the callback then only records, the poster finishes.
    bool posting = false;
    bool finished = false;
    ucs_status_t status = UCS_OK;
    size_t length = 0;
    UcxWorker* orphanOf = nullptr;
  };
  // The always-posted receive of the peer's goodbye.
  struct Bye {
    UcxConnection* conn;
    uint64_t sent = 0;  // the peer's message count
    void* ucxReq = nullptr;
    bool posting = false;
    bool finished = false;
    ucs_status_t status = UCS_OK;
  };
  void onComplete(Op* op, ucs_status_t st, size_t length);
  void onPeerError(ucs_status_t st);
  // The endpoint's error-handler argument; outlives the connection.
  struct EpGuard {
    UcxConnection* conn;
  };
  void onBye(Bye* bye, ucs_status_t st);

 private:
  static constexpr int kSeqBits = 40;
  static constexpr uint64_t kByeSeq = (uint64_t(1) << kSeqBits) - 1;  // never a message
  static constexpr uint64_t kHelloSeq = kByeSeq - 1;
  ucp_tag_t tagOf(int sender, uint64_t seq) const {
    return (ucp_tag_t(uint32_t(sender)) << kSeqBits) | (seq & ((ucp_tag_t(1) << kSeqBits) - 1));
  }
  attnResult_t send(const void* buf, size_t bytes, Request* req, bool device);
  attnResult_t recv(void* buf, size_t capacity, Request* req, bool device);
  // What a failed status means for a request on this link.
  std::string describe(const char* what, ucs_status_t st) const;
  // Records a failure seen in a callback; progress() breaks the link.
  void noteBreak(attnResult_t code, const std::string& why);
  // Fails every queued request, makes UCX let go of the buffers, closes the
  // endpoint; what UCX will not let go of quarantines the worker
  // (ucx_context.h), so it is never touched again. Caller holds the worker
  // mutex. graceful: a healthy idle link is flushed before the peer sees
  // the end.
  void shutDownLocked(attnResult_t code, const std::string& why, bool graceful);
  attnResult_t breakLinkLocked(attnResult_t code, const std::string& why);
  // Why this link fails once another one quarantined the worker.
  std::string quarantinedWhy() const;
  attnResult_t postFailure(Op* op, attnResult_t code, const std::string& why);
  void postByeRecv();
  void sendBye();
  // Queued work that the peer's goodbye or failure makes impossible.
  bool stranded() const;

  int myRank_;
  UcxWorker* worker_;
  UcxRegCache* cache_;
  std::string peerName_;  // "peer 3 (ucx)"
  ucp_ep_h ep_ = nullptr;
  EpGuard* guard_ = nullptr;
  uint64_t sendSeq_ = 0, recvSeq_ = 0;
  std::vector<Op*> inflight_;
  size_t completions_ = 0;
  void* helloReq_[2] = {nullptr, nullptr};  // send, receive
  Bye* bye_ = nullptr;       // posted goodbye receive (owned by UCX while posted)
  bool peerTakesDevice_ = false;
  bool peerClosed_ = false;  // goodbye received
  uint64_t peerSent_ = 0;    // ... after this many messages
  bool peerFailed_ = false;
  ucs_status_t peerStatus_ = UCS_OK;
  bool pendingBreak_ = false;
  attnResult_t pendingCode_ = attnSuccess;
  std::string pendingWhy_;
  bool broken_ = false;
  attnResult_t brokenCode_ = attnSuccess;
  std::string brokenWhy_;
};

}  // namespace attn::ucx
