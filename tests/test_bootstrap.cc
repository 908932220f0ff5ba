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
#include <climits>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "src/core/auth.h"
#include "src/core/bootstrap.h"
#include "src/core/bootstrap_socket.h"
#include "src/core/bootstrap_wire.h"
#include "src/core/error.h"
#include "src/core/socket.h"
#include "tests/support/handshake_clients.h"

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
  // A client that goes through the handshake with one bit of the secret
  // wrong: challenged, then dropped without a reply.
  int liar = dial(root);
  uint8_t wrong[16];
  std::memcpy(wrong, d.secret, 16);
  wrong[3] ^= 1;
  const testing::RootExchange x = testing::rootHandshake(liar, wrong, d.nonce, 0, 3, root);
  EXPECT_TRUE(x.challenged);
  EXPECT_FALSE(x.replied) << "the root answered a client that does not know the secret";
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
      uint8_t wrong[16];
      std::memcpy(wrong, d.secret, 16);
      wrong[0] ^= 0x80;
      EXPECT_EQ(testing::peerHandshake(c3, wrong, d.nonce, 1, 0), -1);
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

// ---------------------------------------------------------------------------
// Issue 44: the secret never travels, a rank's identity is bound to its first
// authenticated connection, a peer's queue and a root's tables are bounded.

// What a rank sends when it dials a peer: the peer went away and the test
// listens on its port, answering the hello with a challenge.
TEST(BootstrapAuth, SecretNeverSentToAPeerListener) {
  attnUniqueId id;
  ASSERT_EQ(bootstrapCreateRoot(&id), attnSuccess);
  const UniqueIdData d = decoded(id);
  std::vector<std::unique_ptr<Bootstrap>> bs(2);
  runRanks(2, [&](int r) {
    ASSERT_EQ(Bootstrap::create(id, r, 2, 4000, nullptr, &bs[r]), attnSuccess) << threadLastError();
  });
  const SocketAddress peer1 = static_cast<SocketBootstrap*>(bs[1].get())->listenAddress();
  bs[1].reset();
  int lfd = -1;
  SocketAddress bound;
  ASSERT_EQ(socketListen(peer1, true, &lfd, &bound), attnSuccess);
  std::thread sender([&] {
    int v = 1;
    bs[0]->send(1, 9, &v, sizeof(v));
  });
  const std::vector<uint8_t> got =
      testing::captureConnections(lfd, 1500, testing::challengeBody(boot::kPeerChallengeMagic));
  sender.join();
  ::close(lfd);
  EXPECT_GE(got.size(), 4 + sizeof(boot::PeerHello)) << "rank 0 sent nothing to capture";
  EXPECT_FALSE(testing::containsBytes(got, d.secret, 16))
      << "the secret's 16 bytes are in what rank 0 sent to a peer's port";
}

// A holder of the secret that claims rank 1 at rank 0 while the real rank
// 1's connection is open (same address) or from another address is
// refused, and the real rank 1 is neither marked gone nor disturbed.
TEST(BootstrapAuth, ClaimingABoundRankIsRefused) {
  setenv("ATTN_SOCKET_IFNAME", "=lo", 1);  // ranks on 127.0.0.1: 127.0.0.2 is "elsewhere"
  attnUniqueId id;
  ASSERT_EQ(bootstrapCreateRoot(&id), attnSuccess);
  const UniqueIdData d = decoded(id);
  const int n = 3;
  std::vector<std::unique_ptr<Bootstrap>> bs(n);
  runRanks(n, [&](int r) {
    ASSERT_EQ(Bootstrap::create(id, r, n, kTimeoutMs, nullptr, &bs[r]), attnSuccess)
        << threadLastError();
  });
  unsetenv("ATTN_SOCKET_IFNAME");
  // Rank 1 authenticates at rank 0: rank 1 is bound to 127.0.0.1 there.
  int v = 11, got = 0;
  ASSERT_EQ(bs[1]->send(0, 1, &v, sizeof(v)), attnSuccess) << threadLastError();
  ASSERT_EQ(bs[0]->recv(1, 1, &got, sizeof(got)), attnSuccess) << threadLastError();
  const SocketAddress rank0 = static_cast<SocketBootstrap*>(bs[0].get())->listenAddress();
  ASSERT_TRUE(isLoopback(rank0)) << formatAddress(rank0);

  const int same = testing::dialFrom(rank0);
  ASSERT_GE(same, 0);
  EXPECT_EQ(testing::peerHandshake(same, d.secret, d.nonce, 1, 0), boot::kPeerBusy);
  ::close(same);
  const int elsewhere = testing::dialFrom(rank0, "127.0.0.2");
  ASSERT_GE(elsewhere, 0);
  EXPECT_EQ(testing::peerHandshake(elsewhere, d.secret, d.nonce, 1, 0), boot::kPeerRefused);
  ::close(elsewhere);

  // Rank 0 waits for rank 1 (not marked gone by the claimants' closing);
  // rank 1 sends once rank 0 waits.
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    int w = 12;
    EXPECT_EQ(bs[1]->send(0, 2, &w, sizeof(w)), attnSuccess) << threadLastError();
  });
  EXPECT_EQ(bs[0]->recv(1, 2, &got, sizeof(got)), attnSuccess) << threadLastError();
  EXPECT_EQ(got, 12);
  later.join();
  runRanks(n, [&](int r) { exerciseRank(bs[r].get()); });
}

