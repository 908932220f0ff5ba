#include <algorithm>
#include "src/core/engine.h"

#include <sched.h>

#include <thread>

#include "src/core/error.h"
#include "src/core/log.h"

namespace attn {

namespace {
constexpr int kSpinsBeforeSleep = 200;
constexpr int kSleepSliceUs = 1000;
constexpr int kPollsPerYield = 1;

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

Engine::Engine(int rank, int nranks, int timeoutMs, const std::atomic<bool>* abortFlag)
    : rank_(rank), nranks_(nranks), timeoutMs_(timeoutMs), abortFlag_(abortFlag) {}

Engine::~Engine() { closeAll(); }

void Engine::attach(std::vector<std::unique_ptr<Transport>> transports,
                    std::vector<std::unique_ptr<Connection>> conns,
                    std::vector<int> transportOfPeer) {
  std::lock_guard<std::mutex> g(mu_);
  transports_ = std::move(transports);
  conns_ = std::move(conns);
  transportOfPeer_ = std::move(transportOfPeer);
}

const char* Engine::transportName(int peer) const {
  if (peer < 0 || peer >= (int)transportOfPeer_.size() || transportOfPeer_[peer] < 0) return "self";
  return transports_[transportOfPeer_[peer]]->name();
}

// Connections live as long as the engine and the answer is fixed at
// connection time, so no lock.
size_t Engine::mappedSendMin(int peer) const {
  if (peer < 0 || peer >= nranks_ || !conns_[peer]) return 0;
  return conns_[peer]->mappedSendMin();
}

attnResult_t Engine::isend(int peer, const void* buf, size_t bytes, Request* req) {
  if (broken()) return setError(brokenCode_, "%s", brokenWhy_.c_str());
  std::lock_guard<std::mutex> g(mu_);
  if (peer < 0 || peer >= nranks_ || !conns_[peer])
    return setError(attnInternalError, "send to invalid peer %d", peer);
  ATTN_TRACE(kLogP2p, "isend peer %d bytes %zu via %s", peer, bytes, transportName(peer));
  return conns_[peer]->postSend(buf, bytes, req);
}

attnResult_t Engine::irecv(int peer, void* buf, size_t capacity, Request* req) {
  if (broken()) return setError(brokenCode_, "%s", brokenWhy_.c_str());
  std::lock_guard<std::mutex> g(mu_);
  if (peer < 0 || peer >= nranks_ || !conns_[peer])
    return setError(attnInternalError, "receive from invalid peer %d", peer);
  ATTN_TRACE(kLogP2p, "irecv peer %d capacity %zu via %s", peer, capacity, transportName(peer));
  return conns_[peer]->postRecv(buf, capacity, req);
}

bool Engine::takesDeviceMemory(int peer) const {
  return peer >= 0 && peer < nranks_ && conns_[peer] && conns_[peer]->takesDeviceMemory();
}

attnResult_t Engine::isendDevice(int peer, const void* buf, size_t bytes, Request* req) {
  if (broken()) return setError(brokenCode_, "%s", brokenWhy_.c_str());
  std::lock_guard<std::mutex> g(mu_);
  if (!takesDeviceMemory(peer))
    return setError(attnInternalError, "device-memory send to peer %d, whose transport takes only host memory", peer);
  ATTN_TRACE(kLogP2p, "isend (device memory) peer %d bytes %zu via %s", peer, bytes, transportName(peer));
  return conns_[peer]->postDeviceSend(buf, bytes, req);
}

attnResult_t Engine::irecvDevice(int peer, void* buf, size_t capacity, Request* req) {
  if (broken()) return setError(brokenCode_, "%s", brokenWhy_.c_str());
  std::lock_guard<std::mutex> g(mu_);
  if (!takesDeviceMemory(peer))
    return setError(attnInternalError, "device-memory receive from peer %d, whose transport takes only host memory",
                    peer);
  ATTN_TRACE(kLogP2p, "irecv (device memory) peer %d capacity %zu via %s", peer, capacity, transportName(peer));
  return conns_[peer]->postDeviceRecv(buf, capacity, req);
}

attnResult_t Engine::progress(bool* progressed) {
  *progressed = false;
  if (broken()) return setError(brokenCode_, "%s", brokenWhy_.c_str());
  std::unique_lock<std::mutex> g(mu_);
  for (auto& c : conns_) {
    if (!c || c->idle()) continue;
    bool p = false;
    attnResult_t r = c->progress(&p);
    *progressed |= p;
    if (r != attnSuccess) {
      std::string why = threadLastError();
      if (why.empty()) why = "connection to peer " + std::to_string(c->peer()) + " failed";
      g.unlock();
      breakWith(r, why);
      return r;
    }
  }
  return attnSuccess;
}

void Engine::breakWith(attnResult_t code, const std::string& why) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (broken_.load()) return;
    brokenCode_ = code;
    brokenWhy_ = why;
    broken_.store(true, std::memory_order_release);
  }
  ATTN_WARN(kLogProxy, "communicator broken: %s; closing all connections", why.c_str());
  closeAll();
}

void Engine::closeAll() {
  std::lock_guard<std::mutex> g(mu_);
  for (auto& c : conns_)
    if (c) c->close();
}

attnResult_t Engine::checkRequest(Request* req) {
  int s = req->state.load(std::memory_order_acquire);
  if (s == Request::kFailed) {
    attnResult_t code = req->error == attnSuccess ? attnRemoteError : req->error;
    setError(code, "%s", req->message.c_str());
    if (!broken()) breakWith(code, threadLastError());
    return code;
  }
  return attnSuccess;
}

