// The unique id is a credential: a rank without the secret is refused, and
// hostile clients (garbage, oversized frames, wrong-secret hellos, silent
// connections) at the bootstrap root or at the ranks' own listeners do not
// stop the legitimate ranks from completing with exact results.
//
// The id layout and wire formats come from src/core/bootstrap.h,
// src/core/bootstrap_wire.h and src/core/unique_id.cc.
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "attncomm.h"
#include "src/core/bootstrap.h"
#include "src/core/bootstrap_wire.h"
#include "src/core/error.h"
#include "src/core/socket.h"
#include "src/core/transport.h"
#include "transports/tcp/tcp_handshake.h"
#include "tests/support/fake_bootstrap.h"
#include "tests/support/handshake_clients.h"
#include "tests/support/multirank.h"
#include "transports/tcp/tcp_transport.h"

using namespace attn_test;

namespace {

attn::UniqueIdData Decode(const attnUniqueId& id) {
  attn::UniqueIdData d;
  EXPECT_EQ(attn::decodeUniqueId(id, &d), attnSuccess) << attnGetLastError(nullptr);
  return d;
}

attnUniqueId Encode(const attn::UniqueIdData& d) {
  attnUniqueId id;
  EXPECT_EQ(attn::encodeUniqueId(d, &id), attnSuccess);
  return id;
}

// The legitimate ranks: init with `id`, then exact collectives.
void LegitRanksComplete(int n, const attnUniqueId& id, int timeoutMs = 20000) {
  RunThreadsRaw(n, [&](int rank) {
    attnConfig_t cfg = ConfigWithTimeout(timeoutMs);
    attnComm_t comm = nullptr;
    const attnResult_t r = attnCommInitRankConfig(&comm, n, id, rank, &cfg);
    ASSERT_EQ(r, attnSuccess) << "legitimate rank " << rank << ": " << ResultName(r) << ": "
                              << attnGetLastError(nullptr);
    CheckAllReduce(comm, rank, n, attnFloat32, attnSum, 4099, false);
    CheckAllGather(comm, rank, n, attnInt8, 100, false);
    EXPECT_EQ(attnCommDestroy(comm), attnSuccess);
  }, 60000);
}

// A TCP connection to `addr` (blocking, TCP_NODELAY); -1 on failure.
int Dial(const attn::SocketAddress& addr) {
  const int fd = socket(addr.family(), SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (connect(fd, addr.sa(), addr.len) != 0) {
    close(fd);
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

void SendRaw(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
    if (w <= 0) return;  // the server may already have dropped us
    c += w;
    n -= size_t(w);
  }
}

void SendFrame(int fd, const void* body, uint32_t len, uint32_t claimedLen) {
  SendRaw(fd, &claimedLen, 4);
  SendRaw(fd, body, len);
}

// True when the server closed the connection within `ms` (EOF or reset),
// without sending anything first when `expectSilence`.
bool ClosedByPeer(int fd, int ms, bool expectSilence, std::string* why) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  size_t got = 0;
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    const ssize_t r = recv(fd, buf, sizeof(buf), 0);
    if (r == 0 || (r < 0 && (errno == ECONNRESET || errno == EPIPE))) {
      if (expectSilence && got > 0) {
        *why = "the server sent " + std::to_string(got) + " bytes to an unauthenticated client";
        return false;
      }
      return true;
    }
    if (r > 0) got += size_t(r);
  }
  *why = "connection still open after " + std::to_string(ms) + " ms";
  return false;
}

attn::SocketAddress RootAddress(const attnUniqueId& id) {
  const attn::UniqueIdData d = Decode(id);
  attn::SocketAddress a;
  EXPECT_TRUE(attn::deserializeAddress(d.address, d.addressLen, &a));
  return a;
}

// ---------------------------------------------------------------------------
// The id

TEST(UniqueId, FreshSecretAndNonceEachTime) {
  attnUniqueId a, b;
  ASSERT_EQ(attnGetUniqueId(&a), attnSuccess);
  ASSERT_EQ(attnGetUniqueId(&b), attnSuccess);
  const auto da = Decode(a), db = Decode(b);
  EXPECT_EQ(da.magic, attn::boot::kIdMagic);
  EXPECT_NE(std::memcmp(da.secret, db.secret, 16), 0) << "two ids share a secret";
  EXPECT_NE(da.nonce, db.nonce);
  const uint8_t zero[16] = {};
  EXPECT_NE(std::memcmp(da.secret, zero, 16), 0);
}

TEST(UniqueId, CorruptedIdIsRejectedWithoutDialling) {
  attnUniqueId good;
  ASSERT_EQ(attnGetUniqueId(&good), attnSuccess);
  for (size_t off : {size_t(0), size_t(5), size_t(8), size_t(20), size_t(30), size_t(40),
                     size_t(101), size_t(127)}) {
    attnUniqueId bad = good;
    bad.internal[off] ^= 0x40;
    attnComm_t comm = reinterpret_cast<attnComm_t>(0x1);
    attnConfig_t cfg = ConfigWithTimeout(2000);
    const attnResult_t r = attnCommInitRankConfig(&comm, 2, bad, 0, &cfg);
    EXPECT_EQ(r, attnInvalidArgument) << "byte " << off << " flipped: " << ResultName(r);
    EXPECT_EQ(comm, nullptr);
    EXPECT_NE(std::string(attnGetLastError(nullptr)).find("unique id"), std::string::npos)
        << attnGetLastError(nullptr);
  }
}

// ---------------------------------------------------------------------------
// A rank with a wrong secret (a well-formed id otherwise) is refused, and
// the legitimate ranks complete.

TEST(WrongSecret, ImpostorBeforeLegitRanksIsRefused) {
  attnUniqueId id;
  ASSERT_EQ(attnGetUniqueId(&id), attnSuccess);
  attn::UniqueIdData forged = Decode(id);
  for (int i = 0; i < 16; i += 3) forged.secret[i] ^= 0xff;
  const attnUniqueId bad = Encode(forged);
  for (int claim : {0, 1}) {
    attnConfig_t cfg = ConfigWithTimeout(3000);
    attnComm_t comm = nullptr;
    std::atomic<attnResult_t> r{attnSuccess};
    RunThreadsRaw(1, [&](int) { r = attnCommInitRankConfig(&comm, 2, bad, claim, &cfg); }, 60000);
    EXPECT_NE(r.load(), attnSuccess) << "impostor claiming rank " << claim << " was accepted";
    EXPECT_EQ(comm, nullptr);
  }
  LegitRanksComplete(2, id);
}

TEST(WrongSecret, ImpostorRacingLegitRanksIsRefused) {
  attnUniqueId id;
  ASSERT_EQ(attnGetUniqueId(&id), attnSuccess);
  attn::UniqueIdData forged = Decode(id);
  forged.secret[15] ^= 1;  // one bit
  const attnUniqueId bad = Encode(forged);
  std::atomic<attnResult_t> impostor{attnSuccess};
  std::thread t([&] {
    attnConfig_t cfg = ConfigWithTimeout(3000);
    attnComm_t comm = nullptr;
    impostor = attnCommInitRankConfig(&comm, 3, bad, 1, &cfg);
    if (comm) attnCommAbort(comm);
  });
  LegitRanksComplete(3, id);
  t.join();
  EXPECT_NE(impostor.load(), attnSuccess);
}

// The right secret with another communicator's nonce is not this one.
TEST(WrongSecret, ForeignNonceIsRefused) {
  attnUniqueId id;
  ASSERT_EQ(attnGetUniqueId(&id), attnSuccess);
  attn::UniqueIdData forged = Decode(id);
  forged.nonce ^= 0x1234;
  const attnUniqueId bad = Encode(forged);
  attnConfig_t cfg = ConfigWithTimeout(3000);
  attnComm_t comm = nullptr;
  std::atomic<attnResult_t> r{attnSuccess};
  RunThreadsRaw(1, [&](int) { r = attnCommInitRankConfig(&comm, 2, bad, 0, &cfg); }, 60000);
  EXPECT_NE(r.load(), attnSuccess);
  LegitRanksComplete(2, id);
}

// ATTN_SECRET differing between launched ranks: refused, nobody hangs.
TEST(WrongSecret, MismatchedEnvSecretFailsInit) {
  const int port = FindFreePort();
  ASSERT_GT(port, 0);
  RunOptions opts;
  opts.deadline_ms = 60000;
  opts.child_setup = [&](int rank) {
    for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK",
                          "OMPI_COMM_WORLD_SIZE"})
      unsetenv(v);
    setenv("ATTN_RANK", std::to_string(rank).c_str(), 1);
    setenv("ATTN_NRANKS", "2", 1);
    setenv("ATTN_ROOT", ("127.0.0.1:" + std::to_string(port)).c_str(), 1);
    setenv("ATTN_SECRET", rank == 0 ? "0123456789abcdef0123456789abcdef"
                                    : "0123456789abcdef0123456789abcdee", 1);
  };
  auto results = ForkRanks(2, [&](int rank, const attnUniqueId&) {
    attnConfig_t cfg = ConfigWithTimeout(3000);
    attnComm_t comm = nullptr;
    const attnResult_t r = attnCommInitFromEnv(&comm, &cfg);
    EXPECT_NE(r, attnSuccess) << "rank " << rank << " joined despite a different secret";
    EXPECT_EQ(comm, nullptr);
    EXPECT_STRNE(attnGetLastError(nullptr), "");
  }, opts);
  ExpectAllPassed(results);
}

