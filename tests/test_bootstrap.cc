// Bootstrap: unique ids, addresses, ranks as threads meeting at a root, and
// hostile clients (wrong secret, garbage, oversized frames) that must be
// dropped without disturbing the real ranks.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "src/core/bootstrap.h"
#include "src/core/bootstrap_socket.h"
#include "src/core/bootstrap_wire.h"
#include "src/core/error.h"
#include "src/core/socket.h"

namespace attn {
namespace {

constexpr int kTimeoutMs = 20000;

// Runs fn(rank) on n threads and waits for all.
void runRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) ts.emplace_back(fn, r);
  for (auto& t : ts) t.join();
}

UniqueIdData decoded(const attnUniqueId& id) {
  UniqueIdData d;
  EXPECT_EQ(decodeUniqueId(id, &d), attnSuccess);
  return d;
}

SocketAddress rootAddress(const attnUniqueId& id) {
  UniqueIdData d = decoded(id);
  SocketAddress a;
  EXPECT_TRUE(deserializeAddress(d.address, d.addressLen, &a));
  return a;
}

int dial(const SocketAddress& a) {
  int fd = -1;
  EXPECT_EQ(socketConnect(a, Deadline::afterMs(5000), Cancel{}, "test dial", &fd), attnSuccess);
  return fd;
}

// True when the other side closes `fd` within `ms` (EOF or reset).
bool closedByPeer(int fd, int ms = 5000) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  char buf[4096];
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
  }
  return false;
}

void sendRaw(int fd, const void* p, size_t n) {
  ASSERT_EQ(socketSendAll(fd, p, n, Deadline::afterMs(5000), Cancel{}, "test"), attnSuccess);
}

// Every rank checks allGather, tagged send/recv (out of tag order), self
// send and barrier.
void exerciseRank(Bootstrap* b) {
  const int r = b->rank(), n = b->nranks();
  for (int round = 0; round < 3; ++round) {
    std::vector<uint64_t> slots(n, 0);
    slots[r] = uint64_t(r) * 1000 + round;
    ASSERT_EQ(b->allGather(slots.data(), sizeof(uint64_t)), attnSuccess);
    for (int i = 0; i < n; ++i) EXPECT_EQ(slots[i], uint64_t(i) * 1000 + round);
  }
  for (int p = 0; p < n; ++p) {
    int a = r * 100 + p, c = -(r * 100 + p);
    ASSERT_EQ(b->send(p, 1, &a, sizeof(a)), attnSuccess);
    ASSERT_EQ(b->send(p, 2, &c, sizeof(c)), attnSuccess);
  }
  for (int p = n - 1; p >= 0; --p) {
    int a = 0, c = 0;
    ASSERT_EQ(b->recv(p, 2, &c, sizeof(c)), attnSuccess);  // tag 2 before tag 1
    ASSERT_EQ(b->recv(p, 1, &a, sizeof(a)), attnSuccess);
    EXPECT_EQ(a, p * 100 + r);
    EXPECT_EQ(c, -(p * 100 + r));
  }
  ASSERT_EQ(b->barrier(), attnSuccess);
  // A larger allGather (multi-KiB slots).
  std::vector<uint8_t> big(size_t(n) * 10000);
  for (size_t i = 0; i < 10000; ++i) big[r * 10000 + i] = uint8_t(r + i);
  ASSERT_EQ(b->allGather(big.data(), 10000), attnSuccess);
  for (int q = 0; q < n; ++q)
    for (size_t i = 0; i < 10000; i += 997) ASSERT_EQ(big[q * 10000 + i], uint8_t(q + i));
  ASSERT_EQ(b->barrier(), attnSuccess);
}

// ---------------------------------------------------------------------------

TEST(UniqueId, RoundTrip) {
  attnUniqueId id;
  ASSERT_EQ(bootstrapCreateRoot(&id), attnSuccess);
  UniqueIdData d = decoded(id);
  EXPECT_EQ(d.magic, boot::kIdMagic);
  attnUniqueId again;
  ASSERT_EQ(encodeUniqueId(d, &again), attnSuccess);
  EXPECT_EQ(std::memcmp(&id, &again, sizeof(id)), 0);
  // Release the root so it does not wait for ranks until process exit.
  runRanks(1, [&](int r) {
    std::unique_ptr<Bootstrap> b;
    ASSERT_EQ(Bootstrap::create(id, r, 1, kTimeoutMs, nullptr, &b), attnSuccess);
  });
}

