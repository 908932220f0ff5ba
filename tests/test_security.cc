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
#include "src/core/socket.h"
#include "tests/support/multirank.h"

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
  // A well-formed hello with a wrong secret, claiming rank 0 of 3.
  {
    const int fd = dial("wrong-secret hello", true);
    attn::boot::RootHello h{};
    h.magic = attn::boot::kRootHelloMagic;
    h.version = attn::boot::kWireVersion;
    std::memcpy(h.secret, d.secret, 16);
    h.secret[0] ^= 0x80;
    h.nonce = d.nonce;
    h.rank = 0;
    h.nranks = 3;
    h.timeoutMs = 0;
    h.addrLen = d.addressLen;  // "listening" at the root's own address
    std::memcpy(h.addr, d.address, sizeof(h.addr));
    SendFrame(fd, &h, sizeof(h), sizeof(h));
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

}  // namespace