// ---------------------------------------------------------------------------
// Hostile clients at the bootstrap root.

TEST(HostileRoot, GarbageOversizedAndWrongSecretClientsAreDropped) {
  attnUniqueId id;
  ASSERT_EQ(attnGetUniqueId(&id), attnSuccess);
  const attn::SocketAddress root = RootAddress(id);
  const attn::UniqueIdData d = Decode(id);

  struct Attack {
    const char* what;
    int fd;
    bool mustClose;
  };
  std::vector<Attack> attacks;
  auto dial = [&](const char* what, bool mustClose) -> int {
    const int fd = Dial(root);
    EXPECT_GE(fd, 0) << what << ": cannot connect to the root";
    attacks.push_back({what, fd, mustClose});
    return fd;
  };

  // Not a frame at all.
  {
    const int fd = dial("HTTP request", true);
    const char req[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    SendRaw(fd, req, sizeof(req) - 1);
  }
  // Length prefix 4 GiB - 1.
  {
    const int fd = dial("4 GiB frame", true);
    const uint32_t len = 0xffffffffu;
    SendRaw(fd, &len, 4);
    std::vector<char> junk(8192, 'x');
    SendRaw(fd, junk.data(), junk.size());
  }
  // Just above the unauthenticated bound.
  {
    const int fd = dial("64 KiB + 1 frame", true);
    std::vector<char> junk(attn::boot::kMaxUnauthFrame + 1, 'y');
    SendFrame(fd, junk.data(), uint32_t(junk.size()), uint32_t(junk.size()));
  }
  // Right size, random body.
  {
    const int fd = dial("random hello", true);
    std::vector<uint8_t> junk(sizeof(attn::boot::RootHello));
    for (size_t i = 0; i < junk.size(); ++i) junk[i] = uint8_t(i * 131 + 7);
    SendFrame(fd, junk.data(), uint32_t(junk.size()), uint32_t(junk.size()));
  }
  // A well-formed hello claiming rank 0 of 3, then a proof made with a
  // wrong secret: challenged, then dropped without a reply.
  {
    const int fd = Dial(root);
    ASSERT_GE(fd, 0);
    uint8_t wrong[16];
    std::memcpy(wrong, d.secret, 16);
    wrong[0] ^= 0x80;
    const attn::testing::RootExchange x =
        attn::testing::rootHandshake(fd, wrong, d.nonce, 0, 3, root);
    EXPECT_TRUE(x.challenged);
    EXPECT_FALSE(x.replied) << "the root answered a client with a wrong secret";
    close(fd);
  }
  // A hello claiming a huge communicator with a wrong secret.
  {
    const int fd = dial("wrong-secret hello, nranks 1e6", true);
    attn::boot::RootHello h{};
    h.magic = attn::boot::kRootHelloMagic;
    h.version = attn::boot::kWireVersion;
    h.rank = 5;
    h.nranks = 1000000;
    SendFrame(fd, &h, sizeof(h), sizeof(h));
  }
  // Half a frame, then silence; and a silent connection.
  {
    const int fd = dial("partial frame", false);
    const uint32_t len = 100;
    SendRaw(fd, &len, 4);
    SendRaw(fd, "0123456789", 10);
  }
  dial("silent", false);

  LegitRanksComplete(3, id);

  for (auto& a : attacks) {
    if (a.fd < 0) continue;
    if (a.mustClose) {
      std::string why;
      EXPECT_TRUE(ClosedByPeer(a.fd, 10000, true, &why)) << a.what << ": " << why;
    }
    close(a.fd);
  }
}

// More silent connections than the root keeps pending: the real ranks must
// still get in (a silent client must not lock them out).
TEST(HostileRoot, FloodOfSilentConnectionsDoesNotLockOutRanks) {
  attnUniqueId id;
  ASSERT_EQ(attnGetUniqueId(&id), attnSuccess);
  const attn::SocketAddress root = RootAddress(id);
  std::vector<int> fds;
  for (size_t i = 0; i < attn::boot::kMaxPendingConns + 44; ++i) {
    const int fd = Dial(root);
    if (fd >= 0) fds.push_back(fd);
  }
  EXPECT_GE(fds.size(), attn::boot::kMaxPendingConns);
  LegitRanksComplete(2, id, 10000);
  for (int fd : fds) close(fd);
}

// ---------------------------------------------------------------------------
// Hostile clients at the ranks' own listeners (bootstrap peer sockets, tcp
// transport), after the communicator is up: the ranks keep working.

// IPv4 "ip:port" addresses this process listens on.
std::set<std::string> OwnListeningAddresses() {
  std::set<std::string> inodes;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(dir)) {
      char link[256] = {};
      const std::string p = std::string("/proc/self/fd/") + e->d_name;
      const ssize_t n = readlink(p.c_str(), link, sizeof(link) - 1);
      if (n > 0 && std::strncmp(link, "socket:[", 8) == 0)
        inodes.insert(std::string(link + 8, link + n - 1));
    }
    closedir(dir);
  }
  std::set<std::string> addrs;
  for (const char* table : {"/proc/self/net/tcp"}) {
    std::ifstream f(table);
    std::string line;
    std::getline(f, line);
    while (std::getline(f, line)) {
      std::istringstream is(line);
      std::string sl, local, remote, st, q, tr, rt, uid, to, inode;
      is >> sl >> local >> remote >> st >> q >> tr >> rt >> uid >> to >> inode;
      if (st != "0A" || !inodes.count(inode)) continue;  // 0A = LISTEN
      const size_t colon = local.find(':');
      in_addr ip{};
      ip.s_addr = uint32_t(std::stoul(local.substr(0, colon), nullptr, 16));
      char text[INET_ADDRSTRLEN] = {};
      inet_ntop(AF_INET, &ip, text, sizeof(text));
      const int port = std::stoi(local.substr(colon + 1), nullptr, 16);
      addrs.insert(std::string(ip.s_addr == 0 ? "127.0.0.1" : text) + ":" + std::to_string(port));
    }
  }
  return addrs;
}

