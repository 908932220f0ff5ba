// The UCX transport: one UCP worker per communicator, endpoints built from
// worker addresses exchanged over the bootstrap, tagged messages driven by
// the progress engine. UCX picks the wires itself (shared memory, TCP, RDMA
// verbs where present), steered by UCX_TLS / UCX_NET_DEVICES.
#include "transports/ucx/ucx_transport.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <memory>

#include "src/core/settings.h"
#include "src/core/error.h"
#include "src/core/log.h"
#include "src/core/transport.h"
#include "transports/ucx/ucx_address_exchange.h"
#include "transports/ucx/ucx_connection.h"
#include "transports/ucx/ucx_context.h"
#include "transports/ucx/ucx_memreg.h"

namespace attn {
namespace ucx {
namespace {

constexpr size_t kRegCacheEntries = 64;

class UcxTransport : public Transport {
 public:
  ~UcxTransport() override {
    cache_.reset();   // before the context it registered with
    worker_.reset();
  }

  const char* name() const override { return "ucx"; }

  attnResult_t connect(const TransportContext& ctx, const std::vector<int>& peers,
                       std::vector<std::unique_ptr<Connection>>* conns) override {
    ATTN_REQUIRE(conns != nullptr, "ucx: NULL connection list");
    ATTN_CHECK(UcxWorker::create(settingInt<Setting::kUcxCuda>() != 0, &worker_));
    const int64_t regMin = settingInt<Setting::kUcxRegMin>()  /* >= 0 */;
    cache_ = std::make_unique<UcxRegCache>(worker_->context(), size_t(regMin), kRegCacheEntries);

    std::vector<uint8_t> mine;
    ATTN_CHECK(worker_->address(&mine));
    const size_t addressBytes = mine.size();
    mine.push_back(worker_->deviceMemory() ? 1 : 0);  // travels behind the address
    std::vector<std::vector<uint8_t>> all;
    ATTN_CHECK(exchangeAddresses(ctx, mine, &all));

    conns->clear();
    for (int p : peers) {
      if (p < 0 || p >= ctx.nranks || p == ctx.rank)
        return setError(attnInternalError, "ucx: asked to connect to rank %d of %d", p, ctx.nranks);
      if (all[p].empty())
        return setError(attnInternalError, "ucx: rank %d sent no worker address", p);
      const bool peerTakesDevice = all[p].back() != 0;
      all[p].pop_back();
      auto c = std::make_unique<UcxConnection>(p, ctx.rank, worker_.get(), cache_.get());
      ATTN_CHECK(c->connectTo(all[p], peerTakesDevice));
      conns->push_back(std::move(c));
    }
    ATTN_CHECK(handshake(ctx, *conns));
    ATTN_INFO(kLogNet, "ucx: rank %d ready: %zu peers, worker address %zu bytes, "
                       "registration cache %s",
              ctx.rank, peers.size(), addressBytes,
              cache_->enabled() ? ("from " + std::to_string(regMin) + " bytes").c_str() : "off");
    return attnSuccess;
  }

  // Wires every endpoint up now (UCX connects lazily), so failures show at
  // init and a later goodbye never waits for a handshake.
  attnResult_t handshake(const TransportContext& ctx,
                         const std::vector<std::unique_ptr<Connection>>& conns) {
    std::vector<UcxConnection*> ucs;
    std::lock_guard<std::mutex> g(worker_->mutex());
    for (auto& c : conns) {
      ucs.push_back(static_cast<UcxConnection*>(c.get()));
      ATTN_CHECK(ucs.back()->startHello());
    }
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      attnResult_t failed = attnSuccess;
      std::string waiting;
      for (UcxConnection* c : ucs)
        if (!c->helloDone(&failed)) waiting += (waiting.empty() ? "" : ",") + std::to_string(c->peer());
      if (failed != attnSuccess) return failed;
      if (waiting.empty()) return attnSuccess;
      if (ctx.abortFlag && ctx.abortFlag->load(std::memory_order_relaxed))
        return setError(attnRemoteError, "ucx: connect aborted");
      if (ctx.timeoutMs > 0 &&
          std::chrono::steady_clock::now() - start > std::chrono::milliseconds(ctx.timeoutMs))
        return setError(attnTimeout, "ucx: no handshake from peer(s) %s within %d ms",
                        waiting.c_str(), ctx.timeoutMs);
      if (worker_->progressLocked() == 0) std::this_thread::yield();
    }
  }

  void waitForActivity(int timeoutUs) override {
    if (worker_) worker_->wait(timeoutUs);
  }

 private:
  std::unique_ptr<UcxWorker> worker_;
  std::unique_ptr<UcxRegCache> cache_;
};

}  // namespace
}  // namespace ucx

std::unique_ptr<Transport> createUcxTransport() { return std::make_unique<ucx::UcxTransport>(); }

void registerUcxTransport() { registerTransport("ucx", &createUcxTransport); }

}  // namespace attn
