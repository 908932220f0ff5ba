// C API: version, errors, communicator life cycle.
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <thread>
#include <vector>

#include "src/core/api_call.h"
#include "src/core/bootstrap.h"
#include "src/core/log.h"
#include "src/device/device_route.h"

using namespace attn;

namespace attn {

attnResult_t checkCommUsable(attnComm* comm) {
  ATTN_REQUIRE(comm != nullptr, "communicator is NULL");  // the handle itself: ApiCall
  if (!comm->ready.load(std::memory_order_acquire)) {
    if (comm->asyncError.load() != attnSuccess)
      return setError(attnInvalidUsage, "communicator failed to initialise: %s",
                      comm->lastError.c_str());
    return setError(attnInvalidUsage, "communicator is still initialising (poll attnCommGetAsyncError)");
  }
  if (comm->abortFlag.load()) return setError(attnInvalidUsage, "communicator was aborted");
  if (comm->engine->broken())
    return setError(comm->engine->brokenResult(),
                    "communicator is broken by an earlier failure; abort it (see attnGetLastError)");
  return attnSuccess;
}

attnResult_t waitForQueuedOperations(attnComm* comm) {
  ATTN_CHECK(checkCommUsable(comm));
  if (!comm->config.blocking) comm->executor->drain();
  deviceWaitIdle(comm);
  return checkCommUsable(comm);
}

bool runsNow(attnComm* comm) {
  return !inGroup() && comm->config.blocking;
}

attnResult_t dispatchQueued(attnComm* comm, CommOp raw) {
  CommOp op = [raw = std::move(raw)] { return runGuarded(raw); };
  if (inGroup()) {
    groupAddColl(comm, std::move(op));
    return attnSuccess;
  }
  comm->executor->submit([comm, op = std::move(op)] {
    ApiCall call(comm, ApiCall::Admitted{});
    return call.finish(op());
  });
  return attnInProgress;
}

void traceDispatch(const char* name) { ATTN_TRACE(kLogColl, "%s", name); }

}  // namespace attn

