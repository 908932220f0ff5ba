// An attention algorithm that fails half-way leaves its peers in the middle
// of the same collective, waiting for messages that will never come, and
// may leave the engine holding requests and buffers of its own frame. Made
// at the top of the algorithm, after the requests it posts, this guard
// breaks the engine on any way out but done(): every transport fails and
// drops its posted operations at once (Engine::breakWith closes them), and
// the peers see the links close and fail now instead of waiting out
// ATTN_TIMEOUT_MS. As with NCCL after an error, the communicator is then
// only good for attnCommAbort / attnCommDestroy. One rank alone has nobody
// waiting and nothing posted, so its communicator stays usable.
#pragma once

#include <string>

#include "src/core/engine.h"
#include "src/core/error.h"

namespace attn {

class BreakOnEarlyExit {
 public:
  explicit BreakOnEarlyExit(Engine& e) : e_(e) {}
  ~BreakOnEarlyExit() {
    if (done_ || e_.nranks() == 1) return;
    const std::string& why = threadLastError();
    e_.breakWith(attnRemoteError, why.empty() ? "an attention call failed half-way" : why);
  }
  BreakOnEarlyExit(const BreakOnEarlyExit&) = delete;
  BreakOnEarlyExit& operator=(const BreakOnEarlyExit&) = delete;

  // Every posted operation has completed.
  void done() { done_ = true; }

 private:
  Engine& e_;
  bool done_ = false;
};

}  // namespace attn