// Rank 1 sends frames rank 0 never reads: past the bound rank 0 cuts its
// connection (rank 1's sends fail), and rank 0's waits for rank 1 fail at
// once naming it, not at the timeout.
void floodAndCheckCutOff(size_t frameBytes, size_t maxFrames) {
  attnUniqueId id;
  ASSERT_EQ(bootstrapCreateRoot(&id), attnSuccess);
  std::vector<std::unique_ptr<Bootstrap>> bs(2);
  runRanks(2, [&](int r) {
    ASSERT_EQ(Bootstrap::create(id, r, 2, kTimeoutMs, nullptr, &bs[r]), attnSuccess)
        << threadLastError();
  });
  std::vector<uint8_t> payload(frameBytes, 0x5a);
  attnResult_t last = attnSuccess;
  size_t sent = 0;
  for (; sent < maxFrames && last == attnSuccess; ++sent)
    last = bs[1]->send(0, 7, payload.data(), payload.size());
  // Sends only fill rank 1's socket: on a loaded machine rank 0's receive
  // thread may cut the connection after the flood has already been
  // written. Then later sends must fail, soon.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (last == attnSuccess && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    last = bs[1]->send(0, 7, payload.data(), payload.size());
    ++sent;
  }
  EXPECT_NE(last, attnSuccess) << "rank 0 took " << sent << " unread frames of " << frameBytes
                               << " bytes from rank 1";
  int x = 0;
  EXPECT_EQ(bs[0]->recv(1, 8, &x, sizeof(x)), attnRemoteError) << threadLastError();
  EXPECT_NE(threadLastError().find("peer 1"), std::string::npos) << threadLastError();
  EXPECT_NE(threadLastError().find("cut off"), std::string::npos) << threadLastError();
  // What had been queued is still there for rank 0 to read.
  ASSERT_EQ(bs[0]->recv(1, 7, payload.data(), payload.size()), attnSuccess) << threadLastError();
}

TEST(BootstrapAuth, PeerQueueingTooManyFramesIsCutOff) {
  floodAndCheckCutOff(0, boot::kMaxQueuedFrames + 100000);
}

TEST(BootstrapAuth, PeerQueueingTooManyBytesIsCutOff) {
  floodAndCheckCutOff(boot::kMaxDataFrame, boot::kMaxQueuedBytes / boot::kMaxDataFrame + 1000);
}

TEST(BootstrapAuth, DataFrameBoundIsEnforcedAtTheSender) {
  attnUniqueId id;
  ASSERT_EQ(bootstrapCreateRoot(&id), attnSuccess);
  std::vector<std::unique_ptr<Bootstrap>> bs(2);
  runRanks(2, [&](int r) {
    ASSERT_EQ(Bootstrap::create(id, r, 2, kTimeoutMs, nullptr, &bs[r]), attnSuccess);
  });
  std::vector<uint8_t> big(boot::kMaxDataFrame + 1);
  EXPECT_EQ(bs[1]->send(0, 3, big.data(), big.size()), attnInvalidArgument);
  big.resize(boot::kMaxDataFrame);
  ASSERT_EQ(bs[1]->send(0, 3, big.data(), big.size()), attnSuccess) << threadLastError();
  ASSERT_EQ(bs[0]->recv(1, 3, big.data(), big.size()), attnSuccess) << threadLastError();
}

// A client with the secret that claims nranks = INT32_MAX, kMaxRanks + 1, 0
// or -5 gets a signed refusal; the root (and the process) lives on and
// serves the real ranks. A rank asked for such a size refuses before dialling.
TEST(BootstrapAuth, RootRefusesOutOfRangeNranks) {
  attnUniqueId id;
  ASSERT_EQ(bootstrapCreateRoot(&id), attnSuccess);
  const UniqueIdData d = decoded(id);
  const SocketAddress root = rootAddress(id);
  for (int nranks : {INT32_MAX, boot::kMaxRanks + 1, 0, -5}) {
    const int fd = dial(root);
    const testing::RootExchange x = testing::rootHandshake(fd, d.secret, d.nonce, 0, nranks, root);
    ::close(fd);
    ASSERT_TRUE(x.replied) << "nranks " << nranks << ": no reply from the root";
    boot::RootAnswer a;
    ASSERT_EQ(boot::parseRootReply(x.reply.data(), x.reply.size(), d.secret, x.hello, x.rootNonce, &a),
              boot::ReplyCheck::kOk);
    EXPECT_EQ(a.status, boot::kRootBadSize) << "nranks " << nranks;
  }
  std::unique_ptr<Bootstrap> b;
  EXPECT_EQ(Bootstrap::create(id, 0, INT32_MAX, 1000, nullptr, &b), attnInvalidArgument);
  EXPECT_NE(threadLastError().find("nranks"), std::string::npos) << threadLastError();
  runRanks(2, [&](int r) {
    std::unique_ptr<Bootstrap> rb;
    ASSERT_EQ(Bootstrap::create(id, r, 2, kTimeoutMs, nullptr, &rb), attnSuccess)
        << threadLastError();
    exerciseRank(rb.get());
  });
}

