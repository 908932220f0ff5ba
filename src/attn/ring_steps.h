// The ring-step skeleton of ring pass-KV and pass-Q, on the host and on the
// GPU alike (CP paper Alg. 2 and 3): n steps; at each but the last, the
// block held goes to the next rank while the next one comes from the
// previous rank; meanwhile the step's work runs on the block held; then the
// move is awaited and the block received becomes the one held. A RingMover
// says how a block moves: HostRingMover through two host buffers over the
// engine, DeviceRing (src/attn/device/device_ring.h) on the GPU.
#pragma once

#include <memory>

#include "src/attn/attn_call.h"
#include "src/attn/break_on_early_exit.h"
#include "src/attn/progress_thread.h"
#include "src/core/engine.h"
#include "src/core/log.h"

namespace attn {

class RingMover {
 public:
  virtual ~RingMover() = default;
  // Step s: posts the send of the block held to the next rank and the
  // receive of the next block from the previous rank. Under a window
  // (RingSteps::skipHidden, host rings only) either may be null: that move
  // does not happen.
  virtual attnResult_t post(int step, Request* send, Request* recv) = 0;
  // Waits for both, adding the time blocked on peers to *waitUs, and makes
  // the block received the one held (none when recv is null).
  virtual attnResult_t advance(ProgressThread& driver, Request* send, Request* recv, double* waitUs) = 0;
};

// The rotating block in two host buffers (AttnState::rotation), sent and
// received whole by the engine.
class HostRingMover final : public RingMover {
 public:
  // buf[0] holds this rank's own block of `ownBytes`; both hold `capacity`.
  HostRingMover(Engine& e, ShareableBuffer* buf, size_t capacity, size_t ownBytes, int next, int prev)
      : e_(e), buf_(buf), capacity_(capacity), bytes_(ownBytes), next_(next), prev_(prev) {}
  const char* block() const { return buf_[cur_].data(); }
  size_t bytes() const { return bytes_; }
  uint64_t sentBytes() const { return sent_; }  // over every post

  attnResult_t post(int step, Request* send, Request* recv) override;
  attnResult_t advance(ProgressThread& driver, Request* send, Request* recv, double* waitUs) override;

 private:
  Engine& e_;
  ShareableBuffer* buf_;
  size_t capacity_, bytes_;
  int next_, prev_;
  int cur_ = 0;
  uint64_t sent_ = 0;
};

// One ring's steps, their requests, the progress thread that drives them
// and the guard that breaks the engine on an early exit
// (break_on_early_exit.h). Make it after declaring every other request the
// algorithm posts and before posting anything: on the way out it breaks
// the engine before those requests go.
class RingSteps {
 public:
  // largestMessage: the largest message the call moves, which decides
  // whether a progress thread drives it (driveModeFor).
  RingSteps(AttnCall& c, size_t largestMessage);
  RingSteps(const RingSteps&) = delete;
  RingSteps& operator=(const RingSteps&) = delete;

  // Null with one rank (nothing moves).
  ProgressThread* driver() { return driver_.get(); }

  // Under a sliding window (AttnCall::vis active), a block travels only as
  // far as the last rank that may see it (RankVisibility::ringMoves), and
  // the ring turns the way its blocks move least (ringDirection); `queries`:
  // the blocks are queries (pass-Q), else keys (pass-KV). Then a step may
  // hold no block: check holds(s). Call it before using next() / prev().
  void skipHidden(bool queries) {
    skip_ = c_.vis.active();
    queries_ = queries;
    dir_ = skip_ ? c_.vis.ringDirection(queries) : 1;
    prev_ = rankAt(-1);
  }
  // The ranks blocks go to and come from, and the rank `hops` along the
  // ring from this one (its block arrives here after `-hops` steps).
  int next() const { return rankAt(1); }
  int prev() const { return prev_; }
  int rankAt(int hops) const { return ((me_ + dir_ * hops) % n_ + n_) % n_; }
  // The rank whose block this rank holds at step s.
  int origin(int s) const { return rankAt(-s); }
  // Whether this rank holds a block at step s.
  bool holds(int s) const { return s == 0 || !skip_ || c_.vis.ringMoves(prev_, s - 1, queries_, dir_); }

  // Runs the n steps over `mover`: step(s) works on the block held at
  // step s, right after the next move was posted; afterMove(s), if given,
  // runs once that move has completed.
  template <class Step, class AfterMove>
  attnResult_t run(RingMover& mover, const char* name, Step&& step, AfterMove&& afterMove);
  template <class Step>
  attnResult_t run(RingMover& mover, const char* name, Step&& step) {
    return run(mover, name, std::forward<Step>(step), [](int) { return attnSuccess; });
  }

  // Every request the algorithm posted has completed.
  void done() { guard_.done(); }

 private:
  AttnCall& c_;
  int n_, me_, prev_;
  int dir_ = 1;  // blocks go to me + dir_
  bool skip_ = false, queries_ = false;
  std::unique_ptr<Request[]> req_;  // step s's send and receive: 2s, 2s + 1
  BreakOnEarlyExit guard_;
  std::unique_ptr<ProgressThread> driver_;
};

template <class Step, class AfterMove>
attnResult_t RingSteps::run(RingMover& mover, const char* name, Step&& step, AfterMove&& afterMove) {
  for (int s = 0; s < n_; ++s) {
    const bool moving = s < n_ - 1;
    const bool sends = moving && (!skip_ || c_.vis.ringMoves(me_, s, queries_, dir_));
    const bool recvs = moving && (!skip_ || c_.vis.ringMoves(prev_, s, queries_, dir_));
    const auto stepStart = Clock::now();
    const double computeBefore = c_.stats.computeUs;
    Request* sendReq = sends ? &req_[2 * s] : nullptr;
    Request* recvReq = recvs ? &req_[2 * s + 1] : nullptr;
    if (sends || recvs) {
      ATTN_CHECK(mover.post(s, sendReq, recvReq));
      ATTN_CHECK(driver_->kick());
    }
    ATTN_CHECK(step(s));
    if (sends || recvs) ATTN_CHECK(mover.advance(*driver_, sendReq, recvReq, &c_.stats.waitUs));
    ATTN_CHECK(afterMove(s));
    ATTN_TRACE(kLogAttn, "%s step %d: compute %.0f us, step %.0f us", name, s,
               c_.stats.computeUs - computeBefore, usSince(stepStart));
  }
  return attnSuccess;
}

}  // namespace attn
