#include "src/core/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <thread>

#include "src/core/env.h"
#include "src/core/error.h"
#include "src/core/log.h"

namespace attn {

// ---------------------------------------------------------------------------
// Addresses

uint32_t serializeAddress(const SocketAddress& a, uint8_t* out) {
  std::memset(out, 0, kAddressBytes);
  uint32_t n = std::min<uint32_t>(a.len, kAddressBytes);
  std::memcpy(out, &a.storage, n);
  return n;
}

bool deserializeAddress(const uint8_t* in, uint32_t len, SocketAddress* a) {
  if (len > kAddressBytes) return false;
  SocketAddress t;
  std::memcpy(&t.storage, in, len);
  t.len = len;
  if (t.family() == AF_INET && len == sizeof(sockaddr_in)) { *a = t; return true; }
  if (t.family() == AF_INET6 && len == sizeof(sockaddr_in6)) { *a = t; return true; }
  return false;
}

attnResult_t parseAddress(const std::string& hostPort, SocketAddress* out) {
  std::string host, port;
  if (!hostPort.empty() && hostPort[0] == '[') {
    size_t close = hostPort.find(']');
    if (close == std::string::npos)
      return setError(attnInvalidArgument, "address \"%s\": missing ']'", hostPort.c_str());
    host = hostPort.substr(1, close - 1);
    std::string rest = hostPort.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':')
        return setError(attnInvalidArgument, "address \"%s\": expected ':' after ']'",
                        hostPort.c_str());
      port = rest.substr(1);
    }
  } else if (std::count(hostPort.begin(), hostPort.end(), ':') > 1) {
    host = hostPort;  // bare IPv6, no port
  } else {
    size_t colon = hostPort.rfind(':');
    host = hostPort.substr(0, colon);
    if (colon != std::string::npos) port = hostPort.substr(colon + 1);
  }
  if (host.empty())
    return setError(attnInvalidArgument, "address \"%s\": empty host", hostPort.c_str());
  long portNum = 0;
  if (!port.empty()) {
    char* end = nullptr;
    portNum = std::strtol(port.c_str(), &end, 10);
    if (*end != '\0' || portNum < 0 || portNum > 65535 || !std::isdigit((unsigned char)port[0]))
      return setError(attnInvalidArgument, "address \"%s\": bad port", hostPort.c_str());
  }

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr)
    return setError(attnInvalidArgument, "address \"%s\": cannot resolve \"%s\": %s",
                    hostPort.c_str(), host.c_str(), gai_strerror(rc));
  const addrinfo* pick = res;
  for (const addrinfo* p = res; p; p = p->ai_next)
    if (p->ai_family == AF_INET) { pick = p; break; }
  SocketAddress a;
  std::memcpy(&a.storage, pick->ai_addr, pick->ai_addrlen);
  a.len = pick->ai_addrlen;
  freeaddrinfo(res);
  setAddressPort(&a, int(portNum));
  *out = a;
  return attnSuccess;
}

std::string addressIp(const SocketAddress& a) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.family() == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&a.storage)->sin_addr, buf, sizeof(buf));
  else if (a.family() == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&a.storage)->sin6_addr, buf, sizeof(buf));
  else
    return "?";
  return buf;
}

int addressPort(const SocketAddress& a) {
  if (a.family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&a.storage)->sin_port);
  if (a.family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&a.storage)->sin6_port);
  return 0;
}

void setAddressPort(SocketAddress* a, int port) {
  if (a->family() == AF_INET) reinterpret_cast<sockaddr_in*>(&a->storage)->sin_port = htons(uint16_t(port));
  if (a->family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&a->storage)->sin6_port = htons(uint16_t(port));
}

std::string formatAddress(const SocketAddress& a) {
  std::string ip = addressIp(a);
  std::string port = std::to_string(addressPort(a));
  return a.family() == AF_INET6 ? "[" + ip + "]:" + port : ip + ":" + port;
}

bool isLoopback(const SocketAddress& a) {
  if (a.family() == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(&a.storage)->sin_addr.s_addr) >> 24) == 127;
  if (a.family() == AF_INET6)
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&a.storage)->sin6_addr);
  return false;
}

