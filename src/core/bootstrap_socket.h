// The socket Bootstrap behind Bootstrap::create: one rank's side of the
// rendezvous. Each rank listens on its own socket; a receive thread accepts
// peers that prove the secret (bootstrap_wire.h) and files every frame that
// arrives into a mailbox keyed by (peer, kind, tag), so recv() can match
// frames in any order. send() dials the peer lazily, checks that the peer
// proves the secret too, and keeps the connection.
//
// A rank's identity is bound to the source address of its first
// authenticated connection: a later claim from elsewhere, or while that
// rank's connection is open, is refused (WARN) and never disturbs the real
// peer. What one peer may queue unread is bounded (kMaxQueuedFrames,
// kMaxQueuedBytes); past that its connection is cut and waits for it fail.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "src/core/bootstrap.h"
#include "src/core/bootstrap_wire.h"
#include "src/core/socket.h"

namespace attn {

class SocketBootstrap : public Bootstrap {
 public:
  static attnResult_t create(const UniqueIdData& id, int rank, int nranks, int timeoutMs,
                             const std::atomic<bool>* abortFlag,
                             std::unique_ptr<SocketBootstrap>* out);
  ~SocketBootstrap() override;

  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }
  const uint8_t* secret() const override { return secret_; }
  std::string localIp() const override { return addressIp(listenAddr_); }

  attnResult_t allGather(void* data, size_t bytesPerRank) override;
  attnResult_t send(int peer, uint32_t tag, const void* data, size_t bytes) override;
  attnResult_t recv(int peer, uint32_t tag, void* data, size_t bytes) override;
  attnResult_t sendWithin(int peer, uint32_t tag, const void* data, size_t bytes, int timeoutMs) override;
  attnResult_t recvAny(uint32_t tag, void* data, size_t bytes, const std::vector<int>& awaited,
                       int* from) override;
  attnResult_t barrier() override;
  void close() override;

  // Where this rank's listener is (tests poke it with hostile clients).
  const SocketAddress& listenAddress() const { return listenAddr_; }

 private:
  using Key = std::tuple<int, uint32_t, uint32_t>;  // (peer, kind, tag)

  SocketBootstrap(int rank, int nranks, int timeoutMs, const std::atomic<bool>* abortFlag);
  attnResult_t start(const UniqueIdData& id);
  attnResult_t joinRoot(const SocketAddress& root);
  // One attempt at the root's handshake. *fatal: do not retry (the root
  // answered but did not prove the secret).
  attnResult_t helloRoot(const SocketAddress& root, const Deadline& deadline,
                         const std::string& what, boot::RootAnswer* answer, bool* fatal);
  // The dialer's side of the peer handshake on a connected socket; with
  // attnSuccess, *status is the peer's signed answer (boot::PeerStatus).
  attnResult_t handshakePeer(int fd, int peer, const Deadline& deadline, const std::string& what,
                             int32_t* status);
  attnResult_t sendTo(int peer, uint32_t kind, uint32_t tag, const void* data, size_t bytes,
                      const Deadline& deadline);
  attnResult_t recvFrom(int peer, uint32_t kind, uint32_t tag, void* data, size_t bytes,
                        const Deadline& deadline);
  // Moves the oldest frame under `key` into data (its size must be `bytes`).
  attnResult_t takeLocked(const Key& key, void* data, size_t bytes);
  // Why a wait for `peer` cannot go on (closed, aborted, peer gone, past the
  // deadline), or attnSuccess.
  attnResult_t waitFailsLocked(int peer, uint32_t tag, const Deadline& deadline);
  attnResult_t dialLocked(int peer, const Deadline& deadline);
  // Files a frame; false (frame dropped) when `from` is over its bounds.
  bool deliver(int from, std::vector<uint8_t>&& frame);
  // Marks `from` gone (waits for it fail); cutOff: for good.
  void markGone(int from, bool cutOff);
  void rxLoop();
  void rxServe();
  Cancel cancel() const { return Cancel{abortFlag_, &closed_}; }

  const int rank_;
  const int nranks_;
  const int timeoutMs_;
  const std::atomic<bool>* abortFlag_;
  uint8_t secret_[16] = {};
  uint64_t nonce_ = 0;

  int listenFd_ = -1;
  SocketAddress listenAddr_;
  std::vector<SocketAddress> peerAddr_;  // listen address of every rank
  int wakeFd_ = -1;                      // eventfd: wakes rxLoop on close()
  std::thread rx_;
  std::atomic<bool> closed_{false};
  std::once_flag joinOnce_;

  // Outgoing connections, dialled on first send.
  std::vector<int> outFd_;
  std::unique_ptr<std::mutex[]> outMu_;

  // Mailbox filled by rxLoop.
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<Key, std::deque<std::vector<uint8_t>>> mail_;
  struct PeerMail {
    bool gone = false;    // its connection closed (a new one clears it)
    bool cutOff = false;  // it exceeded its bounds: gone for good
    size_t frames = 0;    // queued, unread
    size_t bytes = 0;
  };
  std::vector<PeerMail> peerMail_;
  std::string rxError_;  // fatal receive-thread error, if any

  uint32_t collSeq_ = 0;  // internal tag of the next allGather
};

}  // namespace attn