TEST(HostilePeers, GarbageAtRankListenersDoesNotDisturbRanks) {
  const int n = 3;
  RunOptions opts;
  opts.env = {{"ATTN_TRANSPORT", "tcp"}};
  std::vector<attnComm_t> comms(n);
  {
    ScopedEnv env(opts.env);
    ATTN_ASSERT_OK(nullptr, attnCommInitAll(comms.data(), n, nullptr));
  }
  const std::set<std::string> ports = OwnListeningAddresses();
  std::vector<int> fds;
  for (const std::string& where : ports) {
    for (int kind = 0; kind < 4; ++kind) {
      attn::SocketAddress a;
      if (attn::parseAddress(where, &a) != attnSuccess) continue;
      const int fd = Dial(a);
      if (fd < 0) continue;
      fds.push_back(fd);
      if (kind == 0) {
        const uint32_t len = 0xfffffff0u;
        SendRaw(fd, &len, 4);
      } else if (kind == 1) {
        attn::boot::PeerHello h{};
        h.magic = attn::boot::kPeerHelloMagic;
        h.version = attn::boot::kWireVersion;
        h.from = 1;
        h.to = 0;
        SendFrame(fd, &h, sizeof(h), sizeof(h));
      } else if (kind == 2) {
        std::vector<uint8_t> junk(200000);
        for (size_t i = 0; i < junk.size(); ++i) junk[i] = uint8_t(i * 17);
        SendRaw(fd, junk.data(), junk.size());
      }  // kind 3: silent
    }
  }
  EXPECT_GE(fds.size(), 4u) << "found no listener of the ranks to attack";
  ReportFromChild("attacked " + std::to_string(ports.size()) + " listening port(s) with " +
                  std::to_string(fds.size()) + " connections");
  RunThreadsRaw(n, [&](int rank) {
    for (int i = 0; i < 3; ++i) {
      CheckAllReduce(comms[rank], rank, n, attnFloat64, attnSum, 65537, false);
      CheckAllToAllv(comms[rank], rank, n, attnInt32, 101);
      CheckRingExchange(comms[rank], rank, n, attnFloat32, 1000);
    }
    EXPECT_EQ(attnCommDestroy(comms[rank]), attnSuccess);
  }, 120000);
  for (int fd : fds) close(fd);
}