// The handshake parsers refuse what they should, whatever the bytes.
TEST(BootstrapAuth, ParsersRefuseForgedAndMalformedFrames) {
  uint8_t secret[16], other[16];
  for (int i = 0; i < 16; ++i) secret[i] = uint8_t(i), other[i] = uint8_t(i);
  other[15] ^= 1;
  auth::Nonce a, b;
  ASSERT_EQ(auth::freshNonce(&a), attnSuccess);
  ASSERT_EQ(auth::freshNonce(&b), attnSuccess);
  SocketAddress listen;
  ASSERT_EQ(parseAddress("127.0.0.1:4000", &listen), attnSuccess);
  const boot::RootHello h = boot::makeRootHello(77, 1, 2, 0, listen, a);
  boot::RootHello parsed;
  EXPECT_TRUE(boot::parseRootHello(reinterpret_cast<const uint8_t*>(&h), sizeof(h), 77, &parsed));
  EXPECT_FALSE(boot::parseRootHello(reinterpret_cast<const uint8_t*>(&h), sizeof(h), 78, &parsed));
  EXPECT_FALSE(boot::parseRootHello(reinterpret_cast<const uint8_t*>(&h), sizeof(h) - 1, 77, &parsed));
  EXPECT_FALSE(boot::parseRootHello(nullptr, 0, 77, &parsed));

  const boot::Proof p = boot::makeRootProof(secret, h, b);
  const auto* pb = reinterpret_cast<const uint8_t*>(&p);
  EXPECT_TRUE(boot::checkRootProof(pb, sizeof(p), secret, h, b));
  EXPECT_FALSE(boot::checkRootProof(pb, sizeof(p), other, h, b));  // wrong secret
  EXPECT_FALSE(boot::checkRootProof(pb, sizeof(p), secret, h, a));  // another challenge
  boot::RootHello h2 = h;
  h2.rank = 0;  // another claim
  EXPECT_FALSE(boot::checkRootProof(pb, sizeof(p), secret, h2, b));

  std::vector<boot::AddrSlot> table(2);
  for (auto& s : table) s.len = serializeAddress(listen, s.addr);
  boot::RootReplyBuilder builder(boot::kRootOk, 2, 2, &table);
  std::vector<uint8_t> reply = builder.signFor(secret, h, b);
  boot::RootAnswer ans;
  EXPECT_EQ(boot::parseRootReply(reply.data(), reply.size(), secret, h, b, &ans), boot::ReplyCheck::kOk);
  EXPECT_EQ(ans.addrs.size(), 2u);
  EXPECT_EQ(boot::parseRootReply(reply.data(), reply.size(), other, h, b, &ans), boot::ReplyCheck::kForged);
  EXPECT_EQ(boot::parseRootReply(reply.data(), reply.size(), secret, h, a, &ans), boot::ReplyCheck::kForged);
  reply[sizeof(boot::RootReply) + 10] ^= 1;  // one byte of the table
  EXPECT_EQ(boot::parseRootReply(reply.data(), reply.size(), secret, h, b, &ans), boot::ReplyCheck::kForged);
  EXPECT_EQ(boot::parseRootReply(reply.data(), 3, secret, h, b, &ans), boot::ReplyCheck::kMalformed);

  const boot::PeerHello ph = boot::makePeerHello(77, 1, 0, a);
  boot::PeerHello pp;
  const auto* phb = reinterpret_cast<const uint8_t*>(&ph);
  EXPECT_TRUE(boot::parsePeerHello(phb, sizeof(ph), 77, 0, 2, &pp));
  EXPECT_FALSE(boot::parsePeerHello(phb, sizeof(ph), 77, 1, 2, &pp));  // not to us
  EXPECT_FALSE(boot::parsePeerHello(phb, sizeof(ph), 77, 0, 1, &pp));  // from outside nranks
  const boot::PeerAck ack = boot::makePeerAck(secret, ph, b, boot::kPeerOk);
  boot::PeerAck forged = ack;
  forged.status = boot::kPeerRefused;  // status not covered by this signature
  int32_t st = -1;
  EXPECT_TRUE(boot::parsePeerAck(reinterpret_cast<const uint8_t*>(&ack), sizeof(ack), secret, ph, b, &st));
  EXPECT_EQ(st, boot::kPeerOk);
  EXPECT_FALSE(boot::parsePeerAck(reinterpret_cast<const uint8_t*>(&forged), sizeof(forged), secret, ph, b, &st));
  EXPECT_FALSE(boot::parsePeerAck(reinterpret_cast<const uint8_t*>(&ack), sizeof(ack), other, ph, b, &st));
}

}  // namespace
}  // namespace attn
