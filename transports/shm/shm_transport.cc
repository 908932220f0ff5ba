// The shared-memory transport: connect() builds one ShmConnection per peer
// on this host; waitForActivity() sleeps on this rank's doorbell, which
// peers ring only between armWait() and disarmWait() (shm_bell.h).
//
// Connect handshake (collective; every rank with shm peers runs it with
// each of them):
//   1. create our bell and one channel per peer (we are its sender);
//   2. send each peer a Hello: names, pid, CMA probe;
//   3. receive the peers' Hellos; map their channel (and unlink its name at
//      once: we are its only other user) and their bell; probe CMA and write
//      the receive mode into their channel;
//   4. exchange acks (every peer has mapped what we created), then unlink
//      our names. From here on a crash leaves nothing in /dev/shm.
#include "transports/shm/shm_transport.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <new>
#include <vector>

#include "src/core/bootstrap.h"
#include "src/core/error.h"
#include "src/core/log.h"
#include "src/core/transport.h"
#include "transports/shm/shm_bell.h"
#include "transports/shm/shm_config.h"
#include "transports/shm/shm_connection.h"
#include "transports/shm/shm_process.h"

namespace attn {
namespace shm {
namespace {

constexpr uint32_t kHelloMagic = 0x53484d48;  // "SHMH"
constexpr uint32_t kTagBase = 0x53480000u;    // "SH" in the high half

struct Hello {
  uint32_t magic;
  uint32_t version;
  int32_t rank;
  uint32_t cmaAllowed;
  int64_t pid;
  ProcessProbe probe;
  uint64_t commHash;
  char channel[120];  // our channel to the receiver of this Hello
  char bell[120];     // our bell
};

struct Ack {
  uint32_t magic;
  uint32_t inMode;  // how the sender of this Ack will read our direct messages
};

const char* modeName(uint32_t m) {
  return m == kDirectMemcpy ? "memcpy" : m == kDirectCma ? "cma" : "ring";
}

std::string segmentName(uint64_t commHash, const char* what, int a, int b, uint32_t serial) {
  static std::atomic<uint32_t> counter{0};
  char buf[120];
  snprintf(buf, sizeof(buf), "/attn-%016llx-%s%d-%d-p%d-%u-%u", (unsigned long long)commHash, what,
           a, b, (int)getpid(), serial, counter.fetch_add(1));
  return buf;
}

class ShmTransport final : public Transport {
 public:
  const char* name() const override { return "shm"; }
  attnResult_t connect(const TransportContext& ctx, const std::vector<int>& peers,
                       std::vector<std::unique_ptr<Connection>>* conns) override;
  void waitForActivity(int timeoutUs) override;
  void armWait() override;
  void disarmWait() override;