// ---------------------------------------------------------------------------
// Interface selection

bool interfaceMatches(const std::string& specIn, const std::string& name) {
  std::string spec = specIn;
  bool exclude = !spec.empty() && spec[0] == '^';
  if (exclude) spec.erase(0, 1);
  bool exact = !spec.empty() && spec[0] == '=';
  if (exact) spec.erase(0, 1);
  bool match = false;
  std::stringstream ss(spec);
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    if (tok.empty()) continue;
    if (exact ? name == tok : name.compare(0, tok.size(), tok) == 0) { match = true; break; }
  }
  return exclude ? !match : match;
}

// ---------------------------------------------------------------------------
// Deadlines

int64_t monotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

Deadline Deadline::afterMs(int64_t timeoutMs) {
  if (timeoutMs <= 0) return never();
  return Deadline(monotonicNs() + timeoutMs * 1000000LL);
}

bool Deadline::expired() const { return !infinite() && monotonicNs() >= ns_; }

int Deadline::sliceMs(int capMs) const {
  if (infinite()) return capMs;
  int64_t left = (ns_ - monotonicNs() + 999999) / 1000000;
  return int(std::clamp<int64_t>(left, 0, capMs));
}

// ---------------------------------------------------------------------------
// Setup

attnResult_t setNonBlocking(int fd, bool on) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK)) < 0)
    return setError(attnSystemError, "fcntl(O_NONBLOCK): %s", strerror(errno));
  return attnSuccess;
}

void setNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void setBufferSizes(int fd, int bytes) {
  if (bytes <= 0) return;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

void closeSocket(int* fd) {
  if (*fd >= 0) ::close(*fd);
  *fd = -1;
}

attnResult_t socketListen(const SocketAddress& bindAddr, bool reuse, int* fd,
                          SocketAddress* bound) {
  int s = socket(bindAddr.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s < 0) return setError(attnSystemError, "socket(): %s", strerror(errno));
  if (reuse) {
    int one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  }
  if (bind(s, bindAddr.sa(), bindAddr.len) != 0) {
    int e = errno;
    ::close(s);
    return setError(attnSystemError, "bind %s: %s", formatAddress(bindAddr).c_str(), strerror(e));
  }
  if (listen(s, SOMAXCONN) != 0) {
    int e = errno;
    ::close(s);
    return setError(attnSystemError, "listen %s: %s", formatAddress(bindAddr).c_str(), strerror(e));
  }
  SocketAddress b;
  b.len = sizeof(b.storage);
  getsockname(s, b.sa(), &b.len);
  if (bound) *bound = b;
  *fd = s;
  return attnSuccess;
}

namespace {

bool retryableConnectError(int e) {
  return e == ECONNREFUSED || e == ETIMEDOUT || e == ENETUNREACH || e == EHOSTUNREACH ||
         e == ECONNRESET || e == EAGAIN || e == ECONNABORTED || e == EINTR;
}

// Sleeps up to `ms`, waking early on cancel.
void napMs(int ms, const Cancel& cancel) {
  while (ms > 0 && !cancel.set()) {
    int s = std::min(ms, 20);
    std::this_thread::sleep_for(std::chrono::milliseconds(s));
    ms -= s;
  }
}

// A connect to a local ephemeral port that nobody listens on can connect the
// socket to itself (TCP simultaneous open); such a socket is useless.
bool selfConnected(int fd) {
  SocketAddress me, peer;
  me.len = peer.len = sizeof(sockaddr_storage);
  if (getsockname(fd, me.sa(), &me.len) != 0 || getpeername(fd, peer.sa(), &peer.len) != 0)
    return false;
  return me.len == peer.len && std::memcmp(&me.storage, &peer.storage, me.len) == 0;
}

}  // namespace

attnResult_t socketConnect(const SocketAddress& addr, const Deadline& overall,
                           const Cancel& cancel, const char* what, int* fd,
                           ConnectTarget target) {
  const bool peer = target == ConnectTarget::kPeer;
  const Deadline deadline = peer ? overall.earlier(Deadline::afterMs(kPeerConnectMs)) : overall;
  int backoffMs = 1;
  int lastErr = 0;
  for (;;) {
    if (cancel.set()) return setError(attnRemoteError, "%s: aborted while connecting to %s", what,
                                      formatAddress(addr).c_str());
    int s = socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0) return setError(attnSystemError, "%s: socket(): %s", what, strerror(errno));
    int err = 0;
    if (::connect(s, addr.sa(), addr.len) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        err = ETIMEDOUT;
        while (!cancel.set() && !deadline.expired()) {
          pollfd p{s, POLLOUT, 0};
          int n = poll(&p, 1, deadline.sliceMs(50));
          if (n > 0) {
            socklen_t l = sizeof(err);
            getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &l);
            break;
          }
        }
      }
    }
    if (err == 0 && selfConnected(s)) err = ECONNREFUSED;
    if (err == 0) {
      setNonBlocking(s, false);
      setNoDelay(s);
      *fd = s;
      return attnSuccess;
    }
    ::close(s);
    lastErr = err;
    if (!retryableConnectError(err))
      return setError(attnSystemError, "%s: connect to %s: %s", what,
                      formatAddress(addr).c_str(), strerror(err));
    if (deadline.expired() || cancel.set()) break;
    napMs(std::min(backoffMs, deadline.sliceMs(backoffMs)), cancel);
    backoffMs = std::min(backoffMs * 2, 200);
  }
  if (cancel.set())
    return setError(attnRemoteError, "%s: aborted while connecting to %s", what,
                    formatAddress(addr).c_str());
  if (peer && !overall.expired())
    return setError(attnRemoteError,
                    "%s: cannot reach %s, the address the peer advertised (%s for %d s): if "
                    "ranks are on several hosts, set ATTN_SOCKET_IFNAME to the interface they "
                    "share", what, formatAddress(addr).c_str(), strerror(lastErr),
                    kPeerConnectMs / 1000);
  return setError(attnTimeout, "%s: timed out connecting to %s (last error: %s)", what,
                  formatAddress(addr).c_str(), strerror(lastErr));
}