// ---------------------------------------------------------------------------
// The secret never travels (issue 44): what a rank sends to a listener that
// is not its root, and what the TCP transport sends to a peer's listener.

TEST(SecretOnTheWire, NotSentToAListenerThatIsNotTheRoot) {
  int lfd = -1;
  attn::SocketAddress any, bound;
  ASSERT_EQ(attn::parseAddress("127.0.0.1:0", &any), attnSuccess);
  ASSERT_EQ(attn::socketListen(any, false, &lfd, &bound), attnSuccess);
  uint8_t secret[16];
  for (int i = 0; i < 16; ++i) secret[i] = uint8_t(0xC0 + i);
  attnUniqueId id;
  ASSERT_EQ(attn::bootstrapIdFor(attn::formatAddress(bound), secret, &id), attnSuccess);
  std::thread rank([&] {
    std::unique_ptr<attn::Bootstrap> b;
    EXPECT_NE(attn::Bootstrap::create(id, 0, 2, 2500, nullptr, &b), attnSuccess);
  });
  // The listener answers the hello with a challenge, so the rank's proof
  // is captured too.
  const std::vector<uint8_t> got = attn::testing::captureConnections(
      lfd, 1500, attn::testing::challengeBody(attn::boot::kRootChallengeMagic));
  close(lfd);
  rank.join();
  EXPECT_GE(got.size(), 4 + sizeof(attn::boot::RootHello)) << "the rank sent nothing to capture";
  EXPECT_FALSE(attn::testing::containsBytes(got, secret, 16))
      << "the secret's 16 bytes are in what the rank sent to a stranger";
}

