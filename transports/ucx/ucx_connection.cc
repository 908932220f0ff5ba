#include "transports/ucx/ucx_connection.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "src/core/error.h"
#include "src/core/log.h"

namespace attn::ucx {
namespace {

// How long a closing connection lets UCX finish or cancel the operations
// that still point into the caller's buffers before it quarantines the
// worker (ucx_context.h) and fails them.
constexpr auto kCancelDrain = std::chrono::milliseconds(1000);
constexpr auto kByeDrain = std::chrono::milliseconds(200);

void opDone(void* request, UcxConnection::Op* op, ucs_status_t st, size_t length) {
  op->finished = true;
  op->status = st;
  op->length = length;
  if (op->posting) return;  // the poster finishes it
  ucp_request_free(request);
  if (op->conn) op->conn->onComplete(op, st, length);
  else if (op->orphanOf) op->orphanOf->dropOrphan(op);  // deletes it
  else delete op;
}

void sendDone(void* request, ucs_status_t st, void* user) {
  auto* op = static_cast<UcxConnection::Op*>(user);
  opDone(request, op, st, op->bytes);
}

void recvDone(void* request, ucs_status_t st, const ucp_tag_recv_info_t* info, void* user) {
  opDone(request, static_cast<UcxConnection::Op*>(user), st, info ? info->length : 0);
}

void byeDone(void* request, ucs_status_t st, const ucp_tag_recv_info_t*, void* user) {
  auto* bye = static_cast<UcxConnection::Bye*>(user);
  bye->finished = true;
  bye->status = st;
  if (bye->posting) return;
  ucp_request_free(request);
  if (bye->conn) bye->conn->onBye(bye, st);
  else delete bye;
}

void epError(void* arg, ucp_ep_h, ucs_status_t st) {
  auto* guard = static_cast<UcxConnection::EpGuard*>(arg);
  if (guard->conn) guard->conn->onPeerError(st);
}

std::string truncatedWhy(const std::string& peerName, size_t capacity) {
  char why[160];
  snprintf(why, sizeof(why), ": message truncated (longer than the %zu bytes the receive posted)",
           capacity);
  return peerName + why;
}

}  // namespace

UcxConnection::UcxConnection(int peer, int myRank, UcxWorker* worker, UcxRegCache* cache)
    : Connection(peer), myRank_(myRank), worker_(worker), cache_(cache),
      peerName_("peer " + std::to_string(peer) + " (ucx)") {}

UcxConnection::~UcxConnection() { close(); }

attnResult_t UcxConnection::connectTo(const std::vector<uint8_t>& peerAddress, bool peerTakesDevice) {
  std::lock_guard<std::mutex> g(worker_->mutex());
  peerTakesDevice_ = peerTakesDevice;
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(peerAddress.data());
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &epError;
  guard_ = worker_->keepObject(new EpGuard{this});
  ep.err_handler.arg = guard_;
  ucs_status_t st = ucp_ep_create(worker_->worker(), &ep, &ep_);
  if (st == UCS_ERR_UNREACHABLE) {
    // Some transports (UCX_TLS=sm alone) cannot detect a failed peer, and
    // UCX then refuses the peer-failure mode. Every rank runs the same
    // selection, so all fall back alike; a vanished peer is then noticed
    // through its goodbye or the communicator's timeout.
    ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    st = ucp_ep_create(worker_->worker(), &ep, &ep_);
    if (st == UCS_OK)
      ATTN_INFO(kLogNet, "ucx: %s: these UCX transports cannot report peer failure; "
                         "relying on goodbyes and the timeout", peerName_.c_str());
  }
  if (st != UCS_OK)
    return setError(attnRemoteError, "ucx: cannot create an endpoint to %s: %s",
                    peerName_.c_str(), statusText(st));
  postByeRecv();
  return attnSuccess;
}

std::string UcxConnection::describe(const char* what, ucs_status_t st) const {
  return peerName_ + ": " + what + " failed: " + statusText(st);
}

// ---------------------------------------------------------------------------
// Goodbye

void UcxConnection::postByeRecv() {
  Bye* b = new Bye{this};
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  prm.cb.recv = &byeDone;
  prm.user_data = b;
  b->posting = true;
  ucs_status_ptr_t sp = ucp_tag_recv_nbx(worker_->worker(), &b->sent, sizeof(b->sent),
                                         tagOf(peer(), kByeSeq), ~ucp_tag_t(0), &prm);
  b->posting = false;
  if (!UCS_PTR_IS_PTR(sp)) {  // cannot listen: a vanished peer is seen by UCX or the timeout
    delete b;
    return;
  }
  if (b->finished) {  // the goodbye was already here
    ucp_request_free(sp);
    onBye(b, b->status);
    return;
  }
  b->ucxReq = sp;
  bye_ = b;
}

attnResult_t UcxConnection::startHello() {
  static uint8_t none;
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  ucs_status_ptr_t r = ucp_tag_recv_nbx(worker_->worker(), &none, 0, tagOf(peer(), kHelloSeq),
                                        ~ucp_tag_t(0), &prm);
  ucs_status_ptr_t s = ucp_tag_send_nbx(ep_, &none, 0, tagOf(myRank_, kHelloSeq), &prm);
  if (UCS_PTR_IS_ERR(r) || UCS_PTR_IS_ERR(s)) {
    if (UCS_PTR_IS_PTR(r)) ucp_request_cancel(worker_->worker(), r), helloReq_[1] = r;
    if (UCS_PTR_IS_PTR(s)) helloReq_[0] = s;
    return setError(attnRemoteError, "ucx: handshake with %s failed: %s", peerName_.c_str(),
                    statusText(UCS_PTR_STATUS(UCS_PTR_IS_ERR(r) ? r : s)));
  }
  helloReq_[0] = s;
  helloReq_[1] = r;
  return attnSuccess;
}

bool UcxConnection::helloDone(attnResult_t* failed) {
  bool done = true;
  for (void*& q : helloReq_) {
    if (!q) continue;
    ucs_status_t st = ucp_request_check_status(q);
    if (st == UCS_INPROGRESS) {
      done = false;
      continue;
    }
    ucp_request_free(q);
    q = nullptr;
    if (st != UCS_OK && *failed == attnSuccess)
      *failed = setError(attnRemoteError, "ucx: handshake with %s failed: %s", peerName_.c_str(),
                         statusText(st));
  }
  return done;
}

void UcxConnection::onBye(Bye* bye, ucs_status_t st) {
  if (bye == bye_) bye_ = nullptr;
  if (st == UCS_OK) {
    peerClosed_ = true;
    peerSent_ = bye->sent;
    ATTN_INFO(kLogNet, "ucx: %s closed after %lu message(s)", peerName_.c_str(),
              (unsigned long)peerSent_);
  }
  delete bye;
}

// Tells the peer we are going, and how many messages it gets from us. The
// count lives with the worker until UCX is done with it.
void UcxConnection::sendBye() {
  uint64_t* count = worker_->keep(sendSeq_);
  ucp_request_param_t prm{};
  ucs_status_ptr_t sp =
      ucp_tag_send_nbx(ep_, count, sizeof(*count), tagOf(myRank_, kByeSeq), &prm);
  if (!UCS_PTR_IS_PTR(sp)) return;
  // Usually gone at once (8 bytes, eager); give it a moment otherwise, as
  // a forced close would drop it (a quarantined worker moves nothing).
  const auto end = std::chrono::steady_clock::now() + kByeDrain;
  while (!worker_->quarantined() && ucp_request_check_status(sp) == UCS_INPROGRESS &&
         std::chrono::steady_clock::now() < end)
    worker_->progressLocked();
  worker_->adoptCloseRequest(sp);
}

bool UcxConnection::stranded() const {
  if (peerFailed_) return !inflight_.empty();
  if (!peerClosed_) return false;
  for (const Op* op : inflight_)
    if (!op->recv || op->seq >= peerSent_) return true;
  return false;
}

// ---------------------------------------------------------------------------
// Posting

attnResult_t UcxConnection::postFailure(Op* op, attnResult_t code, const std::string& why) {
  if (op) {
    if (op->reg) cache_->release(op->reg);
    delete op;
  }
  noteBreak(code, why);
  return setError(code, "%s", why.c_str());
}

attnResult_t UcxConnection::postSend(const void* buf, size_t bytes, Request* req) {
  return send(buf, bytes, req, /*device=*/false);
}

attnResult_t UcxConnection::postDeviceSend(const void* buf, size_t bytes, Request* req) {
  return send(buf, bytes, req, /*device=*/true);
}

attnResult_t UcxConnection::postRecv(void* buf, size_t capacity, Request* req) {
  return recv(buf, capacity, req, /*device=*/false);
}

attnResult_t UcxConnection::postDeviceRecv(void* buf, size_t capacity, Request* req) {
  return recv(buf, capacity, req, /*device=*/true);
}

// Device memory skips the registration cache: UCX registers it in its own
// cache, which also hears of cudaFree (ours hears only of munmap).
attnResult_t UcxConnection::send(const void* buf, size_t bytes, Request* req, bool device) {
  std::lock_guard<std::mutex> g(worker_->mutex());
  if (!broken_ && worker_->quarantined()) shutDownLocked(attnRemoteError, quarantinedWhy(), false);
  if (broken_) {
    req->fail(attnRemoteError, brokenWhy_);
    return setError(attnRemoteError, "%s", brokenWhy_.c_str());
  }
  const uint64_t seq = sendSeq_++;
  Op* op = new Op{this, req, device ? nullptr : cache_->acquire(buf, bytes), bytes, false, seq, nullptr};
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  prm.cb.send = &sendDone;
  prm.user_data = op;
  if (op->reg) {
    prm.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    prm.memh = op->reg->memh;
  }
  op->posting = true;
  ucs_status_ptr_t sp = ucp_tag_send_nbx(ep_, buf, bytes, tagOf(myRank_, seq), &prm);
  op->posting = false;
  if (sp == nullptr) {  // done at once: the buffer is free again
    if (op->reg) cache_->release(op->reg);
    delete op;
    req->complete(bytes);
    return attnSuccess;
  }
  if (UCS_PTR_IS_ERR(sp)) {
    std::string why = describe("send", UCS_PTR_STATUS(sp));
    req->fail(attnRemoteError, why);
    return postFailure(op, attnRemoteError, why);
  }
  if (op->finished) {
    ucp_request_free(sp);
    onComplete(op, op->status, op->length);
    return attnSuccess;
  }
  op->ucxReq = sp;
  inflight_.push_back(op);
  ATTN_TRACE(kLogNet, "ucx: send seq %lu (%zu bytes) to %s", (unsigned long)seq, bytes,
             peerName_.c_str());
  return attnSuccess;
}

attnResult_t UcxConnection::recv(void* buf, size_t capacity, Request* req, bool device) {
  std::lock_guard<std::mutex> g(worker_->mutex());
  if (!broken_ && worker_->quarantined()) shutDownLocked(attnRemoteError, quarantinedWhy(), false);
  if (broken_) {
    req->fail(attnRemoteError, brokenWhy_);
    return setError(attnRemoteError, "%s", brokenWhy_.c_str());
  }
  const uint64_t seq = recvSeq_++;
  Op* op = new Op{this, req, device ? nullptr : cache_->acquire(buf, capacity), capacity, true, seq, nullptr};
  // Always through the callback: UCX 1.13 leaves recv_info unset when a
  // receive completes inside the call, and the length matters.
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  prm.cb.recv = &recvDone;
  prm.user_data = op;
  if (op->reg) {
    prm.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    prm.memh = op->reg->memh;
  }
  op->posting = true;
  ucs_status_ptr_t sp = ucp_tag_recv_nbx(worker_->worker(), buf, capacity, tagOf(peer(), seq),
                                         ~ucp_tag_t(0), &prm);
  op->posting = false;
  if (UCS_PTR_IS_ERR(sp) || sp == nullptr) {
    const ucs_status_t st = UCS_PTR_STATUS(sp);
    if (st == UCS_ERR_MESSAGE_TRUNCATED) {
      const std::string why = truncatedWhy(peerName_, capacity);
      req->fail(attnInvalidUsage, why);
      return postFailure(op, attnInvalidUsage, why);
    }
    std::string why = describe("receive", st);
    req->fail(attnRemoteError, why);
    return postFailure(op, attnRemoteError, why);
  }
  if (op->finished) {  // the message was already here
    ucp_request_free(sp);
    onComplete(op, op->status, op->length);
    return attnSuccess;
  }
  op->ucxReq = sp;
  inflight_.push_back(op);
  return attnSuccess;
}

// ---------------------------------------------------------------------------
// Completion (callbacks run inside ucp_worker_progress, under the mutex)

void UcxConnection::onComplete(Op* op, ucs_status_t st, size_t length) {
  auto it = std::find(inflight_.begin(), inflight_.end(), op);
  if (it != inflight_.end()) {
    *it = inflight_.back();
    inflight_.pop_back();
  }
  if (op->reg) cache_->release(op->reg);
  ++completions_;
  Request* req = op->req;
  const bool recv = op->recv;
  const size_t bytes = op->bytes;
  delete op;
  if (!req) return;
  if (st == UCS_OK) {
    req->complete(recv ? length : bytes);
    return;
  }
  if (st == UCS_ERR_MESSAGE_TRUNCATED && !broken_) {
    const std::string why = truncatedWhy(peerName_, bytes);
    req->fail(attnInvalidUsage, why);
    noteBreak(attnInvalidUsage, why);
    return;
  }
  if (broken_) {
    req->fail(attnRemoteError, brokenWhy_);
    return;
  }
  std::string why = describe(recv ? "receive" : "send", st);
  req->fail(attnRemoteError, why);
  noteBreak(attnRemoteError, why);
}

void UcxConnection::onPeerError(ucs_status_t st) {
  ATTN_INFO(kLogNet, "ucx: endpoint to %s failed: %s", peerName_.c_str(), statusText(st));
  peerFailed_ = true;
  peerStatus_ = st;
}

void UcxConnection::noteBreak(attnResult_t code, const std::string& why) {
  if (pendingBreak_ || broken_) return;
  pendingBreak_ = true;
  pendingCode_ = code;
  pendingWhy_ = why;
}

// ---------------------------------------------------------------------------
// Progress

attnResult_t UcxConnection::progress(bool* progressed) {
  *progressed = false;
  std::lock_guard<std::mutex> g(worker_->mutex());
  if (broken_) return setError(brokenCode_, "%s", brokenWhy_.c_str());
  if (worker_->quarantined()) return breakLinkLocked(attnRemoteError, quarantinedWhy());
  const size_t before = completions_;
  const unsigned events = worker_->progressLocked();
  *progressed = events > 0 || completions_ != before;
  if (pendingBreak_) return breakLinkLocked(pendingCode_, pendingWhy_);
  // Data the peer sent before it went away has been matched above; what is
  // still queued now can never complete.
  if (stranded())
    return breakLinkLocked(attnRemoteError,
                           peerFailed_ ? peerName_ + ": peer unreachable (UCX: " +
                                             statusText(peerStatus_) + ")"
                                       : peerName_ + ": connection closed by peer");
  return attnSuccess;
}

// ---------------------------------------------------------------------------
// Failure and close

void UcxConnection::shutDownLocked(attnResult_t code, const std::string& why, bool graceful) {
  if (!broken_) {
    broken_ = true;
    brokenCode_ = code;
    brokenWhy_ = why;
  }
  pendingBreak_ = false;
  graceful = graceful && inflight_.empty() && !peerFailed_;
  // Make UCX let go of the caller's buffers before their requests fail:
  // receives are cancelled, sends end with the forced endpoint close.
  std::vector<Op*> recvs;
  for (Op* op : inflight_)
    if (op->recv) recvs.push_back(op);
  for (Op* op : recvs)  // a cancel may complete (and free) its op at once
    if (std::find(inflight_.begin(), inflight_.end(), op) != inflight_.end())
      ucp_request_cancel(worker_->worker(), op->ucxReq);
  if (bye_) {
    Bye* b = bye_;
    b->conn = nullptr;  // the cancel's callback frees it
    bye_ = nullptr;
    ucp_request_cancel(worker_->worker(), b->ucxReq);
  }
  for (void*& q : helloReq_)
    if (q) {
      ucp_request_cancel(worker_->worker(), q);
      worker_->adoptCloseRequest(q);  // freed with the worker
      q = nullptr;
    }
  if (ep_) {
    if (!peerFailed_) sendBye();
    // Graceful: first flush what was sent (eager data may still sit in
    // UCX's buffers). A flush needs no reply from the peer's software, so a
    // peer that is busy elsewhere costs nothing; UCX's own graceful close
    // would wait for it.
    guard_->conn = nullptr;  // UCX may still report on the endpoint: ignore
    if (graceful) {
      ucp_request_param_t prm{};
      ucs_status_ptr_t fl = ucp_ep_flush_nbx(ep_, &prm);
      worker_->closeAfterFlush(ep_, UCS_PTR_IS_PTR(fl) ? fl : nullptr);
    } else {
      ucp_request_param_t prm{};
      prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
      ucs_status_ptr_t sp = ucp_ep_close_nbx(ep_, &prm);
      if (UCS_PTR_IS_PTR(sp)) worker_->adoptCloseRequest(sp);
    }
    ep_ = nullptr;
  }
  const auto end = std::chrono::steady_clock::now() + kCancelDrain;
  while (!inflight_.empty() && !worker_->quarantined() && std::chrono::steady_clock::now() < end)
    if (worker_->progressLocked() == 0) std::this_thread::sleep_for(std::chrono::microseconds(20));
  if (!inflight_.empty()) {
    // UCX still holds them (a receive it began to fill cannot be cancelled,
    // and the rest of its message may still come): it must never run again
    // before their owners, told below that they failed, free the buffers.
    worker_->quarantine(peerName_ + ": " + std::to_string(inflight_.size()) +
                        " operation(s) still held by UCX at close");
    for (Op* op : inflight_) {
      if (op->req) op->req->fail(attnRemoteError, brokenWhy_);
      op->req = nullptr;
      op->conn = nullptr;
      op->orphanOf = worker_;
      worker_->adoptOrphan(op);
    }
  }
  inflight_.clear();
}

std::string UcxConnection::quarantinedWhy() const {
  return peerName_ + ": connection closed: this communicator's UCX worker was stopped (" +
         worker_->quarantineWhy() + ")";
}

attnResult_t UcxConnection::breakLinkLocked(attnResult_t code, const std::string& why) {
  shutDownLocked(code, why, false);
  return setError(code, "%s", why.c_str());
}

void UcxConnection::close() {
  std::lock_guard<std::mutex> g(worker_->mutex());
  shutDownLocked(attnRemoteError, peerName_ + ": connection closed locally", true);
}

}  // namespace attn::ucx