attnResult_t socketAcceptNow(int listenFd, int* fd) {
  *fd = -1;
  for (;;) {
    int s = accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (s >= 0) {
      setNoDelay(s);
      *fd = s;
      return attnSuccess;
    }
    if (errno == EINTR) continue;
    // Errors of one pending connection (it was reset, ...) are not ours.
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED || errno == EPROTO ||
        errno == EPERM)
      return attnSuccess;
    return setError(attnSystemError, "accept: %s", strerror(errno));
  }
}

// ---------------------------------------------------------------------------
// Blocking I/O

namespace {

// Waits until `fd` is ready for `events`; attnSuccess when it may be.
attnResult_t waitReady(int fd, short events, const Deadline& deadline, const Cancel& cancel,
                       const char* what, const char* verb) {
  for (;;) {
    if (cancel.set()) return setError(attnRemoteError, "%s: aborted", what);
    if (deadline.expired()) return setError(attnTimeout, "%s: timed out in %s", what, verb);
    pollfd p{fd, events, 0};
    int n = poll(&p, 1, deadline.sliceMs(50));
    if (n > 0) return attnSuccess;
    if (n < 0 && errno != EINTR)
      return setError(attnSystemError, "%s: poll: %s", what, strerror(errno));
  }
}

attnResult_t ioError(int e, const char* what, const char* verb) {
  if (e == EPIPE || e == ECONNRESET || e == ENOTCONN || e == ETIMEDOUT || e == EHOSTUNREACH)
    return setError(attnRemoteError, "%s: %s: %s", what, verb, strerror(e));
  return setError(attnSystemError, "%s: %s: %s", what, verb, strerror(e));
}

attnResult_t sendAllV(int fd, iovec* iov, int iovcnt, const Deadline& deadline,
                      const Cancel& cancel, const char* what) {
  while (iovcnt > 0) {
    if (iov->iov_len == 0) { ++iov; --iovcnt; continue; }
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = size_t(iovcnt);
    ssize_t n = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return ioError(errno, what, "send");
      ATTN_CHECK(waitReady(fd, POLLOUT, deadline, cancel, what, "send"));
      continue;
    }
    size_t left = size_t(n);
    while (iovcnt > 0 && left >= iov->iov_len) { left -= iov->iov_len; ++iov; --iovcnt; }
    if (iovcnt > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return attnSuccess;
}

}  // namespace

attnResult_t socketSendAll(int fd, const void* data, size_t bytes, const Deadline& deadline,
                           const Cancel& cancel, const char* what) {
  iovec iov{const_cast<void*>(data), bytes};
  return sendAllV(fd, &iov, 1, deadline, cancel, what);
}

attnResult_t socketRecvAll(int fd, void* data, size_t bytes, const Deadline& deadline,
                           const Cancel& cancel, const char* what) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    ssize_t n = recv(fd, p, bytes, MSG_DONTWAIT);
    if (n > 0) { p += n; bytes -= size_t(n); continue; }
    if (n == 0) return setError(attnRemoteError, "%s: connection closed by peer", what);
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return ioError(errno, what, "recv");
    ATTN_CHECK(waitReady(fd, POLLIN, deadline, cancel, what, "recv"));
  }
  return attnSuccess;
}