TEST(SecretOnTheWire, NotSentByTheTcpTransport) {
  // Rank 0 is real; "rank 1" publishes the test's listener as its TCP
  // address, so rank 0 (the lower rank) dials it.
  attn::testing::FakeBootstrapHub hub(2);
  int lfd = -1;
  attn::SocketAddress any, bound;
  ASSERT_EQ(attn::parseAddress("127.0.0.1:0", &any), attnSuccess);
  ASSERT_EQ(attn::socketListen(any, false, &lfd, &bound), attnSuccess);
  std::thread fakePeer([&] {
    attn::testing::FakeBootstrap b(&hub, 1);
    constexpr size_t kSlot = 4 + attn::kAddressBytes + 4;  // tcp_setup.cc's RankSlot
    std::vector<uint8_t> slots(2 * kSlot, 0);
    const uint32_t len = attn::serializeAddress(bound, slots.data() + kSlot + 4);
    const int32_t nsocks = 1;
    std::memcpy(slots.data() + kSlot, &len, 4);
    std::memcpy(slots.data() + kSlot + 4 + attn::kAddressBytes, &nsocks, 4);
    EXPECT_EQ(b.allGather(slots.data(), kSlot), attnSuccess);
  });
  std::atomic<attnResult_t> rc{attnSuccess};
  std::thread rank0([&] {
    attn::testing::FakeBootstrap b(&hub, 0);
    std::vector<attn::PeerInfo> peers(2);
    for (auto& p : peers) p.commHash = 0x1234abcdULL;
    attn::TransportContext ctx;
    ctx.rank = 0;
    ctx.nranks = 2;
    ctx.bootstrap = &b;
    ctx.peers = peers.data();
    ctx.timeoutMs = 2500;
    auto transport = attn::createTcpTransport();
    std::vector<std::unique_ptr<attn::Connection>> conns;
    rc = transport->connect(ctx, {1}, &conns);
  });
  const std::vector<uint8_t> got = attn::testing::captureConnections(lfd, 1500);
  close(lfd);
  fakePeer.join();
  rank0.join();
  EXPECT_NE(rc.load(), attnSuccess);
  EXPECT_GE(got.size(), 20u) << "rank 0 sent nothing to capture";
  EXPECT_FALSE(attn::testing::containsBytes(got, hub.secret(), 16))
      << "the secret's 16 bytes are in what the TCP transport sent to a peer's port";
}

// The TCP transport binds a peer to the address of its first socket: the
// test plays rank 0 (with the secret) against a real rank 1 that expects two
// sockets from it. A second socket from 127.0.0.2, or a duplicate index, is
// refused; the right one completes the setup.
TEST(TcpTransportAuth, SocketsOfOnePeerMustComeFromOnePlace) {
  attn::testing::FakeBootstrapHub hub(2);
  constexpr uint64_t kCommHash = 0x1234abcdULL;
  std::atomic<attnResult_t> rc{attnInternalError};
  std::string err;
  std::thread rank1([&] {
    attn::testing::FakeBootstrap b(&hub, 1);
    std::vector<attn::PeerInfo> peers(2);
    for (auto& p : peers) p.commHash = kCommHash;
    attn::TransportContext ctx;
    ctx.rank = 1;
    ctx.nranks = 2;
    ctx.bootstrap = &b;
    ctx.peers = peers.data();
    ctx.timeoutMs = 20000;
    auto transport = attn::createTcpTransport();
    std::vector<std::unique_ptr<attn::Connection>> conns;
    rc = transport->connect(ctx, {0}, &conns);
    err = attn::threadLastError();
  });
  attn::testing::FakeBootstrap b0(&hub, 0);
  constexpr size_t kSlot = 4 + attn::kAddressBytes + 4;  // tcp_setup.cc's RankSlot
  std::vector<uint8_t> slots(2 * kSlot, 0);
  attn::SocketAddress mine;
  ASSERT_EQ(attn::parseAddress("127.0.0.1:1", &mine), attnSuccess);
  const uint32_t myLen = attn::serializeAddress(mine, slots.data() + 4);
  const int32_t nsocks = 2;
  std::memcpy(slots.data(), &myLen, 4);
  std::memcpy(slots.data() + 4 + attn::kAddressBytes, &nsocks, 4);
  ASSERT_EQ(b0.allGather(slots.data(), kSlot), attnSuccess);
  uint32_t len = 0;
  std::memcpy(&len, slots.data() + kSlot, 4);
  attn::SocketAddress rank1Addr;
  ASSERT_TRUE(attn::deserializeAddress(slots.data() + kSlot + 4, len, &rank1Addr));

  // One TCP handshake as rank 0, socket `index`; the acceptor's signed status.
  auto claim = [&](int index, const char* fromIp, int* fd) {
    *fd = attn::testing::dialFrom(rank1Addr, fromIp);
    if (*fd < 0) return -2;
    attn::auth::Nonce mineNonce, theirs;
    attn::auth::freshNonce(&mineNonce);
    const attn::tcp::TcpHello h = attn::tcp::makeTcpHello(0, 1, index, nsocks, mineNonce);
    std::vector<uint8_t> body;
    if (!attn::testing::sendBody(*fd, &h, sizeof(h)) || !attn::testing::recvBody(*fd, &body, 4096) ||
        !attn::tcp::parseTcpChallenge(body.data(), body.size(), &theirs))
      return -1;
    const attn::tcp::TcpProof p = attn::tcp::makeTcpProof(hub.secret(), kCommHash, h, theirs);
    int32_t status = -1;
    if (!attn::testing::sendBody(*fd, &p, sizeof(p)) || !attn::testing::recvBody(*fd, &body, 4096) ||
        !attn::tcp::parseTcpAck(body.data(), body.size(), hub.secret(), kCommHash, h, theirs, &status))
      return -1;
    return int(status);
  };
  int s0 = -1, dup = -1, far = -1, s1 = -1;
  EXPECT_EQ(claim(0, "127.0.0.1", &s0), attn::tcp::kTcpAccepted);
  EXPECT_EQ(claim(0, "127.0.0.1", &dup), attn::tcp::kTcpRefused) << "a second socket 0";
  EXPECT_EQ(claim(1, "127.0.0.2", &far), attn::tcp::kTcpRefused) << "socket 1 from elsewhere";
  EXPECT_EQ(claim(1, "127.0.0.1", &s1), attn::tcp::kTcpAccepted);
  rank1.join();
  EXPECT_EQ(rc.load(), attnSuccess) << err;
  for (int fd : {s0, dup, far, s1})
    if (fd >= 0) close(fd);
}

