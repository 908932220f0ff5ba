// Socket utilities shared by the bootstrap and the TCP transport: addresses
// ("host:port", "[v6]:port"), interface selection (ATTN_SOCKET_IFNAME),
// listen / connect / accept, and blocking send/recv that honour a deadline and
// cancel flags by polling in short slices.
//
// Blocking calls report failures through attn::setError, prefixing the
// caller's `what` (e.g. "bootstrap: send to peer 3") to the cause.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "attncomm.h"

namespace attn {

// A socket address (IPv4 or IPv6). Declared in bootstrap.h.
struct BootstrapAddress {
  sockaddr_storage storage{};
  socklen_t len = 0;

  int family() const { return storage.ss_family; }
  const sockaddr* sa() const { return reinterpret_cast<const sockaddr*>(&storage); }
  sockaddr* sa() { return reinterpret_cast<sockaddr*>(&storage); }
};
using SocketAddress = BootstrapAddress;

// Serialized form: raw sockaddr bytes, at most kAddressBytes.
constexpr size_t kAddressBytes = 64;
// Writes the address into out[kAddressBytes]; returns its length.
uint32_t serializeAddress(const SocketAddress& a, uint8_t* out);
// False when `len`/family do not describe an IPv4/IPv6 address.
bool deserializeAddress(const uint8_t* in, uint32_t len, SocketAddress* a);

// "host:port", "[v6addr]:port" or "v6addr" with port 0 when no port is given.
// Resolves host names (IPv4 preferred).
attnResult_t parseAddress(const std::string& hostPort, SocketAddress* out);
// "1.2.3.4:5" or "[::1]:5".
std::string formatAddress(const SocketAddress& a);
// The IP alone, without port ("1.2.3.4", "::1").
std::string addressIp(const SocketAddress& a);
int addressPort(const SocketAddress& a);
void setAddressPort(SocketAddress* a, int port);
bool isLoopback(const SocketAddress& a);

// True when interface `name` is selected by an ATTN_SOCKET_IFNAME-style spec:
// comma list of prefixes; a leading '^' excludes the listed ones; a leading
// '=' (after '^' if any) makes matches exact.
bool interfaceMatches(const std::string& spec, const std::string& name);

// The local address to listen on and advertise (net_interface.h says how it
// is chosen). `root` is the bootstrap root's address, or null when this
// process creates the root. Port 0.
attnResult_t findInterface(const SocketAddress* root, std::string* ifname, SocketAddress* addr);
attnResult_t findInterface(std::string* ifname, SocketAddress* addr);  // no root known

// ---------------------------------------------------------------------------
// Deadlines and cancellation for blocking calls.

class Deadline {
 public:
  // timeoutMs <= 0: never expires.
  static Deadline afterMs(int64_t timeoutMs);
  static Deadline never() { return Deadline(INT64_MAX); }
  bool infinite() const { return ns_ == INT64_MAX; }
  bool expired() const;
  // Milliseconds to wait in one poll: remaining time capped at `capMs`.
  int sliceMs(int capMs) const;
  Deadline earlier(const Deadline& o) const { return ns_ < o.ns_ ? *this : o; }