TEST(UniqueId, RejectsGarbage) {
  UniqueIdData d;
  attnUniqueId zero{};
  EXPECT_EQ(decodeUniqueId(zero, &d), attnInvalidArgument);
  attnUniqueId junk;
  for (size_t i = 0; i < sizeof(junk.internal); ++i) junk.internal[i] = char(i * 37 + 11);
  EXPECT_EQ(decodeUniqueId(junk, &d), attnInvalidArgument);

  attnUniqueId good;
  uint8_t secret[16] = {1, 2, 3};
  ASSERT_EQ(bootstrapIdFor("127.0.0.1:5000", secret, &good), attnSuccess);
  ASSERT_EQ(decodeUniqueId(good, &d), attnSuccess);
  for (size_t i : {0, 5, 12, 30, 40, 101, 127}) {  // every byte matters
    attnUniqueId bad = good;
    bad.internal[i] ^= 0x40;
    EXPECT_EQ(decodeUniqueId(bad, &d), attnInvalidArgument) << "byte " << i;
  }
  std::unique_ptr<Bootstrap> b;
  EXPECT_EQ(Bootstrap::create(junk, 0, 1, 1000, nullptr, &b), attnInvalidArgument);
  EXPECT_NE(threadLastError().find("unique id"), std::string::npos);
}

TEST(Socket, ParseAndFormatAddresses) {
  SocketAddress a;
  ASSERT_EQ(parseAddress("127.0.0.1:8080", &a), attnSuccess);
  EXPECT_EQ(formatAddress(a), "127.0.0.1:8080");
  EXPECT_TRUE(isLoopback(a));
  ASSERT_EQ(parseAddress("[::1]:9", &a), attnSuccess);
  EXPECT_EQ(a.family(), AF_INET6);
  EXPECT_EQ(formatAddress(a), "[::1]:9");
  ASSERT_EQ(parseAddress("::1", &a), attnSuccess);
  EXPECT_EQ(addressPort(a), 0);
  ASSERT_EQ(parseAddress("localhost:77", &a), attnSuccess);
  EXPECT_EQ(addressPort(a), 77);
  EXPECT_NE(parseAddress("[::1:80", &a), attnSuccess);
  EXPECT_NE(parseAddress("1.2.3.4:99999", &a), attnSuccess);
  EXPECT_NE(parseAddress("1.2.3.4:x", &a), attnSuccess);
  EXPECT_NE(parseAddress(":80", &a), attnSuccess);
  uint8_t buf[kAddressBytes];
  uint32_t len = serializeAddress(a, buf);
  SocketAddress b;
  ASSERT_TRUE(deserializeAddress(buf, len, &b));
  EXPECT_EQ(formatAddress(a), formatAddress(b));
  EXPECT_FALSE(deserializeAddress(buf, 3, &b));
}

TEST(Socket, InterfaceSpec) {
  EXPECT_TRUE(interfaceMatches("eth", "eth0"));
  EXPECT_TRUE(interfaceMatches("ib,eth", "eth1"));
  EXPECT_FALSE(interfaceMatches("ib", "eth0"));
  EXPECT_FALSE(interfaceMatches("^eth,lo", "eth0"));
  EXPECT_TRUE(interfaceMatches("^eth,lo", "ens3"));
  EXPECT_TRUE(interfaceMatches("=eth0", "eth0"));
  EXPECT_FALSE(interfaceMatches("=eth0", "eth01"));
  EXPECT_FALSE(interfaceMatches("^=eth0", "eth0"));
  EXPECT_TRUE(interfaceMatches("^=eth0", "eth01"));
  SocketAddress a;
  std::string name;
  ASSERT_EQ(findInterface(&name, &a), attnSuccess);
  EXPECT_FALSE(name.empty());
  setenv("ATTN_SOCKET_IFNAME", "=lo", 1);
  ASSERT_EQ(findInterface(&name, &a), attnSuccess);
  EXPECT_EQ(name, "lo");
  EXPECT_TRUE(isLoopback(a));
  setenv("ATTN_SOCKET_IFNAME", "=no_such_if", 1);
  EXPECT_EQ(findInterface(&name, &a), attnInvalidArgument);
  unsetenv("ATTN_SOCKET_IFNAME");
}