// ---------------------------------------------------------------------------
// A fake root (something else listening at the root's address) that does not
// know the secret: the rank fails with a clear error instead of taking its
// address table, and does not wait for its timeout.

int AcceptOne(int listenFd, int ms) {
  pollfd p{listenFd, POLLIN, 0};
  if (poll(&p, 1, ms) <= 0) return -1;
  int fd = -1;
  attn::socketAcceptNow(listenFd, &fd);
  if (fd >= 0) attn::setNonBlocking(fd, false);
  return fd;
}

TEST(FakeRoot, WithoutTheSecretCannotHandOutAnAddressTable) {
  int lfd = -1;
  attn::SocketAddress any, bound;
  ASSERT_EQ(attn::parseAddress("127.0.0.1:0", &any), attnSuccess);
  ASSERT_EQ(attn::socketListen(any, false, &lfd, &bound), attnSuccess);
  uint8_t secret[16], guess[16];
  for (int i = 0; i < 16; ++i) secret[i] = uint8_t(0x30 + i), guess[i] = uint8_t(0x31 + i);
  attnUniqueId id;
  ASSERT_EQ(attn::bootstrapIdFor(attn::formatAddress(bound), secret, &id), attnSuccess);
  const attn::UniqueIdData d = Decode(id);

  std::atomic<attnResult_t> rc{attnSuccess};
  std::string err;
  std::thread rank([&] {
    std::unique_ptr<attn::Bootstrap> b;
    rc = attn::Bootstrap::create(id, 0, 2, 20000, nullptr, &b);
    err = attn::threadLastError();
  });
  // The fake root goes through the handshake and offers a table that sends
  // every rank to itself, signed with what it guesses the secret is.
  const int fd = AcceptOne(lfd, 10000);
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> body;
  attn::boot::RootHello hello;
  ASSERT_TRUE(attn::testing::recvBody(fd, &body, 4096));
  ASSERT_TRUE(attn::boot::parseRootHello(body.data(), body.size(), d.nonce, &hello));
  const std::vector<uint8_t> challenge = attn::testing::challengeBody(attn::boot::kRootChallengeMagic);
  attn::auth::Nonce nonce;
  std::memcpy(nonce.bytes, challenge.data() + 4, sizeof(nonce.bytes));
  ASSERT_TRUE(attn::testing::sendBody(fd, challenge.data(), challenge.size()));
  ASSERT_TRUE(attn::testing::recvBody(fd, &body, 4096));  // the rank's proof
  std::vector<attn::boot::AddrSlot> table(2);
  for (auto& slot : table) slot.len = attn::serializeAddress(bound, slot.addr);
  attn::boot::RootReplyBuilder reply(attn::boot::kRootOk, 2, 2, &table);
  const std::vector<uint8_t>& forged = reply.signFor(guess, hello, nonce);
  ASSERT_TRUE(attn::testing::sendBody(fd, forged.data(), forged.size()));
  rank.join();
  close(fd);
  close(lfd);
  EXPECT_EQ(rc.load(), attnRemoteError) << err;
  EXPECT_NE(err.find("not signed with this communicator's secret"), std::string::npos) << err;
}

// ---------------------------------------------------------------------------
// A recorded handshake cannot be replayed: a relay in front of the root
// records rank 1's hello and proof (and cuts that connection before the
// root sees the proof); replayed on a new connection, the root challenges
// with a fresh nonce, the old proof fails, and nothing is answered. Rank 1
// retries through the relay, which then passes bytes untouched.

