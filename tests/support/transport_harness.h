// Testing a Transport directly (below the engine): ranks as threads over the
// in-process fake bootstrap, each with its transport and one Connection per
// peer, driven by hand; plus a byte pattern that names sender, receiver and
// message, so a misrouted or reordered byte is caught. Shared by the tcp and
// ucx transport tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "src/core/bootstrap.h"
#include "src/core/error.h"
#include "src/core/transport.h"
#include "tests/support/fake_bootstrap.h"

namespace attn::testing {

constexpr int kTransportTimeoutMs = 30000;

// One rank: its transport and its connections, conns[p] for peer p (null
// for itself and for peers it did not ask for).
struct TransportRank {
  int rank = 0;
  std::unique_ptr<Bootstrap> boot;
  std::unique_ptr<Transport> transport;
  std::vector<std::unique_ptr<Connection>> conns;
  std::vector<PeerInfo> peers;
  std::atomic<bool> abortFlag{false};
  ~TransportRank() { conns.clear(); }  // connections go before their transport
};

using TransportFactory = std::function<std::unique_ptr<Transport>()>;
using PeerChoice = std::function<std::vector<int>(int rank)>;

inline void runThreads(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) ts.emplace_back(fn, r);
  for (auto& t : ts) t.join();
}

inline std::vector<int> allBut(int r, int n) {
  std::vector<int> v;
  for (int p = 0; p < n; ++p)
    if (p != r) v.push_back(p);
  return v;
}

// Connects rk (its boot already set) to the peers wants(rank) names.
inline void connectTransportRank(TransportRank* rk, int n, const TransportFactory& make,
                                 const PeerChoice& wants) {
  rk->peers.resize(n);
  for (int i = 0; i < n; ++i) {
    rk->peers[i].rank = i;
    rk->peers[i].commHash = 0x1234abcdULL;
  }
  TransportContext ctx;
  ctx.rank = rk->rank;
  ctx.nranks = n;
  ctx.bootstrap = rk->boot.get();
  ctx.peers = rk->peers.data();
  ctx.timeoutMs = kTransportTimeoutMs;
  ctx.abortFlag = &rk->abortFlag;
  rk->transport = make();
  std::vector<int> peers = wants(rk->rank);
  std::vector<std::unique_ptr<Connection>> conns;
  ASSERT_EQ(rk->transport->connect(ctx, peers, &conns), attnSuccess) << threadLastError();
  ASSERT_EQ(conns.size(), peers.size());
  rk->conns.resize(n);
  for (size_t i = 0; i < peers.size(); ++i) {
    ASSERT_EQ(conns[i]->peer(), peers[i]);
    rk->conns[peers[i]] = std::move(conns[i]);
  }
}

// Ranks go away together, as a communicator's do: a closing endpoint may
// wait for its peer's progress (UCX flushes).
struct TransportRanks : std::vector<std::unique_ptr<TransportRank>> {
  explicit TransportRanks(size_t n) : std::vector<std::unique_ptr<TransportRank>>(n) {}
  TransportRanks(TransportRanks&&) = default;
  ~TransportRanks() {
    runThreads(int(size()), [this](int r) { (*this)[r].reset(); });
  }
};

// n ranks over the fake bootstrap, each connected to wants(rank) (default:
// every other rank).
inline TransportRanks makeTransportRanks(int n, FakeBootstrapHub* hub, const TransportFactory& make,
                                         PeerChoice wants = {}) {
  if (!wants) wants = [n](int r) { return allBut(r, n); };
  TransportRanks ranks(n);
  for (int r = 0; r < n; ++r) {
    ranks[r] = std::make_unique<TransportRank>();
    ranks[r]->rank = r;
    ranks[r]->boot = std::make_unique<FakeBootstrap>(hub, r);
  }
  runThreads(n, [&](int r) { connectTransportRank(ranks[r].get(), n, make, wants); });
  return ranks;
}

// Drives every connection of rk until no request in reqs is pending, or the
// deadline passes (false).
inline bool drive(TransportRank* rk, const std::vector<Request*>& reqs,
                  int timeoutMs = kTransportTimeoutMs) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
  for (;;) {
    bool pending = false;
    for (Request* q : reqs) pending |= q->pending();
    if (!pending) return true;
    if (std::chrono::steady_clock::now() > end) return false;
    bool any = false;
    for (auto& c : rk->conns) {
      if (!c || c->idle()) continue;
      bool p = false;
      c->progress(&p);  // failures land in the requests
      any |= p;
    }
    if (!any) rk->transport->waitForActivity(1000);
  }
}

// Byte i of message `msg` from src to dst.
inline uint8_t pattern(int src, int dst, size_t msg, size_t i) {
  return uint8_t((i * 131) ^ (src * 7 + dst * 13 + msg * 29) ^ (i >> 12));
}

inline void fill(std::vector<uint8_t>* buf, int src, int dst, size_t msg) {
  for (size_t i = 0; i < buf->size(); ++i) (*buf)[i] = pattern(src, dst, msg, i);
}

inline bool check(const uint8_t* buf, size_t n, int src, int dst, size_t msg) {
  for (size_t i = 0; i < n; ++i)
    if (buf[i] != pattern(src, dst, msg, i)) {
      ADD_FAILURE() << "byte " << i << " of message " << msg << " from " << src << " to " << dst;
      return false;
    }
  return true;
}

// Rank 0 sends `count` messages of mixed sizes (up to 600 KiB) to rank 1 at
// once; rank 1 starts late and posts receives a few at a time. Order, sizes
// and content must hold while the sender is pushed back.
inline void checkFifoUnderBackpressure(TransportRanks& ranks, size_t count) {
  std::vector<size_t> sizes(count);
  std::mt19937 rng(7);
  for (auto& s : sizes) s = rng() % 4 == 0 ? rng() % (600 << 10) : rng() % 300;
  runThreads(2, [&](int r) {
    TransportRank* rk = ranks[r].get();
    Connection* c = rk->conns[1 - r].get();
    if (r == 0) {
      std::vector<std::vector<uint8_t>> bufs(count);
      std::vector<Request> reqs(count);
      std::vector<Request*> all;
      for (size_t i = 0; i < count; ++i) {
        bufs[i].resize(sizes[i]);
        fill(&bufs[i], 0, 1, i);
        ASSERT_EQ(c->postSend(bufs[i].data(), sizes[i], &reqs[i]), attnSuccess);
        all.push_back(&reqs[i]);
      }
      ASSERT_TRUE(drive(rk, all));
      for (auto& q : reqs) ASSERT_EQ(q.state.load(), Request::kDone) << q.message;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let the sender run ahead
    const size_t window = 5;
    for (size_t base = 0; base < count; base += window) {
      const size_t k = std::min(window, count - base);
      std::vector<std::vector<uint8_t>> bufs(k, std::vector<uint8_t>(600 << 10));
      std::vector<Request> reqs(k);
      std::vector<Request*> all;
      for (size_t j = 0; j < k; ++j) {
        ASSERT_EQ(c->postRecv(bufs[j].data(), bufs[j].size(), &reqs[j]), attnSuccess);
        all.push_back(&reqs[j]);
      }
      ASSERT_TRUE(drive(rk, all));
      for (size_t j = 0; j < k; ++j) {
        ASSERT_EQ(reqs[j].state.load(), Request::kDone) << reqs[j].message;
        ASSERT_EQ(reqs[j].bytes, sizes[base + j]) << "message " << base + j << " out of order";
        ASSERT_TRUE(check(bufs[j].data(), sizes[base + j], 0, 1, base + j));
      }
    }
  });
}

}  // namespace attn::testing