class BootstrapRanks : public ::testing::TestWithParam<int> {};

TEST_P(BootstrapRanks, AllGatherSendRecvBarrier) {
  const int n = GetParam();
  attnUniqueId id;
  ASSERT_EQ(bootstrapCreateRoot(&id), attnSuccess);
  runRanks(n, [&](int r) {
    std::unique_ptr<Bootstrap> b;
    ASSERT_EQ(Bootstrap::create(id, r, n, kTimeoutMs, nullptr, &b), attnSuccess)
        << threadLastError();
    EXPECT_EQ(b->rank(), r);
    EXPECT_EQ(b->nranks(), n);
    EXPECT_FALSE(b->localIp().empty());
    exerciseRank(b.get());
  });
}

INSTANTIATE_TEST_SUITE_P(N, BootstrapRanks, ::testing::Values(1, 2, 3, 5));

TEST(Bootstrap, WrongSecretAndSilentClientsAtRoot) {
  attnUniqueId id;
  ASSERT_EQ(bootstrapCreateRoot(&id), attnSuccess);
  UniqueIdData d = decoded(id);
  SocketAddress root = rootAddress(id);

  int silent = dial(root);  // connects, says nothing, stays open
  int liar = dial(root);
  boot::RootHello h{};
  h.magic = boot::kRootHelloMagic;
  h.version = boot::kWireVersion;
  std::memcpy(h.secret, d.secret, 16);
  h.secret[3] ^= 1;
  h.nonce = d.nonce;
  h.rank = 0;
  h.nranks = 3;
  h.addrLen = serializeAddress(root, h.addr);
  uint32_t len = sizeof(h);
  sendRaw(liar, &len, 4);
  sendRaw(liar, &h, sizeof(h));
  EXPECT_TRUE(closedByPeer(liar));

  runRanks(3, [&](int r) {
    std::unique_ptr<Bootstrap> b;
    ASSERT_EQ(Bootstrap::create(id, r, 3, kTimeoutMs, nullptr, &b), attnSuccess)
        << threadLastError();
    exerciseRank(b.get());
  });
  ::close(silent);
  ::close(liar);
}

TEST(Bootstrap, GarbageAndOversizedFramesDropped) {
  attnUniqueId id;
  ASSERT_EQ(bootstrapCreateRoot(&id), attnSuccess);
  UniqueIdData d = decoded(id);
  SocketAddress root = rootAddress(id);

  // To the root: a frame over the bound, and a small frame of junk.
  int big = dial(root);
  uint32_t hugeLen = 1u << 30;
  sendRaw(big, &hugeLen, 4);
  EXPECT_TRUE(closedByPeer(big));
  int junk = dial(root);
  std::vector<uint8_t> noise(200);
  for (size_t i = 0; i < noise.size(); ++i) noise[i] = uint8_t(i * 91 + 7);
  uint32_t len = uint32_t(noise.size());
  sendRaw(junk, &len, 4);
  sendRaw(junk, noise.data(), noise.size());
  EXPECT_TRUE(closedByPeer(junk));

  const int n = 3;
  std::atomic<bool> poked{false};
  SocketAddress rank0;
  runRanks(n, [&](int r) {
    std::unique_ptr<Bootstrap> b;
    ASSERT_EQ(Bootstrap::create(id, r, n, kTimeoutMs, nullptr, &b), attnSuccess)
        << threadLastError();
    if (r == 0) {
      rank0 = static_cast<SocketBootstrap*>(b.get())->listenAddress();
      // To a rank's listener: oversized, junk, and a hello with a bad secret.
      int c1 = dial(rank0);
      sendRaw(c1, &hugeLen, 4);
      EXPECT_TRUE(closedByPeer(c1));
      int c2 = dial(rank0);
      sendRaw(c2, &len, 4);
      sendRaw(c2, noise.data(), noise.size());
      EXPECT_TRUE(closedByPeer(c2));
      int c3 = dial(rank0);
      boot::PeerHello h{};
      h.magic = boot::kPeerHelloMagic;
      h.version = boot::kWireVersion;
      std::memcpy(h.secret, d.secret, 16);
      h.secret[0] ^= 0x80;
      h.nonce = d.nonce;
      h.from = 1;
      h.to = 0;
      uint32_t hl = sizeof(h);
      sendRaw(c3, &hl, 4);
      sendRaw(c3, &h, sizeof(h));
      EXPECT_TRUE(closedByPeer(c3));
      ::close(c1);
      ::close(c2);
      ::close(c3);
      poked = true;
    }
    while (!poked) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    exerciseRank(b.get());
  });
  ::close(big);
  ::close(junk);
}

