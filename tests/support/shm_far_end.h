// A ShmConnection whose peer is the test: real shared-memory segments
// (both channels and both doorbells) built as the transport builds them,
// with the peer's side written by hand. The test publishes slots in the
// channel the connection receives from (as a sender would, or as a hostile
// one would), and reads or scribbles on the channel the connection sends
// on (as its receiver). The connection's peer is "peer 1", in this process.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "src/core/transport.h"
#include "transports/shm/shm_bell.h"
#include "transports/shm/shm_channel.h"
#include "transports/shm/shm_connection.h"
#include "transports/shm/shm_layout.h"
#include "transports/shm/shm_segment.h"

namespace attn::testing {

class ShmFarEnd {
 public:
  struct Options {
    shm::DirectMode inMode = shm::kDirectNone;   // how the connection reads the peer
    shm::DirectMode outMode = shm::kDirectNone;  // how the peer reads the connection
    size_t directMin = 0;                        // the connection's sends by address
    bool sameProcess = true;
    int timeoutMs = 2000;  // the communicator's deadline (busy-flag waits)
    uint32_t nslots = 4;
    uint64_t slotBytes = 8192;
  };

  static std::string uniqueName(const char* what) {
    static std::atomic<int> counter{0};
    return "/attn-test-" + std::string(what) + "-" + std::to_string(getpid()) + "-" +
           std::to_string(counter.fetch_add(1));
  }

  explicit ShmFarEnd(const Options& o) {
    shm::ShmConnection::Parts parts;
    if (shm::Channel::create(uniqueName("out"), 0, o.nslots, o.slotBytes, &parts.out) != attnSuccess ||
        shm::Channel::create(uniqueName("in"), 1, o.nslots, o.slotBytes, &peerOut_) != attnSuccess)
      return;
    parts.in = peerOut_;
    peerIn_ = parts.out;
    peerIn_.hdr->directMode.store(o.outMode);
    parts.peerBellSeg = makeBell();
    auto mine = std::make_shared<shm::LocalBell>();
    mine->seg = makeBell();
    if (!parts.peerBellSeg || !mine->seg) return;
    mine->bell = static_cast<shm::Bell*>(mine->seg->base());
    parts.myBell = mine;
    parts.inMode = o.inMode;
    parts.outMode = o.outMode;
    parts.directMin = o.directMin;
    parts.peerPid = getpid();
    parts.sameProcess = o.sameProcess;
    parts.closeWait = shm::WaitLimit{o.timeoutMs, nullptr};
    conn_ = std::make_unique<shm::ShmConnection>(1, std::move(parts));
  }

  bool ok() const { return conn_ != nullptr; }
  shm::ShmConnection& conn() { return *conn_; }
  // The channel the connection receives from (the test is its sender) ...
  shm::Channel& peerOut() { return peerOut_; }
  // ... and the one it sends on (the test is its receiver).
  shm::Channel& peerIn() { return peerIn_; }

  // Slot `i` of peerOut(), to fill before publish(i).
  shm::SlotHeader& slot(uint64_t i) { return peerOut_.slot(i); }
  void publish(uint64_t i) { peerOut_.slot(i).seq.store(i + 1, std::memory_order_release); }
  // An inline chunk in slot i: `chunkBytes` bytes of `fill` (as many as the
  // slot holds), header fields as given, then published.
  void publishInline(uint64_t i, uint64_t msgIndex, uint64_t msgBytes, uint64_t offset,
                     uint64_t chunkBytes, uint8_t fill = 0x33) {
    shm::SlotHeader& s = slot(i);
    s.msgIndex = msgIndex;
    s.msgBytes = msgBytes;
    s.offset = offset;
    s.chunkBytes = chunkBytes;
    s.kind = shm::kSlotInline;
    std::memset(s.small, fill, sizeof(s.small));
    std::memset(peerOut_.slotData(i), fill, peerOut_.slotBytes);
    publish(i);
  }

  // Calls progress() until a pass moves nothing or it fails (bounded).
  attnResult_t drain(int maxPasses = 10000) {
    attnResult_t r = attnSuccess;
    for (int i = 0; i < maxPasses; ++i) {
      bool progressed = false;
      r = conn_->progress(&progressed);
      if (r != attnSuccess || !progressed) break;
    }
    return r;
  }

 private:
  static std::shared_ptr<shm::Segment> makeBell() {
    std::shared_ptr<shm::Segment> seg;
    if (shm::Segment::create(uniqueName("bell"), shm::kPage, &seg) != attnSuccess) return nullptr;
    new (seg->base()) shm::Bell();
    return seg;
  }

  shm::Channel peerOut_;
  shm::Channel peerIn_;
  std::unique_ptr<shm::ShmConnection> conn_;
};

}  // namespace attn::testing