attnResult_t sendFrame(int fd, const void* body, size_t bytes, const Deadline& deadline,
                       const Cancel& cancel, const char* what) {
  if (bytes > UINT32_MAX) return setError(attnInvalidArgument, "%s: frame too long", what);
  uint32_t len = uint32_t(bytes);
  iovec iov[2] = {{&len, sizeof(len)}, {const_cast<void*>(body), bytes}};
  return sendAllV(fd, iov, 2, deadline, cancel, what);
}

bool sendFrameNow(int fd, const void* body, size_t bytes) {
  if (bytes > UINT32_MAX) return false;
  uint32_t len = uint32_t(bytes);
  iovec iov[2] = {{&len, sizeof(len)}, {const_cast<void*>(body), bytes}};
  msghdr m{};
  m.msg_iov = iov;
  m.msg_iovlen = 2;
  for (;;) {
    const ssize_t n = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    return n == ssize_t(sizeof(len) + bytes);
  }
}

attnResult_t recvFrame(int fd, size_t maxBytes, std::vector<uint8_t>* body,
                       const Deadline& deadline, const Cancel& cancel, const char* what) {
  uint32_t len = 0;
  ATTN_CHECK(socketRecvAll(fd, &len, sizeof(len), deadline, cancel, what));
  if (len > maxBytes)
    return setError(attnRemoteError, "%s: frame of %u bytes exceeds the %zu-byte bound", what,
                    len, maxBytes);
  body->resize(len);
  return socketRecvAll(fd, body->data(), len, deadline, cancel, what);
}

// ---------------------------------------------------------------------------
// FrameReader

FrameReader::Status FrameReader::read(int fd, size_t maxBytes) {
  for (;;) {
    bool inLen = !haveLen_;
    char* dst = inLen ? reinterpret_cast<char*>(lenBuf_) + lenGot_
                      : reinterpret_cast<char*>(body_.data()) + got_;
    size_t want = inLen ? sizeof(lenBuf_) - lenGot_ : need_ - got_;
    if (!inLen && want == 0) return kFrame;
    ssize_t n = recv(fd, dst, want, MSG_DONTWAIT);
    if (n == 0) return kClosed;
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return kAgain;
      errno_ = errno;
      return kError;
    }
    if (inLen) {
      lenGot_ += size_t(n);
      if (lenGot_ < sizeof(lenBuf_)) continue;
      uint32_t len;
      std::memcpy(&len, lenBuf_, sizeof(len));
      if (len > maxBytes) return kTooLong;
      need_ = len;
      got_ = 0;
      body_.resize(len);
      haveLen_ = true;
      if (len == 0) return kFrame;
    } else {
      got_ += size_t(n);
      if (got_ == need_) return kFrame;
    }
  }
}

void FrameReader::next() {
  lenGot_ = 0;
  need_ = got_ = 0;
  haveLen_ = false;
  body_.clear();
}

}  // namespace attn