namespace {

thread_local std::string tlsErrorCopy;

// Frees a communicator that never reached its caller (or is being
// destroyed): out of the handle table first, so nothing new gets in.
void freeComm(attnComm* c) {
  deviceFree(c);  // runs the operations still queued on streams first
  commFree(c);
  forgetHandle(c);
  c->magic = 0;
  delete c;
}

// Device, then (now or on the executor) the peers.
attnResult_t startComm(attnComm* c, const attnUniqueId& id, int nranks, int rank) {
  // The device first: a bad device fails here, before any peer is met.
  ATTN_CHECK(deviceInit(c));
  if (!c->config.blocking) {
    c->executor->submit([c, id, nranks, rank] {
      attnResult_t r = commInit(c, id, nranks, rank);
      if (r != attnSuccess) c->recordError(threadLastError());
      return r;
    });
    return attnInProgress;
  }
  return commInit(c, id, nranks, rank);
}

attnResult_t newComm(attnComm** out, int nranks, const attnUniqueId& id, int rank,
                     const attnConfig_t* config, const CommConfig* inherit) {
  ErrorContext ctx("rank " + std::to_string(rank));
  clearThreadLastError();
  ATTN_REQUIRE(out != nullptr, "comm output pointer is NULL");
  *out = nullptr;
  ATTN_REQUIRE(nranks >= 1 && nranks <= ATTN_MAX_NRANKS, "nranks %d is outside [1, ATTN_MAX_NRANKS = %d]", nranks,
               ATTN_MAX_NRANKS);
  ATTN_REQUIRE(rank >= 0 && rank < nranks, "rank %d is outside [0, %d)", rank, nranks);
  UniqueIdData decoded;
  ATTN_CHECK(decodeUniqueId(id, &decoded));
  auto comm = std::make_unique<attnComm>();
  ATTN_CHECK(resolveConfig(config, inherit, &comm->config));
  attnComm* c = comm.get();
  c->prefix = rankPrefix(rank);
  c->rank = rank;
  c->nranks = nranks;
  c->executor = std::make_unique<Executor>([c](attnResult_t r) {
    if (r != attnSuccess) {
      attnResult_t expected = attnSuccess;
      c->asyncError.compare_exchange_strong(expected, r);
    }
  });
  if (!registerHandle(c, HandleKind::kComm, &c->activeCalls))
    return setError(attnSystemError, "out of memory for the communicator's handle");
  comm.release();
  attnResult_t r;
  try {
    r = startComm(c, id, nranks, rank);
  } catch (...) {
    freeComm(c);
    throw;
  }
  if (r != attnSuccess && r != attnInProgress) {
    tlsErrorCopy = threadLastError();
    freeComm(c);
    return restoreError(r, tlsErrorCopy);
  }
  *out = c;
  return r;
}

// Holds a communicator handle for a call that only reads it (no operation):
// status() is attnSuccess when it is a live communicator.
struct CommReader {
  explicit CommReader(attnComm* comm) : call(comm) {}
  attnResult_t status() const { return call.checkHandle(); }
  ApiCall call;
};

// Starts `ndev` threads that each create one rank, all of them only once
// every thread exists: a thread that cannot be started leaves no rank
// waiting for it.
attnResult_t initAll(attnComm_t* comms, int ndev, const int* devlist) {
  ErrorContext ctx("-");
  clearThreadLastError();
  ATTN_REQUIRE(comms != nullptr, "comms is NULL");
  ATTN_REQUIRE(ndev >= 1 && ndev <= ATTN_MAX_NRANKS, "ndev %d is outside [1, ATTN_MAX_NRANKS = %d]", ndev,
               ATTN_MAX_NRANKS);
  if (devlist != nullptr)
    for (int i = 0; i < ndev; ++i) {
      ATTN_REQUIRE(devlist[i] >= ATTN_DEVICE_HOST, "devlist[%d]=%d is invalid", i, devlist[i]);
      if (devlist[i] != ATTN_DEVICE_HOST && !ATTN_HAVE_CUDA)
        return setError(attnNotSupported,
                        "devlist[%d]=%d: device ranks need the CUDA path, which this build "
                        "does not provide; pass NULL for host ranks", i, devlist[i]);
    }
  for (int i = 0; i < ndev; ++i) comms[i] = nullptr;
  attnUniqueId id;
  ATTN_CHECK(bootstrapCreateRoot(&id));
  std::vector<attnResult_t> results(ndev, attnSuccess);
  std::vector<std::string> errors(ndev);
  std::mutex mu;
  std::condition_variable cv;
  int gate = 0;  // 0: wait, 1: go, -1: give up
  auto rankThread = [&](int i) {
    {
      std::unique_lock<std::mutex> g(mu);
      cv.wait(g, [&] { return gate != 0; });
      if (gate < 0) return;
    }
    attnConfig_t cfg = ATTN_CONFIG_INITIALIZER;
    if (devlist) cfg.device = devlist[i];
    results[i] = attnCommInitRankConfig(&comms[i], ndev, id, i, &cfg);
    if (results[i] != attnSuccess) errors[i] = threadLastError();
  };
  std::vector<std::thread> threads;
  auto open = [&](int value) {
    {
      std::lock_guard<std::mutex> g(mu);
      gate = value;
    }
    cv.notify_all();
    for (auto& t : threads) t.join();
  };
  try {
    threads.reserve(size_t(ndev));
    for (int i = 0; i < ndev; ++i) threads.emplace_back(rankThread, i);
  } catch (const std::exception& e) {
    const size_t started = threads.size();
    open(-1);
    return setError(attnSystemError, "attnCommInitAll: cannot start the thread of rank %zu of %d (%s)", started, ndev,
                    e.what());
  }
  open(1);
  for (int i = 0; i < ndev; ++i)
    if (results[i] != attnSuccess) {
      for (int j = 0; j < ndev; ++j)
        if (comms[j]) {
          attnCommAbort(comms[j]);
          comms[j] = nullptr;
        }
      return setError(results[i], "%s", errors[i].c_str());
    }
  return attnSuccess;
}

// attnCommDestroy / attnCommAbort: only the first of them on a handle goes on.
attnResult_t beginDestroy(const char* what, attnComm* comm) {
  const HandleLookup l = beginClose(comm, HandleKind::kComm);
  if (l.state != HandleState::kLive) return badHandle(what, comm, HandleKind::kComm, l);
  return attnSuccess;
}

// Calls still running in other threads leave (they hold the communicator).
void waitForCalls(attnComm* comm) {
  while (comm->activeCalls.load(std::memory_order_acquire) > 0)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
}

}  // namespace

