// The TCP transport's receive path reads chunk headers and payloads that a
// peer wrote: here the peer is the fuzzer. A TcpConnection over one or two
// socketpairs gets a few posted receives; the input then says what the peer
// writes on which socket, piece by piece, with progress() run after each
// piece (so the interleavings of two sockets that a real peer produces are
// reachable); finally the peer closes. Progress must end (no hang), and
// nothing may be written outside the posted buffers (each is its own
// allocation, so ASan sees any byte past it) nor into the buffer of a
// receive that has ended (it is freed then).
//
// Input: nsocks-1 (1 byte, low bit), receives-1 (1 byte, mod 4), each
// receive's capacity (2 bytes, big endian, mod 8193), then pieces:
// socket (1 byte, low bit), length (2 bytes, big endian), bytes.
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "tests/fuzz/fuzz_input.h"

#include "src/core/transport.h"
#include "transports/tcp/tcp_connection.h"

namespace {

using attn::fuzz::Input;

void writeAll(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    // MSG_NOSIGNAL: the connection may have shut the socket on a bad chunk.
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) return;  // full, or closed: the rest is simply not sent
    p += w;
    n -= size_t(w);
  }
}

// Runs progress until it stops moving bytes (or fails). A receive that
// ended gives its buffer back, as a caller would (reusing or freeing it):
// from then on a byte written there is a use after free.
void drain(attn::tcp::TcpConnection& conn, std::vector<std::unique_ptr<char[]>>& bufs,
           const std::vector<std::unique_ptr<attn::Request>>& reqs) {
  for (int i = 0; i < 100000; ++i) {
    bool progressed = false;
    const bool ok = conn.progress(&progressed) == attnSuccess;
    for (size_t r = 0; r < reqs.size(); ++r)
      if (!reqs[r]->pending()) bufs[r].reset();
    if (!ok || !progressed) return;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 48 * 1024) return 0;  // stays below the socket buffers: writes never block
  Input in{data, size};
  const int nsocks = 1 + (in.byte() & 1);
  const int nrecv = 1 + in.byte() % 4;
  std::vector<size_t> caps;
  for (int i = 0; i < nrecv; ++i) caps.push_back(in.u16() % 8193);

  std::vector<int> mine, theirs;
  for (int k = 0; k < nsocks; ++k) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) != 0) std::abort();
    mine.push_back(sv[0]);
    theirs.push_back(sv[1]);
  }
  // Requests outlive the connection: closing it fails those still queued.
  std::vector<std::unique_ptr<char[]>> bufs;
  std::vector<std::unique_ptr<attn::Request>> reqs;
  {
    attn::tcp::TcpOptions opt;
    opt.nsocks = nsocks;
    auto registry = std::make_shared<attn::tcp::TcpRegistry>();
    attn::tcp::TcpConnection conn(1, mine, opt, "peer 1 (fuzz)", registry);
    for (size_t cap : caps) {
      bufs.emplace_back(new char[cap]);
      reqs.emplace_back(new attn::Request);
      (void)conn.postRecv(bufs.back().get(), cap, reqs.back().get());
    }
    while (in.n > 0) {
      const int sock = in.byte() % nsocks;
      const size_t len = std::min(in.u16(), in.n);
      writeAll(theirs[sock], in.p, len);
      in.p += len;
      in.n -= len;
      drain(conn, bufs, reqs);
    }
    for (int fd : theirs) ::close(fd);
    drain(conn, bufs, reqs);
    for (size_t i = 0; i < reqs.size(); ++i)
      if (reqs[i]->state.load() == attn::Request::kDone && reqs[i]->bytes > caps[i]) std::abort();
  }  // the connection closes its sockets
  return 0;
}
