#include "src/attn/progress_thread.h"

#include <sched.h>

#include <chrono>

#include "src/core/error.h"
#include "src/core/settings.h"

namespace attn {

namespace {
// A message this small leaves in the pass kick() makes right after it is
// posted (a shm ring slot; the smallest default TCP send buffer).
constexpr size_t kEagerMax = size_t(16) << 10;
constexpr size_t kCallerDrivenMax = size_t(64) << 10;
constexpr double kCallerDrivenMacs = double(1 << 19);
}  // namespace

DriveMode driveModeFor(size_t largestMessage, double kernelMacs) {
  int choice = 0;  // a value that is none of the choices reads as auto (the error is logged)
  if (settingEnum<Setting::kAttnProgress>(&choice) != attnSuccess) choice = 0;
  switch (choice) {
    case 1: return DriveMode::kThread;
    case 2: return DriveMode::kCaller;
    default:
      if (largestMessage <= kEagerMax) return DriveMode::kCaller;
      return largestMessage <= kCallerDrivenMax && kernelMacs <= kCallerDrivenMacs ? DriveMode::kCaller
                                                                                   : DriveMode::kThread;
  }
}

ProgressThread::ProgressThread(Engine& e, const std::string& errorContext, DriveMode mode)
    : e_(e), mode_(mode), context_(errorContext),
      thread_(mode == DriveMode::kThread ? std::thread([this] { loop(); }) : std::thread()) {}

ProgressThread::~ProgressThread() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

attnResult_t ProgressThread::kick() {
  if (mode_ == DriveMode::kCaller) {
    bool progressed = false;
    return e_.progress(&progressed);
  }
  {
    std::lock_guard<std::mutex> g(mu_);
    ++kicks_;
  }
  cv_.notify_all();
  return attnSuccess;
}

void ProgressThread::loop() {
  ErrorContext ctx(context_);
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> g(mu_);
      if (stop_) return;
      if (kicks_ == seen && !e_.busy()) {
        cv_.wait_for(g, std::chrono::milliseconds(2), [&] { return stop_ || kicks_ != seen; });
        if (stop_) return;
      }
      seen = kicks_;
    }
    bool progressed = false;
    attnResult_t r = e_.progressOrSleep(200, &progressed);
    if (r != attnSuccess) {
      {
        std::lock_guard<std::mutex> g(mu_);
        failure_ = threadLastError();
      }
      failed_.store(r);
      doneCv_.notify_all();
      return;
    }
    if (progressed && waiters_.load() > 0) {
      // Taking the lock orders our completions before the waiter's check.
      { std::lock_guard<std::mutex> g(mu_); }
      doneCv_.notify_all();
    }
  }
}

attnResult_t ProgressThread::wait(Request* req) {
  ATTN_CHECK(waitFor([req] { return !req->pending(); }));
  if (req->state.load() == Request::kFailed)
    return setError(req->error == attnSuccess ? attnRemoteError : req->error, "%s", req->message.c_str());
  return attnSuccess;
}

attnResult_t ProgressThread::poll() {
  if (mode_ != DriveMode::kCaller) return attnSuccess;
  bool progressed = false;
  return e_.progress(&progressed);
}

// Caller mode: this thread drives the engine until ready() holds (the
// engine's own waits: its timeout, abort and broken checks).
attnResult_t ProgressThread::driveUntil(const std::function<bool()>& ready) {
  int spins = 0;
  auto lastProgress = std::chrono::steady_clock::now();
  while (!ready()) {
    if (e_.aborted()) {
      e_.breakWith(attnRemoteError, "communicator aborted");
      return setError(attnRemoteError, "communicator aborted");
    }
    if (e_.broken()) return setError(e_.brokenResult(), "communicator broke during the attention collective");
    bool progressed = false;
    ATTN_CHECK(e_.progress(&progressed));
    if (progressed) {
      spins = 0;
      lastProgress = std::chrono::steady_clock::now();
    } else {
      ATTN_CHECK(e_.idleWait(&spins, &lastProgress));
    }
  }
  return attnSuccess;
}

attnResult_t ProgressThread::waitFor(const std::function<bool()>& ready) {
  if (mode_ == DriveMode::kCaller) return driveUntil(ready);
  int spins = 0;
  const auto start = std::chrono::steady_clock::now();
  while (!ready()) {
    if (e_.aborted()) {
      e_.breakWith(attnRemoteError, "communicator aborted");
      return setError(attnRemoteError, "communicator aborted");
    }
    if (e_.timeoutMs() > 0 && (spins & 255) == 0 &&
        std::chrono::steady_clock::now() - start > std::chrono::milliseconds(e_.timeoutMs())) {
      attnResult_t r = setError(attnTimeout, "attention collective: no completion for %d ms", e_.timeoutMs());
      e_.breakWith(r, threadLastError());
      return r;
    }
    attnResult_t f = failed_.load();
    if (f != attnSuccess) {
      std::lock_guard<std::mutex> g(mu_);
      return setError(f, "%s", failure_.c_str());
    }
    if (e_.broken()) return setError(e_.brokenResult(), "communicator broke during the attention collective");
    if (++spins < 16) {
      sched_yield();
      continue;
    }
    // Sleep until the driver reports progress; the bound keeps abort,
    // timeout and a broken engine (set by other threads) noticed.
    std::unique_lock<std::mutex> g(mu_);
    ++waiters_;
    doneCv_.wait_for(g, std::chrono::milliseconds(1), [&] { return ready() || failed_.load() != attnSuccess; });
    --waiters_;
  }
  return attnSuccess;
}

}  // namespace attn