extern "C" {

attnResult_t attnGetVersion(int* version) {
  return guardedEntry([&] {
    if (!version) return attnInvalidArgument;
    *version = ATTN_VERSION_CODE;
    return attnSuccess;
  });
}

const char* attnGetErrorString(attnResult_t r) {
  return guardedText("unknown result code", [&] {
    switch (r) {
      case attnSuccess: return "no error";
      case attnUnhandledCudaError: return "unhandled cuda error";
      case attnSystemError: return "unhandled system error (socket, shared memory, ...)";
      case attnInternalError: return "internal error - please report this issue";
      case attnInvalidArgument: return "invalid argument";
      case attnInvalidUsage: return "invalid usage";
      case attnRemoteError: return "remote process exited or there was a network error";
      case attnInProgress: return "operation in progress";
      case attnTimeout: return "operation timed out";
      case attnNotSupported: return "not supported";
      default: return "unknown result code";
    }
  });
}

const char* attnGetLastError(attnComm_t comm) {
  return guardedText("(no memory for the error text)", [&] {
    if (comm == nullptr) {
      tlsErrorCopy = threadLastError();
      return tlsErrorCopy.c_str();
    }
    // The thread's own error is left alone: this only reads.
    const HandleLookup l = acquireHandle(comm, HandleKind::kComm);
    if (l.state != HandleState::kLive) {
      const std::string saved = threadLastError();
      badHandle("attnGetLastError", comm, HandleKind::kComm, l);
      tlsErrorCopy = threadLastError();
      restoreError(attnSuccess, saved);
      return tlsErrorCopy.c_str();
    }
    {
      std::lock_guard<std::mutex> g(comm->errMu);
      tlsErrorCopy = comm->lastError;
    }
    comm->activeCalls.fetch_sub(1, std::memory_order_acq_rel);
    return tlsErrorCopy.c_str();
  });
}

attnResult_t attnGetUniqueId(attnUniqueId* uniqueId) {
  return guardedEntry([&] {
    ErrorContext ctx("-");
    clearThreadLastError();
    ATTN_REQUIRE(uniqueId != nullptr, "uniqueId is NULL");
    return bootstrapCreateRoot(uniqueId);
  });
}

attnResult_t attnCommInitRank(attnComm_t* comm, int nranks, attnUniqueId commId, int rank) {
  return guardedEntry([&] { return newComm(comm, nranks, commId, rank, nullptr, nullptr); });
}

attnResult_t attnCommInitRankConfig(attnComm_t* comm, int nranks, attnUniqueId commId, int rank,
                                    attnConfig_t* config) {
  return guardedEntry([&] { return newComm(comm, nranks, commId, rank, config, nullptr); });
}

attnResult_t attnCommInitAll(attnComm_t* comms, int ndev, const int* devlist) {
  return guardedEntry([&] { return initAll(comms, ndev, devlist); });
}

attnResult_t attnCommDestroy(attnComm_t comm) {
  return guardedEntry([&] {
    ErrorContext ctx("-");
    clearThreadLastError();
    ATTN_REQUIRE(comm != nullptr, "communicator is NULL");
    ATTN_CHECK(beginDestroy("attnCommDestroy", comm));
    // Queued work runs first (stream work still gets in: see ApiCall);
    // calls other threads are still in leave before anything is freed.
    deviceFree(comm);
    comm->executor.reset();
    waitForCalls(comm);
    freeComm(comm);
    return attnSuccess;
  });
}

attnResult_t attnCommAbort(attnComm_t comm) {
  return guardedEntry([&] {
    ErrorContext ctx("-");
    clearThreadLastError();
    if (comm == nullptr) return attnSuccess;
    ATTN_CHECK(beginDestroy("attnCommAbort", comm));
    comm->abortFlag.store(true);
    if (comm->bootstrap) comm->bootstrap->close();
    deviceAbort(comm);  // queued stream operations fail fast, releasing their streams
    // Wait for calls blocked in other threads to notice the flag and leave.
    waitForCalls(comm);
    if (comm->executor) {
      comm->executor->drain();  // queued work fails fast on the flag
    }
    if (comm->engine) comm->engine->breakWith(attnRemoteError, "communicator aborted");
    freeComm(comm);
    return attnSuccess;
  });
}

attnResult_t attnCommGetAsyncError(attnComm_t comm, attnResult_t* asyncError) {
  return guardedEntry([&] {
    CommReader r(comm);
    ErrorContext ctx("-");
    ATTN_CHECK(r.status());
    ATTN_REQUIRE(asyncError != nullptr, "asyncError is NULL");
    // Whether work is queued is read before its results: an operation that
    // fails between the two reads then shows as in progress (its error comes
    // with the next poll), never as a success.
    const bool queued = (comm->executor && comm->executor->busy()) || deviceBusy(comm);
    attnResult_t e = comm->asyncError.load();
    // The engine is set by the init thread of a non-blocking communicator;
    // `ready` (released after it) says it may be read.
    if (e == attnSuccess && comm->ready.load(std::memory_order_acquire) && comm->engine->broken())
      e = comm->engine->brokenResult();
    if (e == attnSuccess) e = deviceAsyncError(comm);
    if (e == attnSuccess && queued) e = attnInProgress;
    *asyncError = e;
    return attnSuccess;
  });
}

attnResult_t attnCommCount(const attnComm_t comm, int* count) {
  return guardedEntry([&] {
    CommReader r(comm);
    ErrorContext ctx("-");
    ATTN_CHECK(r.status());
    ATTN_REQUIRE(count != nullptr, "count is NULL");
    ATTN_REQUIRE(comm->ready.load() || comm->nranks > 0, "communicator is still initialising");
    *count = comm->nranks;
    return attnSuccess;
  });
}

attnResult_t attnCommUserRank(const attnComm_t comm, int* rank) {
  return guardedEntry([&] {
    CommReader r(comm);
    ErrorContext ctx("-");
    ATTN_CHECK(r.status());
    ATTN_REQUIRE(rank != nullptr, "rank is NULL");
    ATTN_REQUIRE(comm->ready.load() || comm->nranks > 0, "communicator is still initialising");
    *rank = comm->rank;
    return attnSuccess;
  });
}

attnResult_t attnCommDevice(const attnComm_t comm, int* device) {
  return guardedEntry([&] {
    CommReader r(comm);
    ErrorContext ctx("-");
    ATTN_CHECK(r.status());
    ATTN_REQUIRE(device != nullptr, "device is NULL");
    *device = comm->config.device;
    return attnSuccess;
  });
}

}  // extern "C"

namespace attn {
// For attnCommSplit and attnCommInitFromEnv (api_split.cc, api_env.cc).
attnResult_t newCommInternal(attnComm** out, int nranks, const attnUniqueId& id, int rank,
                             const attnConfig_t* config, const CommConfig* inherit) {
  return newComm(out, nranks, id, rank, config, inherit);
}
}  // namespace attn