void Pump(int a, int b) {
  for (;;) {
    pollfd p[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
    if (poll(p, 2, 20000) <= 0) return;
    for (int i = 0; i < 2; ++i) {
      if (!p[i].revents) continue;
      char buf[65536];
      const ssize_t n = recv(p[i].fd, buf, sizeof(buf), 0);
      if (n <= 0) return;
      SendRaw(i == 0 ? b : a, buf, size_t(n));
    }
  }
}

TEST(Replay, RecordedRootHandshakeIsRefused) {
  attnUniqueId id;
  ASSERT_EQ(attnGetUniqueId(&id), attnSuccess);
  const attn::UniqueIdData d = Decode(id);
  const attn::SocketAddress root = RootAddress(id);
  attn::SocketAddress relayAt = root, relayAddr;
  attn::setAddressPort(&relayAt, 0);
  int relayFd = -1;
  ASSERT_EQ(attn::socketListen(relayAt, false, &relayFd, &relayAddr), attnSuccess);
  attn::UniqueIdData viaRelay = d;
  viaRelay.addressLen = attn::serializeAddress(relayAddr, viaRelay.address);
  const attnUniqueId id1 = Encode(viaRelay);

  std::vector<uint8_t> hello, challenge, proof;
  std::atomic<bool> recorded{false};
  std::thread relay([&] {
    const int a = AcceptOne(relayFd, 20000), b = Dial(root);
    if (a >= 0 && b >= 0 && attn::testing::recvBody(a, &hello, 4096) &&
        attn::testing::sendBody(b, hello.data(), hello.size()) &&
        attn::testing::recvBody(b, &challenge, 4096) &&
        attn::testing::sendBody(a, challenge.data(), challenge.size()))
      attn::testing::recvBody(a, &proof, 4096);
    recorded = true;
    close(a);
    close(b);
    const int a2 = AcceptOne(relayFd, 20000), b2 = Dial(root);
    if (a2 >= 0 && b2 >= 0) Pump(a2, b2);
    close(a2);
    close(b2);
  });
  std::vector<std::unique_ptr<attn::Bootstrap>> bs(2);
  std::atomic<attnResult_t> rc1{attnInternalError};
  std::thread rank1([&] { rc1 = attn::Bootstrap::create(id1, 1, 2, 20000, nullptr, &bs[1]); });
  while (!recorded) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_FALSE(proof.empty()) << "the relay recorded no proof";

  const int c = Dial(root);
  ASSERT_GE(c, 0);
  std::vector<uint8_t> fresh, reply;
  ASSERT_TRUE(attn::testing::sendBody(c, hello.data(), hello.size()));
  ASSERT_TRUE(attn::testing::recvBody(c, &fresh, 4096));
  EXPECT_NE(fresh, challenge) << "the root challenged twice with the same nonce";
  ASSERT_TRUE(attn::testing::sendBody(c, proof.data(), proof.size()));
  EXPECT_FALSE(attn::testing::recvBody(c, &reply, 1 << 20, 5000))
      << "the root answered a replayed handshake (" << reply.size() << " bytes)";
  close(c);

  ASSERT_EQ(attn::Bootstrap::create(id, 0, 2, 20000, nullptr, &bs[0]), attnSuccess)
      << attn::threadLastError();
  rank1.join();
  ASSERT_EQ(rc1.load(), attnSuccess);
  RunThreadsRaw(2, [&](int r) { EXPECT_EQ(bs[r]->barrier(), attnSuccess); }, 30000);
  relay.join();
  close(relayFd);
}

// ---------------------------------------------------------------------------
// attnCommInitFromEnv's secret (issue 44 item 4): ATTN_SECRET_FILE, and a
// WARN once per process when there is no secret at all.

const char* const kSecretLaunchVars[] = {
    "ATTN_RANK", "ATTN_NRANKS", "ATTN_ROOT", "ATTN_SECRET", "ATTN_SECRET_FILE", "RANK",
    "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "TORCHELASTIC_RUN_ID", "OMPI_MCA_orte_ess_jobid", "PMIX_NAMESPACE", "SLURM_JOB_ID"};

// Unsets the launcher's variables for its lifetime.
class CleanLaunchEnv {
 public:
  CleanLaunchEnv() {
    for (const char* v : kSecretLaunchVars) {
      if (const char* old = getenv(v)) saved_.emplace_back(v, old);
      unsetenv(v);
    }
  }
  ~CleanLaunchEnv() {
    for (const char* v : kSecretLaunchVars) unsetenv(v);
    for (auto& [k, v] : saved_) setenv(k.c_str(), v.c_str(), 1);
  }

 private:
  std::vector<std::pair<std::string, std::string>> saved_;
};

std::string TempDir() {
  char tmpl[] = "/tmp/attn-secret-XXXXXX";
  const char* dir = mkdtemp(tmpl);
  return dir ? dir : "/tmp";
}

std::string WriteFile(const std::string& dir, const std::string& name, const std::string& text,
                      mode_t mode) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  chmod(path.c_str(), mode);
  return path;
}

constexpr char kHexSecret[] = "0f1e2d3c4b5a69788796a5b4c3d2e1f0";

TEST(SecretFile, BadFilesFailWithAClearError) {
  CleanLaunchEnv clean;
  const std::string dir = TempDir();
  const int port = FindFreePort();
  ASSERT_GT(port, 0);
  setenv("ATTN_RANK", "1", 1);  // a rank that would dial a root nobody runs
  setenv("ATTN_NRANKS", "2", 1);
  setenv("ATTN_ROOT", ("127.0.0.1:" + std::to_string(port)).c_str(), 1);
  struct Case {
    const char* what;
    std::string path;
    const char* mustMention;
  };
  const std::vector<Case> cases = {
      {"mode 0644", WriteFile(dir, "readable", kHexSecret, 0644), "0644"},
      {"mode 0640", WriteFile(dir, "group", kHexSecret, 0640), "0640"},
      {"garbage", WriteFile(dir, "garbage", "not a secret at all, not hex\n", 0600), "hex"},
      {"hex and more", WriteFile(dir, "more", std::string(kHexSecret) + " extra\n", 0600), "hex"},
      {"31 digits", WriteFile(dir, "short", std::string(kHexSecret, 31), 0600), "hex"},
      {"too large", WriteFile(dir, "large", std::string(8192, 'a'), 0600), "bytes"},
      {"missing", dir + "/no-such-file", "cannot open"},
      {"a directory", dir, "not a regular file"},
  };
  for (const Case& c : cases) {
    setenv("ATTN_SECRET_FILE", c.path.c_str(), 1);
    attnConfig_t cfg = ConfigWithTimeout(1500);
    attnComm_t comm = nullptr;
    const attnResult_t r = attnCommInitFromEnv(&comm, &cfg);
    const std::string err = attnGetLastError(nullptr);
    EXPECT_EQ(r, attnInvalidArgument) << c.what << ": " << ResultName(r) << ": " << err;
    EXPECT_EQ(comm, nullptr);
    EXPECT_NE(err.find(c.path), std::string::npos) << c.what << ": " << err;
    EXPECT_NE(err.find(c.mustMention), std::string::npos) << c.what << ": " << err;
  }
  // Both set and different.
  setenv("ATTN_SECRET_FILE", WriteFile(dir, "good", kHexSecret, 0600).c_str(), 1);
  setenv("ATTN_SECRET", "00112233445566778899aabbccddeeff", 1);
  attnConfig_t cfg = ConfigWithTimeout(1500);
  attnComm_t comm = nullptr;
  EXPECT_EQ(attnCommInitFromEnv(&comm, &cfg), attnInvalidArgument);
  EXPECT_NE(std::string(attnGetLastError(nullptr)).find("differ"), std::string::npos)
      << attnGetLastError(nullptr);
}

// Rank 0 reads the secret from a 0600 file (with whitespace around it),
// rank 1 gets the same value in ATTN_SECRET: they meet.
TEST(SecretFile, Mode0600FileWorks) {
  const std::string dir = TempDir();
  const std::string path = WriteFile(dir, "secret", std::string("  ") + kHexSecret + "\n", 0600);
  const int port = FindFreePort();
  ASSERT_GT(port, 0);
  RunOptions opts;
  opts.deadline_ms = 60000;
  opts.child_setup = [&](int rank) {
    for (const char* v : kSecretLaunchVars) unsetenv(v);
    setenv("ATTN_RANK", std::to_string(rank).c_str(), 1);
    setenv("ATTN_NRANKS", "2", 1);
    setenv("ATTN_ROOT", ("127.0.0.1:" + std::to_string(port)).c_str(), 1);
    if (rank == 0) setenv("ATTN_SECRET_FILE", path.c_str(), 1);
    else setenv("ATTN_SECRET", kHexSecret, 1);
  };
  auto results = ForkRanks(2, [&](int rank, const attnUniqueId&) {
    attnConfig_t cfg = ConfigWithTimeout(10000);
    attnComm_t comm = nullptr;
    const attnResult_t r = attnCommInitFromEnv(&comm, &cfg);
    ASSERT_EQ(r, attnSuccess) << ResultName(r) << ": " << attnGetLastError(nullptr);
    CheckAllReduce(comm, rank, 2, attnFloat32, attnSum, 1023, false);
    EXPECT_EQ(attnCommDestroy(comm), attnSuccess);
  }, opts);
  ExpectAllPassed(results);
}

// Without ATTN_SECRET / ATTN_SECRET_FILE: one WARN per process, however many
// communicators it makes. The log level is read once per process, so this
// runs in a fresh one (a death test re-executes the binary).
TEST(SecretFile, NoSecretWarnsOncePerProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string log = TempDir() + "/log";
  CleanLaunchEnv clean;
  ScopedEnv env({{"ATTN_DEBUG", "WARN"}, {"ATTN_DEBUG_FILE", log}});
  EXPECT_EXIT(
      {
        for (int i = 0; i < 2; ++i) {
          setenv("ATTN_RANK", "0", 1);
          setenv("ATTN_NRANKS", "1", 1);
          setenv("ATTN_ROOT", ("127.0.0.1:" + std::to_string(FindFreePort())).c_str(), 1);
          attnComm_t comm = nullptr;
          if (attnCommInitFromEnv(&comm, nullptr) != attnSuccess) _exit(20);
          attnCommDestroy(comm);
        }
        std::ifstream f(log);
        std::string line;
        int warnings = 0;
        while (std::getline(f, line))
          if (line.find(" WARN ") != std::string::npos &&
              line.find("without ATTN_SECRET") != std::string::npos)
            ++warnings;
        _exit(warnings == 1 ? 0 : 10 + warnings);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