 private:
  Config cfg_;
  uint32_t connectSerial_ = 0;
  bool otherProcesses_ = false;  // some peer lives in another process
  std::vector<std::shared_ptr<LocalBell>> bells_;
};

attnResult_t ShmTransport::connect(const TransportContext& ctx, const std::vector<int>& peers,
                                   std::vector<std::unique_ptr<Connection>>* conns) {
  conns->clear();
  const uint32_t serial = connectSerial_++;
  if (peers.empty()) return attnSuccess;
  cfg_ = Config::fromEnv();
  const int me = ctx.rank;
  const PeerInfo& myInfo = ctx.peers[me];
  ATTN_REQUIRE(ctx.bootstrap != nullptr, "shm: connect needs a bootstrap");
  for (int p : peers) {
    ATTN_REQUIRE(p >= 0 && p < ctx.nranks && p != me, "shm: bad peer %d", p);
    if (ctx.peers[p].hostHash != myInfo.hostHash)
      return setError(attnInvalidUsage, "shm: peer %d is on another host (%s)", p,
                      ctx.peers[p].hostId);
  }
  // Yama (ptrace_scope 1) lets no peer process read us with CMA unless we
  // open the door, process-wide: only when some peer is another process.
  bool peerProcess = false;
  for (int p : peers) peerProcess |= ctx.peers[p].pid != int64_t(getpid());
  if (cfg_.cma && peerProcess) allowCmaReaders();
  const ProcessProbe probe = processProbe();
  const uint32_t tagHello = kTagBase | ((serial & 0xfff) << 4) | 1;
  const uint32_t tagAck = kTagBase | ((serial & 0xfff) << 4) | 2;

  // 1. our bell and our outgoing channels
  auto bell = std::make_shared<LocalBell>();
  const std::string bellName = segmentName(myInfo.commHash, "bell", me, me, serial);
  ATTN_CHECK(Segment::create(bellName, kPage, &bell->seg));
  bell->bell = new (bell->seg->base()) Bell();
  const size_t n = peers.size();
  std::vector<Channel> out(n), in(n);
  std::vector<std::shared_ptr<Segment>> peerBells(n);
  std::vector<Hello> theirs(n);
  std::vector<char> sameProcess(n, 0);  // the peer is a thread of ours
  std::vector<uint32_t> outModes(n, kDirectNone);  // how each peer reads us (its ack)
  std::vector<uint32_t> inModes(n, kDirectNone);   // how we read each peer (we chose)
  for (size_t i = 0; i < n; ++i)
    ATTN_CHECK(Channel::create(segmentName(myInfo.commHash, "ch", me, peers[i], serial), me,
                               cfg_.nslots, cfg_.slotBytes, &out[i]));

  // 2. hellos out
  for (size_t i = 0; i < n; ++i) {
    Hello h{};
    h.magic = kHelloMagic;
    h.version = kLayoutVersion;
    h.rank = me;
    h.cmaAllowed = cfg_.cma;
    h.pid = getpid();
    h.probe = probe;
    h.commHash = myInfo.commHash;
    snprintf(h.channel, sizeof(h.channel), "%s", out[i].seg->name().c_str());
    snprintf(h.bell, sizeof(h.bell), "%s", bellName.c_str());
    ATTN_CHECK(ctx.bootstrap->send(peers[i], tagHello, &h, sizeof(h)));
  }

  // 3. hellos in: map the peer's channel and bell, decide how we read
  for (size_t i = 0; i < n; ++i) {
    const int p = peers[i];
    Hello& h = theirs[i];
    ATTN_CHECK(ctx.bootstrap->recv(p, tagHello, &h, sizeof(h)));
    h.channel[sizeof(h.channel) - 1] = h.bell[sizeof(h.bell) - 1] = '\0';
    if (h.magic != kHelloMagic || h.version != kLayoutVersion || h.rank != p ||
        h.commHash != myInfo.commHash)
      return setError(attnInvalidUsage, "shm: bad hello from peer %d (version %u, rank %d)", p,
                      h.version, h.rank);
    ATTN_CHECK(Channel::attach(h.channel, p, &in[i]));
    in[i].seg->unlink();  // only the two of us use it, and both have it mapped
    ATTN_CHECK(Segment::open(h.bell, kPage, &peerBells[i]));
    sameProcess[i] = h.probe.token == probe.token && h.pid == getpid();
    uint32_t mode = kDirectNone;
    if (sameProcess[i])
      mode = kDirectMemcpy;
    else if (cfg_.cma && h.cmaAllowed && cmaProbe(static_cast<pid_t>(h.pid), h.probe))
      mode = kDirectCma;
    inModes[i] = mode;  // ours: the copy in the peer's header is the peer's to change
    in[i].hdr->directMode.store(mode, std::memory_order_release);
  }

  // 4. acks: every peer mapped our segments, so our names can go
  for (size_t i = 0; i < n; ++i) {
    Ack a{kHelloMagic, inModes[i]};
    ATTN_CHECK(ctx.bootstrap->send(peers[i], tagAck, &a, sizeof(a)));
  }
  for (size_t i = 0; i < n; ++i) {
    Ack a{};
    ATTN_CHECK(ctx.bootstrap->recv(peers[i], tagAck, &a, sizeof(a)));
    // Read once: the peer may rewrite the header's copy later. Only a
    // thread of ours may read our buffers with memcpy.
    outModes[i] = out[i].hdr->directMode.load(std::memory_order_acquire);
    const bool modeOk = outModes[i] == kDirectNone || outModes[i] == kDirectCma ||
                        (outModes[i] == kDirectMemcpy && sameProcess[i]);
    if (a.magic != kHelloMagic || a.inMode != outModes[i] || !modeOk)
      return setError(attnRemoteError, "shm: bad ack from peer %d (read mode %u)", peers[i],
                      outModes[i]);
  }
  bell->seg->unlink();
  for (Channel& c : out) c.seg->unlink();

  for (size_t i = 0; i < n; ++i) {
    const int p = peers[i];
    ShmConnection::Parts parts;
    const uint32_t outMode = outModes[i];
    parts.directMin = outMode == kDirectMemcpy ? cfg_.memcpyMin
                      : outMode == kDirectCma  ? cfg_.cmaMin
                                               : 0;
    // Another process that reads us with CMA can map our shareable regions.
    parts.mappedMin = outMode == kDirectCma && cfg_.map ? cfg_.mapMin : 0;
    parts.mapCache = cfg_.mapCache;
    parts.hugePages = cfg_.hugePages ? HugePageAdvisor::process() : nullptr;
    parts.hugePagesMin = cfg_.cmaMin;
    parts.out = std::move(out[i]);
    parts.in = std::move(in[i]);
    parts.peerBellSeg = std::move(peerBells[i]);
    parts.myBell = bell;
    parts.inMode = static_cast<DirectMode>(inModes[i]);
    parts.outMode = static_cast<DirectMode>(outMode);
    parts.closeWait = WaitLimit{ctx.timeoutMs, ctx.abortFlag};
    parts.peerPid = static_cast<pid_t>(theirs[i].pid);
    parts.sameProcess = sameProcess[i];
    parts.livenessMs = cfg_.livenessMs;
    otherProcesses_ |= !parts.sameProcess;
    ATTN_INFO(kLogShm,
              "peer %d (pid %lld): send via %s from %zu KiB (ring below), receive via %s, "
              "ring %u x %zu KiB",
              p, (long long)theirs[i].pid, modeName(outMode), parts.directMin >> 10,
              modeName(parts.inMode), cfg_.nslots, cfg_.slotBytes >> 10);
    conns->push_back(std::make_unique<ShmConnection>(p, std::move(parts)));
  }
  bells_.push_back(std::move(bell));
  return attnSuccess;
}

void ShmTransport::armWait() {
  for (auto& b : bells_) watchBell(b->bell);
}

void ShmTransport::disarmWait() {
  for (auto& b : bells_) unwatchBell(b->bell);
}

void ShmTransport::waitForActivity(int timeoutUs) {
  if (bells_.empty()) return;
  constexpr size_t kMaxBells = 128;
  Bell* bells[kMaxBells];
  uint32_t expected[kMaxBells];
  size_t n = std::min(bells_.size(), kMaxBells);
  for (size_t i = 0; i < n; ++i) {
    bells[i] = bells_[i]->bell;
    expected[i] = bells_[i]->expected();
  }
  // A short spin catches a reply already on its way without a syscall;
  // beyond it, sleep, so ranks sharing a core do not starve each other.
  int spin = std::min(cfg_.spinUs, timeoutUs);
  if (spinOnBells(bells, expected, n, spin)) return;
  int sleepUs = timeoutUs - spin;
  // A dead peer rings nobody: wake often enough to notice it.
  if (otherProcesses_) sleepUs = std::min(sleepUs, cfg_.livenessMs * 1000);
  waitBells(bells, expected, n, sleepUs);
}

}  // namespace
}  // namespace shm

std::unique_ptr<Transport> createShmTransport() { return std::make_unique<shm::ShmTransport>(); }

void registerShmTransport() { registerTransport("shm", &createShmTransport); }

}  // namespace attn