attnResult_t Engine::timeoutError() {
  std::string pending;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (auto& c : conns_)
      if (c && !c->idle()) pending += (pending.empty() ? "" : ", ") + std::to_string(c->peer());
  }
  attnResult_t r = setError(attnTimeout, "no progress for %d ms; waiting on peer(s) %s",
                            timeoutMs_, pending.empty() ? "?" : pending.c_str());
  breakWith(attnTimeout, threadLastError());
  return r;
}

attnResult_t Engine::idleWait(int* spins, std::chrono::steady_clock::time_point* lastProgress) {
  if (aborted()) {
    attnResult_t r = setError(attnRemoteError, stopped_.load() ? "operations stopped by attnCommShrink"
                                                               : "communicator aborted");
    breakWith(attnRemoteError, threadLastError());
    return r;
  }
  if (++*spins < kSpinsBeforeSleep) {
    cpuRelax();
    // Ranks often outnumber cores (several per GPU, or a test box): the
    // peer we wait for may be queued behind us on this core. Yielding every
    // 8 idle polls instead of every 32 cut a 4-process 8-byte all-reduce on
    // 2 cores by a third; yielding on every one took 4 thread ranks on 2
    // cores 1.26-1.37x further and left 2 ranks unchanged, where the yield
    // finds nobody to run (perf/RESULTS.md §1, Small messages).
    if ((*spins % kPollsPerYield) == 0) sched_yield();
    return attnSuccess;
  }
  auto now = std::chrono::steady_clock::now();
  if (timeoutMs_ > 0 && now - *lastProgress > std::chrono::milliseconds(timeoutMs_))
    return timeoutError();
  // Sleep in the transport that has work, so a peer's doorbell wakes us.
  std::vector<Transport*> busy = busyTransports();
  if (busy.empty()) {
    std::this_thread::yield();
    return attnSuccess;
  }
  bool progressed = false;
  ATTN_CHECK(armedWait(busy, busy.size() == 1 ? kSleepSliceUs : 100, &progressed));
  if (progressed) {
    *spins = 0;
    *lastProgress = now;
  }
  return attnSuccess;
}

attnResult_t Engine::armedWait(const std::vector<Transport*>& busy, int sliceUs, bool* progressed) {
  // Ask to be woken, then look once more: what landed before the peers saw
  // the request rang nobody (Transport::armWait).
  for (Transport* t : busy) t->armWait();
  attnResult_t r = progress(progressed);
  if (r == attnSuccess && !*progressed)
    for (Transport* t : busy) t->waitForActivity(sliceUs);
  for (Transport* t : busy) t->disarmWait();
  return r;
}

std::vector<Transport*> Engine::busyTransports() {
  std::vector<Transport*> busy;
  std::lock_guard<std::mutex> g(mu_);
  for (size_t p = 0; p < conns_.size(); ++p)
    if (conns_[p] && !conns_[p]->idle()) {
      Transport* t = transports_[transportOfPeer_[p]].get();
      if (std::find(busy.begin(), busy.end(), t) == busy.end()) busy.push_back(t);
    }
  return busy;
}

char* Engine::scratch(size_t bytes) {
  if (bytes > scratchBytes_) {
    scratch_.reset(new char[bytes]);
    scratchBytes_ = bytes;
  }
  return scratch_.get();
}

bool Engine::busy() {
  std::lock_guard<std::mutex> g(mu_);
  for (auto& c : conns_)
    if (c && !c->idle()) return true;
  return false;
}

attnResult_t Engine::progressOrSleep(int waitUs, bool* progressed) {
  ATTN_CHECK(progress(progressed));
  if (*progressed) return attnSuccess;
  // Sleep without the lock: a thread posting work must not queue behind a
  // sleeper (std::mutex is not fair; a driver that sleeps holding it and
  // re-locks at once can starve the poster for tens of milliseconds).
  std::vector<Transport*> busy = busyTransports();
  const int slice = busy.size() <= 1 ? waitUs : std::max(1, waitUs / static_cast<int>(busy.size()));
  return armedWait(busy, slice, progressed);
}

attnResult_t Engine::wait(Request* req) { return waitAll(req, 1); }

attnResult_t Engine::waitAll(Request* reqs, size_t n) {
  int spins = 0;
  auto lastProgress = std::chrono::steady_clock::now();
  size_t first = 0;
  for (;;) {
    while (first < n && !reqs[first].pending()) {
      ATTN_CHECK(checkRequest(&reqs[first]));
      ++first;
    }
    if (first == n) return attnSuccess;
    ATTN_CHECK(driveOnce(&spins, &lastProgress));
  }
}

attnResult_t Engine::driveOnce(int* spins, std::chrono::steady_clock::time_point* lastProgress) {
  bool progressed = false;
  ATTN_CHECK(progress(&progressed));
  if (!progressed) return idleWait(spins, lastProgress);
  *spins = 0;
  *lastProgress = std::chrono::steady_clock::now();
  return attnSuccess;
}

attnResult_t Engine::waitAny(Request* const* reqs, size_t n, size_t* done) {
  if (n == 0) return setError(attnInternalError, "waitAny on no requests");
  int spins = 0;
  auto lastProgress = std::chrono::steady_clock::now();
  for (;;) {
    for (size_t i = 0; i < n; ++i)
      if (!reqs[i]->pending()) {
        *done = i;
        return checkRequest(reqs[i]);
      }
    ATTN_CHECK(driveOnce(&spins, &lastProgress));
  }
}

}  // namespace attn