 private:
  explicit Deadline(int64_t ns) : ns_(ns) {}
  int64_t ns_;  // CLOCK_MONOTONIC, INT64_MAX = never
};

int64_t monotonicNs();

// Up to two flags (e.g. the communicator's abort flag and an object's own
// closed flag); a blocking call returns when either is set.
struct Cancel {
  const std::atomic<bool>* a = nullptr;
  const std::atomic<bool>* b = nullptr;
  bool set() const {
    return (a && a->load(std::memory_order_relaxed)) ||
           (b && b->load(std::memory_order_relaxed));
  }
};

// ---------------------------------------------------------------------------
// Socket setup.

attnResult_t setNonBlocking(int fd, bool on = true);
void setNoDelay(int fd);
// bytes <= 0 keeps the kernel's autotuning (setting a size disables it).
void setBufferSizes(int fd, int bytes);

// Listens on `bindAddr` (port 0: ephemeral). `reuse` sets SO_REUSEADDR.
// Writes the bound address (with the real port). The socket is non-blocking.
attnResult_t socketListen(const SocketAddress& bindAddr, bool reuse, int* fd,
                          SocketAddress* bound);
// Who is dialled. A root may start after its ranks, so refused attempts are
// retried until the deadline. A peer's address was listening before it was
// published, so one that stays unreachable for kPeerConnectMs is wrong for
// this host (a loopback or private address advertised across hosts): fail
// then, naming the address and ATTN_SOCKET_IFNAME, instead of at the
// communicator's timeout.
enum class ConnectTarget { kRoot, kPeer };
constexpr int kPeerConnectMs = 10000;

// Connects to `addr`, retrying refused / unreachable attempts with backoff
// (see ConnectTarget). The returned socket is blocking, with TCP_NODELAY.
attnResult_t socketConnect(const SocketAddress& addr, const Deadline& deadline,
                           const Cancel& cancel, const char* what, int* fd,
                           ConnectTarget target = ConnectTarget::kRoot);
// Non-blocking accept: *fd = -1 when nothing is waiting.
attnResult_t socketAcceptNow(int listenFd, int* fd);
void closeSocket(int* fd);

// Blocking send/recv of exactly `bytes` (the socket may be non-blocking).
// Peer close -> attnRemoteError, deadline -> attnTimeout, cancel ->
// attnRemoteError ("aborted"), other failures -> attnSystemError.
attnResult_t socketSendAll(int fd, const void* data, size_t bytes,
                           const Deadline& deadline, const Cancel& cancel,
                           const char* what);
attnResult_t socketRecvAll(int fd, void* data, size_t bytes,
                           const Deadline& deadline, const Cancel& cancel,
                           const char* what);

// ---------------------------------------------------------------------------
// Length-prefixed frames: u32 length (host order) then the body.

// Sends one frame (the length prefix and body in one call when possible).
attnResult_t sendFrame(int fd, const void* body, size_t bytes,
                       const Deadline& deadline, const Cancel& cancel,
                       const char* what);
// Sends one small frame without waiting: true when it was written whole.
// For servers that poll many sockets and must not block on one (a fresh
// connection's send buffer always has room for a handshake frame); on false
// the stream is unusable and should be closed.
bool sendFrameNow(int fd, const void* body, size_t bytes);
// A received frame read as the fixed-size struct T: false unless it has
// exactly sizeof(T) bytes.
template <typename T>
bool frameAs(const uint8_t* bytes, size_t len, T* out) {
  if (bytes == nullptr || len != sizeof(T)) return false;
  std::memcpy(out, bytes, sizeof(T));
  return true;
}

// Receives one frame of at most maxBytes into *body.
attnResult_t recvFrame(int fd, size_t maxBytes, std::vector<uint8_t>* body,
                       const Deadline& deadline, const Cancel& cancel,
                       const char* what);

// Reads frames from a non-blocking socket without ever blocking, so one
// silent or hostile peer cannot stall a server that polls many sockets.
class FrameReader {
 public:
  enum Status { kAgain, kFrame, kClosed, kError, kTooLong };
  // Reads what is available. kFrame: body() holds a whole frame (call
  // next() before reading on). A frame longer than maxBytes yields kTooLong
  // before its body is read.
  Status read(int fd, size_t maxBytes);
  std::vector<uint8_t>& body() { return body_; }
  void next();
  int lastErrno() const { return errno_; }

 private:
  uint8_t lenBuf_[4] = {};
  size_t lenGot_ = 0;
  size_t need_ = 0;
  size_t got_ = 0;
  std::vector<uint8_t> body_;
  bool haveLen_ = false;
  int errno_ = 0;
};

}  // namespace attn
