// A TcpConnection whose peer is the test: socketpairs stand in for its K
// sockets, and the test writes chunk headers and payloads (or any bytes at
// all) into the far ends, then drives the connection by hand. Nothing
// blocks: the far ends are non-blocking, and drain() stops when a pass
// moves nothing. A fuzzer can drive a connection the same way.
#pragma once

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "src/core/transport.h"
#include "transports/tcp/tcp_connection.h"
#include "transports/tcp/tcp_wire.h"

namespace attn::testing {

class TcpFarEnd {
 public:
  // The connection talks to "peer 1 (far end)".
  explicit TcpFarEnd(int nsocks) {
    std::vector<int> mine;
    for (int k = 0; k < nsocks; ++k) {
      int sv[2] = {-1, -1};
      if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) != 0) break;
      mine.push_back(sv[0]);
      far_.push_back(sv[1]);
    }
    tcp::TcpOptions opt;
    opt.nsocks = int(mine.size());
    conn_ = std::make_unique<tcp::TcpConnection>(1, mine, opt, "peer 1 (far end)",
                                                 std::make_shared<tcp::TcpRegistry>());
  }
  ~TcpFarEnd() {
    conn_.reset();
    closeFarEnds();
  }

  tcp::TcpConnection& conn() { return *conn_; }
  int nsocks() const { return int(far_.size()); }

  // Writes as much of p[0, n) as the socket buffer takes; returns that much.
  size_t write(int sock, const void* p, size_t n) {
    size_t done = 0;
    while (done < n && far_[sock] >= 0) {
      ssize_t w = ::send(far_[sock], static_cast<const char*>(p) + done, n - done, MSG_NOSIGNAL);
      if (w <= 0) break;
      done += size_t(w);
    }
    return done;
  }
  // A chunk header and then `payloadBytes` bytes of `fill` (default: the
  // header's len, i.e. the whole payload).
  void chunk(int sock, uint64_t seq, uint64_t total, uint64_t offset, uint64_t len,
             uint8_t fill = 0x11, size_t payloadBytes = SIZE_MAX) {
    const tcp::ChunkHeader h{seq, total, offset, len};
    write(sock, &h, sizeof(h));
    payload(sock, payloadBytes == SIZE_MAX ? size_t(len) : payloadBytes, fill);
  }
  void payload(int sock, size_t n, uint8_t fill = 0x11) {
    std::vector<uint8_t> bytes(n, fill);
    write(sock, bytes.data(), n);
  }
  void closeFarEnds() {
    for (int& fd : far_)
      if (fd >= 0) {
        ::close(fd);
        fd = -1;
      }
  }

  // Calls progress() until a pass moves nothing or it fails (a bounded
  // number of passes); returns the last result.
  attnResult_t drain(int maxPasses = 100000) {
    attnResult_t r = attnSuccess;
    for (int i = 0; i < maxPasses; ++i) {
      bool progressed = false;
      r = conn_->progress(&progressed);
      if (r != attnSuccess || !progressed) break;
    }
    return r;
  }

 private:
  std::vector<int> far_;
  std::unique_ptr<tcp::TcpConnection> conn_;
};

}  // namespace attn::testing