TEST(Bootstrap, MissingRankTimesOut) {
  attnUniqueId id;
  ASSERT_EQ(bootstrapCreateRoot(&id), attnSuccess);
  const int timeoutMs = 1000;
  runRanks(2, [&](int r) {  // rank 2 of 3 never comes
    auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<Bootstrap> b;
    EXPECT_EQ(Bootstrap::create(id, r, 3, timeoutMs, nullptr, &b), attnTimeout);
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::steady_clock::now() - t0).count();
    EXPECT_GE(ms, timeoutMs - 50);
    EXPECT_LT(ms, timeoutMs + 1000);
    EXPECT_NE(threadLastError().find("waiting"), std::string::npos) << threadLastError();
  });
}

// A child of fork() inherits the parent's roots but not their threads (a
// parent makes the unique id, then forks its ranks). Starting a root there,
// which reaps finished ones, and exiting normally, which stops running ones,
// must not wait for those threads. The parent holds one finished root and
// one still listening when it forks.
TEST(Bootstrap, RootsWorkInAForkedChild) {
  attnUniqueId finished, listening;
  ASSERT_EQ(bootstrapCreateRoot(&finished), attnSuccess);
  {
    std::unique_ptr<Bootstrap> b;
    ASSERT_EQ(Bootstrap::create(finished, 0, 1, kTimeoutMs, nullptr, &b), attnSuccess);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // its thread ends after the reply
  ASSERT_EQ(bootstrapCreateRoot(&listening), attnSuccess);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int rc = 1;
    attnUniqueId id;
    if (bootstrapCreateRoot(&id) == attnSuccess) {
      std::unique_ptr<Bootstrap> b;
      if (Bootstrap::create(id, 0, 1, kTimeoutMs, nullptr, &b) == attnSuccess) rc = 0;
    }
    std::exit(rc);  // static destructors run: the root registry's too
  }
  int status = 0;
  bool exited = false;
  for (int i = 0; i < 200 && !exited; ++i) {
    if (waitpid(pid, &status, WNOHANG) == pid) exited = true;
    else std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!exited) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  ASSERT_TRUE(exited) << "the forked child hung on its parent's root threads";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
}

TEST(Bootstrap, NoRootTimesOut) {
  uint8_t secret[16] = {9};
  int fd = -1;
  SocketAddress any, bound;
  ASSERT_EQ(parseAddress("127.0.0.1:0", &any), attnSuccess);
  ASSERT_EQ(socketListen(any, false, &fd, &bound), attnSuccess);
  ::close(fd);  // a port nobody listens on
  attnUniqueId id;
  ASSERT_EQ(bootstrapIdFor(formatAddress(bound), secret, &id), attnSuccess);
  auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Bootstrap> b;
  EXPECT_EQ(Bootstrap::create(id, 0, 2, 500, nullptr, &b), attnTimeout);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1500));
}

TEST(Bootstrap, DuplicateRankRefused) {
  attnUniqueId id;
  ASSERT_EQ(bootstrapCreateRoot(&id), attnSuccess);
  std::atomic<int> ok{0}, dup{0};
  runRanks(3, [&](int t) {
    int r = t == 2 ? 1 : 0;  // threads 0 and 1 both claim rank 0
    // Rank 1 comes late, so both claims reach the root before it finishes.
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::unique_ptr<Bootstrap> b;
    attnResult_t rc = Bootstrap::create(id, r, 2, kTimeoutMs, nullptr, &b);
    if (rc == attnSuccess) {
      ++ok;
      ASSERT_EQ(b->barrier(), attnSuccess);
    } else {
      EXPECT_EQ(rc, attnInvalidUsage);
      EXPECT_NE(threadLastError().find("twice"), std::string::npos) << threadLastError();
      ++dup;
    }
  });
  EXPECT_EQ(ok.load(), 2);
  EXPECT_EQ(dup.load(), 1);
}

