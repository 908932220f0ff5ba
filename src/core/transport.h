// The one small interface every transport implements (transports/<name>/).
//
// A Transport connects this rank to a set of peers and hands back one
// Connection per peer. A Connection moves opaque bytes to and from one peer:
// it knows bytes and peers, never attention or datatypes.
//
// Ordering: messages on a connection are matched with receives in posting
// order, in each direction (FIFO, as NCCL's send/recv). Message sizes are
// carried on the wire: a receive names a capacity, and a message longer than
// it fails the receive (attnInvalidUsage, "truncated").
//
// Threading: a Connection is not thread-safe. The progress engine serialises
// every call (post, progress, close) on the connections of one communicator.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attncomm.h"

namespace attn {

class Bootstrap;

// Completion record of one posted operation. The poster owns it and keeps it
// alive (and at a fixed address) until state != kPending.
struct Request {
  enum : int { kPending = 0, kDone = 1, kFailed = 2 };
  std::atomic<int> state{kPending};
  size_t bytes = 0;                   // receive: bytes that arrived
  attnResult_t error = attnSuccess;   // kFailed: why (text in threadLastError
                                      // of the thread that progressed it, and
                                      // in `message`)
  std::string message;

  bool pending() const { return state.load(std::memory_order_acquire) == kPending; }
  void complete(size_t n) {
    bytes = n;
    state.store(kDone, std::memory_order_release);
  }
  void fail(attnResult_t code, std::string why) {
    error = code;
    message = std::move(why);
    state.store(kFailed, std::memory_order_release);
  }
};

// What every rank knows about every other rank after bootstrap.
struct PeerInfo {
  int rank = -1;
  int64_t pid = 0;
  char hostId[64] = {};   // ATTN_HOSTID, else hostname + boot id
  uint64_t hostHash = 0;  // hash of hostId: same host <=> same hash
  char rackId[64] = {};   // ATTN_RACKID (or topology file); "" = unknown
  uint64_t rackHash = 0;  // hash of rackId: same rack <=> same hash
  uint64_t commHash = 0;  // unique per communicator instance
};

// Everything a transport may use while connecting.
struct TransportContext {
  int rank = 0;
  int nranks = 0;
  Bootstrap* bootstrap = nullptr;     // out-of-band exchange (init time only)
  const PeerInfo* peers = nullptr;    // [nranks]
  int timeoutMs = 0;                  // 0: forever
  const std::atomic<bool>* abortFlag = nullptr;  // set by attnCommAbort
};

class Connection {
 public:
  explicit Connection(int peer) : peer_(peer) {}
  virtual ~Connection() = default;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  int peer() const { return peer_; }

  // Queues a send of `bytes` from `buf` (valid until `req` completes). A send
  // completes when the buffer may be reused.
  virtual attnResult_t postSend(const void* buf, size_t bytes, Request* req) = 0;
  // Queues a receive of at most `capacity` bytes into `buf`.
  virtual attnResult_t postRecv(void* buf, size_t capacity, Request* req) = 0;
  // Moves whatever can move now without blocking; sets *progressed when
  // anything did. On a broken link returns attnRemoteError (peer gone) and
  // fails the queued requests; the connection stays broken.
  virtual attnResult_t progress(bool* progressed) = 0;
  // No queued operations in either direction.
  virtual bool idle() const = 0;
  // Closes the link now (abort or error); the peer notices. Queued requests
  // fail with attnRemoteError.
  virtual void close() = 0;
  // Whether postDeviceSend/postDeviceRecv work: the transport moves CUDA
  // device memory itself (UCX built with CUDA), so device buffers need no
  // staging through host memory. Fixed at connection time.
  virtual bool takesDeviceMemory() const { return false; }
  // postSend/postRecv on a buffer that may be CUDA device memory (or host
  // memory: the transport tells them apart). Only where takesDeviceMemory().
  virtual attnResult_t postDeviceSend(const void* buf, size_t bytes, Request* req);
  virtual attnResult_t postDeviceRecv(void* buf, size_t capacity, Request* req);
  // Sends of at least this many bytes from shareable memory (attnMemAlloc)
  // are read by the peer straight from its mapping of that memory, with no
  // system call per message; 0: never. Algorithms may stage data there.
  virtual size_t mappedSendMin() const { return 0; }

 private:
  int peer_;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;

  // Collective over all ranks of the communicator, called in the same order
  // on every rank (it may use ctx.bootstrap). Connects to each rank in
  // `peers` (possibly none on this rank); conns->at(i) serves peers[i].
  virtual attnResult_t connect(const TransportContext& ctx,
                               const std::vector<int>& peers,
                               std::vector<std::unique_ptr<Connection>>* conns) = 0;

  // Blocks for at most `timeoutUs` microseconds, or less when something may
  // have happened on one of this transport's connections. Spurious early
  // returns are allowed. Must not be called concurrently with progress().
  virtual void waitForActivity(int timeoutUs) = 0;

  // A transport whose peers signal only a rank that asked for it (shm rings
  // a doorbell only while its owner waits on it; a polling rank sees the
  // change itself) needs to know when a rank is about to sleep. The engine
  // calls armWait(), then polls its connections once more (catching what
  // arrived before peers saw the request), then waitForActivity() unless that
  // poll moved something, then disarmWait(). Calls pair up; several threads
  // may be armed at once.
  virtual void armWait() {}
  virtual void disarmWait() {}
};

// Registration: each transports/<name>/ defines register<Name>Transport(),
// which calls registerTransport with its name ("tcp", "shm", "ucx") and
// factory. The build lists the transports it compiles in one generated file
// (builtin_transports.cc) that calls them all, so the library (shared or
// static) carries every transport without naming one in src/; the
// communicator finds them by name (src/core/transport_registry.h).
using TransportMaker = std::unique_ptr<Transport> (*)();
void registerTransport(const char* name, TransportMaker make);

}  // namespace attn
