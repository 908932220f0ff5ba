// One peer of the TCP transport: K non-blocking sockets carrying messages in
// both directions (tcp_wire.h). progress() never blocks: it writes queued
// chunks with sendmsg until the kernel says EAGAIN and reads chunk payloads
// straight into the posted receive buffers.
//
// Receives are matched in posting order by message sequence number. A socket
// whose next chunk belongs to a receive not yet posted is left unread (TCP
// flow control pushes back on the sender); nothing is buffered on our side.
//
// Every header is checked before a payload byte is read (tcp_chunk_check.h):
// a peer that sends overlapping, duplicate, out-of-range, reordered or
// oversized chunks fails the connection (attnRemoteError naming it), and
// nothing is written outside the posted buffers.
#pragma once

#include <poll.h>

#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "src/core/transport.h"
#include "transports/tcp/tcp_chunk_check.h"
#include "transports/tcp/tcp_wire.h"

namespace attn::tcp {

struct TcpOptions {
  int nsocks = 2;                       // ATTN_TCP_NSOCKS
  size_t stripeMin = size_t(256) << 10; // ATTN_TCP_STRIPE_MIN
  int sockBuf = 0;                      // ATTN_TCP_SOCKBUF (0: kernel autotuning)
  static TcpOptions fromEnv();
};

class TcpConnection;

// The live connections of one transport, for waitForActivity.
struct TcpRegistry {
  std::mutex mu;
  std::vector<TcpConnection*> conns;
};

class TcpConnection : public Connection {
 public:
  TcpConnection(int peer, std::vector<int> fds, const TcpOptions& opt, std::string peerName,
                std::shared_ptr<TcpRegistry> registry);
  ~TcpConnection() override;

  attnResult_t postSend(const void* buf, size_t bytes, Request* req) override;
  attnResult_t postRecv(void* buf, size_t capacity, Request* req) override;
  attnResult_t progress(bool* progressed) override;
  bool idle() const override;
  void close() override;

  // Appends the sockets and events the queued operations wait for. Called
  // by a sleeping driver without the engine's lock, so it reads only the
  // snapshot that the locked calls publish.
  void addPollFds(std::vector<pollfd>* out) const;

 private:
  struct SendOp {
    Request* req;
    size_t bytes;
    size_t chunksLeft;
  };
  struct Chunk {
    ChunkHeader hdr;
    const char* data;
    size_t sent;  // bytes of header + payload already written
    SendOp* op;
  };
  struct RecvOp {
    RecvOp(Request* r, char* b, size_t cap) : req(r), buf(b), capacity(cap) {}
    Request* req;
    char* buf;
    size_t capacity;
    MessageClaims claims;  // its chunks' ranges (and its size, from the first)
    uint64_t got = 0;      // payload bytes arrived
    bool done = false;
  };
  struct Sock {
    int fd = -1;
    uint32_t index = 0;  // TcpHello.index: which stripes travel here
    std::deque<Chunk> sendq;
    // Receive state: reading a header, or the payload of `hdr`.
    ChunkHeader hdr{};
    size_t hdrGot = 0;
    bool inPayload = false;
    uint64_t payloadGot = 0;
    bool eof = false;
    SocketSeqWindow window;  // the seqs its next header may carry
    // Holds the header of a message whose receive is not posted yet.
    bool parked() const { return !inPayload && hdrGot == sizeof(ChunkHeader); }
  };

  attnResult_t progressSend(Sock& s, bool* progressed);
  attnResult_t progressRecv(Sock& s, bool* progressed);
  // A whole header arrived: check its seq against the socket's window.
  attnResult_t admitHeader(Sock& s);
  // Matches an admitted header with its receive and claims its range.
  // *parked when the receive is not posted yet.
  attnResult_t startChunk(Sock& s, bool* parked);
  // The receive of s.hdr, looked up again before each payload read; breaks
  // the link when it is no longer queued.
  attnResult_t payloadTarget(Sock& s, RecvOp** op);
  attnResult_t badChunk(const ChunkHeader& h, ChunkVerdict v);
  void finishRecv(RecvOp& op);
  void popFinished();
  // Fails every queued request, closes the sockets, remembers the cause.
  void shutDown(attnResult_t code, const std::string& why);
  // shutDown, and records `why` as the thread's error.
  attnResult_t breakLink(attnResult_t code, const std::string& why);
  bool peerGone() const;
  attnResult_t progressLocked(bool* progressed);
  // Recomputes the poll snapshot from the queues (after every change).
  void publishPollFds();

  TcpOptions opt_;
  std::string peerName_;  // "peer 3 (10.0.0.2:4567)"
  std::vector<Sock> socks_;
  std::deque<SendOp> sendOps_;
  std::deque<RecvOp> recvOps_;
  uint64_t sendSeq_ = 0;
  uint64_t recvFrontSeq_ = 0;  // seq of recvOps_.front()
  bool broken_ = false;
  attnResult_t brokenCode_ = attnSuccess;
  std::string brokenWhy_;
  std::shared_ptr<TcpRegistry> registry_;
  mutable std::mutex pollMu_;
  std::vector<pollfd> pollFds_;  // what addPollFds hands out
  std::vector<pollfd> scratch_;  // the next snapshot, built under the engine's lock
};

}  // namespace attn::tcp
