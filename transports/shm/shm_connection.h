// A shm Connection: one Sender (our channel to the peer), one Receiver (the
// peer's channel to us), and the failure handling both share: the peer
// closing, the peer's process dying, truncation.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "src/core/process_watch.h"
#include "src/core/transport.h"
#include "transports/shm/shm_bell.h"
#include "transports/shm/shm_process.h"
#include "transports/shm/shm_receiver.h"
#include "transports/shm/shm_sender.h"

namespace attn::shm {

class ShmConnection final : public Connection {
 public:
  struct Parts {
    Channel out;                          // we send on it (we created it)
    Channel in;                           // we receive on it (the peer's)
    std::shared_ptr<Segment> peerBellSeg; // the peer's bell, mapped here
    std::shared_ptr<LocalBell> myBell;
    DirectMode inMode = kDirectNone;      // how we read the peer's direct messages
    DirectMode outMode = kDirectNone;     // how the peer reads ours (its ack said)
    size_t directMin = 0;                 // our sends by address from here on (0: never)
    size_t mappedMin = 0;                 // same, from shareable regions (0: never)
    size_t mapCache = 64;                 // peer regions kept mapped
    HugePageAdvisor* hugePages = nullptr; // CMA buffers to huge pages (null: never)
    size_t hugePagesMin = 0;              // smallest receive buffer moved
    pid_t peerPid = 0;
    bool sameProcess = false;
    int livenessMs = 50;
    WaitLimit closeWait;                  // the communicator's timeout and abort flag
  };
  ShmConnection(int peer, Parts parts);
  ~ShmConnection() override;

  attnResult_t postSend(const void* buf, size_t bytes, Request* req) override;
  attnResult_t postRecv(void* buf, size_t capacity, Request* req) override;
  attnResult_t progress(bool* progressed) override;
  bool idle() const override { return sender_.idle() && receiver_.idle(); }
  void close() override;
  size_t mappedSendMin() const override { return sender_.mappedMin(); }

  DirectMode sendMode() const { return sender_.mode(); }
  DirectMode recvMode() const { return receiver_.mode(); }
  // How many of the peer's shareable regions we hold mapped (tests).
  size_t mappedRegions() const { return receiver_.mappedRegions(); }

 private:
  enum class PeerState { kOk, kTruncated, kClosed, kDead };
  PeerState peerState();
  attnResult_t failFor(PeerState state);
  // Fails everything queued, tells the peer, and stays broken.
  void breakLink(attnResult_t code, const std::string& why, uint32_t reason);
  // Tells the peer we are gone (both channels).
  void markClosed(uint32_t reason);
  attnResult_t failPost(Request* req);

  std::shared_ptr<Segment> peerBellSeg_;  // outlives sender_/receiver_ (they ring it)
  std::shared_ptr<LocalBell> myBell_;
  pid_t peerPid_;
  ProcessWatch watch_;
  Sender sender_;
  Receiver receiver_;
  bool broken_ = false;
  attnResult_t brokenCode_ = attnSuccess;
  std::string brokenWhy_;
};

}  // namespace attn::shm
