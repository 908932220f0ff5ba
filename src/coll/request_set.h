// A fixed array of requests with a helper to learn which completed, used by
// the pipelined algorithms (requests must not move while pending).
#pragma once

#include <memory>

#include "src/core/engine.h"
#include "src/core/error.h"

namespace attn {

class RequestSet {
 public:
  explicit RequestSet(size_t n) : n_(n), reqs_(new Request[n ? n : 1]), posted_(n, false) {}
  size_t size() const { return n_; }
  Request* at(size_t i) { return &reqs_[i]; }
  void markPosted(size_t i) { posted_[i] = true; }
  bool posted(size_t i) const { return posted_[i]; }
  // Posted and finished successfully. A failed request turns into an error.
  attnResult_t done(size_t i, bool* isDone) {
    *isDone = false;
    if (!posted_[i]) return attnSuccess;
    int s = reqs_[i].state.load(std::memory_order_acquire);
    if (s == Request::kFailed)
      return setError(reqs_[i].error == attnSuccess ? attnRemoteError : reqs_[i].error, "%s",
                      reqs_[i].message.c_str());
    *isDone = s == Request::kDone;
    return attnSuccess;
  }

 private:
  size_t n_;
  std::unique_ptr<Request[]> reqs_;
  std::vector<bool> posted_;
};

// Drives the engine until `finished()` is true, calling `step()` (which posts
// whatever became ready) on every pass. Shared by the pipelined algorithms.
template <typename Step, typename Finished>
attnResult_t driveUntil(Engine& e, Step step, Finished finished) {
  int spins = 0;
  auto last = std::chrono::steady_clock::now();
  for (;;) {
    bool advanced = false;
    attnResult_t r = step(&advanced);
    if (r != attnSuccess) {
      e.breakWith(r, threadLastError());
      return r;
    }
    if (finished()) return attnSuccess;
    bool progressed = false;
    ATTN_CHECK(e.progress(&progressed));
    if (progressed || advanced) {
      spins = 0;
      last = std::chrono::steady_clock::now();
    } else {
      ATTN_CHECK(e.idleWait(&spins, &last));
    }
  }
}

}  // namespace attn