// attnCommInitFromEnv's path: rank 0 starts the root at a given host:port,
// the others derive the same id from (host:port, secret).
void fixedAddressRoot(const char* loopback) {
  int fd = -1;
  SocketAddress any, bound;
  ASSERT_EQ(parseAddress(loopback, &any), attnSuccess);
  ASSERT_EQ(socketListen(any, true, &fd, &bound), attnSuccess);
  ::close(fd);
  std::string hostPort = formatAddress(bound);
  uint8_t secret[16];
  for (int i = 0; i < 16; ++i) secret[i] = uint8_t(0xA0 + i);
  attnUniqueId rootId, otherId;
  ASSERT_EQ(bootstrapCreateRootAt(hostPort, secret, &rootId), attnSuccess) << threadLastError();
  ASSERT_EQ(bootstrapIdFor(hostPort, secret, &otherId), attnSuccess);
  EXPECT_EQ(std::memcmp(&rootId, &otherId, sizeof(rootId)), 0);
  runRanks(3, [&](int r) {
    std::unique_ptr<Bootstrap> b;
    ASSERT_EQ(Bootstrap::create(r == 0 ? rootId : otherId, r, 3, kTimeoutMs, nullptr, &b),
              attnSuccess) << threadLastError();
    exerciseRank(b.get());
  });
}

TEST(Bootstrap, FixedAddressRootIPv4) { fixedAddressRoot("127.0.0.1:0"); }

TEST(Bootstrap, FixedAddressRootIPv6) {
  int probe = socket(AF_INET6, SOCK_STREAM, 0);
  if (probe < 0) GTEST_SKIP() << "no IPv6 on this host";
  ::close(probe);
  fixedAddressRoot("[::1]:0");
}

TEST(Bootstrap, AbortAndCloseUnblock) {
  attnUniqueId id;
  ASSERT_EQ(bootstrapCreateRoot(&id), attnSuccess);
  std::atomic<bool> abortFlag{false};
  std::vector<std::unique_ptr<Bootstrap>> bs(2);
  runRanks(2, [&](int r) {
    ASSERT_EQ(Bootstrap::create(id, r, 2, 0 /*forever*/, &abortFlag, &bs[r]), attnSuccess);
  });
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    abortFlag = true;
  });
  int x;
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(bs[0]->recv(1, 42, &x, sizeof(x)), attnRemoteError);
  EXPECT_NE(threadLastError().find("aborted"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  aborter.join();
  abortFlag = false;

  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    bs[1]->close();
  });
  EXPECT_EQ(bs[1]->recv(0, 43, &x, sizeof(x)), attnRemoteError);
  closer.join();
}

TEST(Bootstrap, PeerGoneFailsFast) {
  attnUniqueId id;
  ASSERT_EQ(bootstrapCreateRoot(&id), attnSuccess);
  std::vector<std::unique_ptr<Bootstrap>> bs(2);
  runRanks(2, [&](int r) {
    ASSERT_EQ(Bootstrap::create(id, r, 2, kTimeoutMs, nullptr, &bs[r]), attnSuccess);
  });
  int v = 7, got = 0;
  ASSERT_EQ(bs[1]->send(0, 1, &v, sizeof(v)), attnSuccess);
  bs[1].reset();  // rank 1 goes away
  ASSERT_EQ(bs[0]->recv(1, 1, &got, sizeof(got)), attnSuccess);  // buffered before the close
  EXPECT_EQ(got, 7);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(bs[0]->recv(1, 2, &got, sizeof(got)), attnRemoteError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_NE(threadLastError().find("peer 1"), std::string::npos) << threadLastError();
}

TEST(Bootstrap, SizeMismatchIsUsageError) {
  attnUniqueId id;
  ASSERT_EQ(bootstrapCreateRoot(&id), attnSuccess);
  std::vector<std::unique_ptr<Bootstrap>> bs(2);
  runRanks(2, [&](int r) {
    ASSERT_EQ(Bootstrap::create(id, r, 2, kTimeoutMs, nullptr, &bs[r]), attnSuccess);
  });
  int64_t v = 1;
  int32_t small = 0;
  ASSERT_EQ(bs[0]->send(1, 5, &v, sizeof(v)), attnSuccess);
  EXPECT_EQ(bs[1]->recv(0, 5, &small, sizeof(small)), attnInvalidUsage);
}

}  // namespace
}  // namespace attn
