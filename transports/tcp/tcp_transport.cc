// The TCP transport: connects with tcp_setup, moves bytes with
// TcpConnection, and sleeps in poll() on the sockets whose queued operations
// wait for the network.
#include "transports/tcp/tcp_transport.h"

#include <poll.h>
#include <time.h>

#include <memory>

#include "src/core/error.h"
#include "src/core/log.h"
#include "src/core/transport.h"
#include "transports/tcp/tcp_connection.h"
#include "transports/tcp/tcp_setup.h"

namespace attn {
namespace tcp {
namespace {

class TcpTransport : public Transport {
 public:
  const char* name() const override { return "tcp"; }

  attnResult_t connect(const TransportContext& ctx, const std::vector<int>& peers,
                       std::vector<std::unique_ptr<Connection>>* conns) override {
    ATTN_REQUIRE(conns != nullptr, "tcp: NULL connection list");
    const TcpOptions opt = TcpOptions::fromEnv();
    std::vector<PeerSockets> socks;
    ATTN_CHECK(establishSockets(ctx, peers, opt, &socks));
    conns->clear();
    for (size_t i = 0; i < peers.size(); ++i) {
      std::string name = "peer " + std::to_string(peers[i]) + " (" +
                         formatAddress(socks[i].addr) + ")";
      ATTN_INFO(kLogNet, "tcp: rank %d connected to %s with %zu sockets", ctx.rank,
                name.c_str(), socks[i].fds.size());
      conns->push_back(std::make_unique<TcpConnection>(peers[i], std::move(socks[i].fds), opt,
                                                       std::move(name), registry_));
    }
    ATTN_INFO(kLogNet, "tcp: rank %d ready: %zu peers, stripe min %zu bytes, socket buffers %s",
              ctx.rank, peers.size(), opt.stripeMin,
              opt.sockBuf > 0 ? std::to_string(opt.sockBuf).c_str() : "autotuned");
    return attnSuccess;
  }

  void waitForActivity(int timeoutUs) override {
    std::vector<pollfd> fds;
    {
      std::lock_guard<std::mutex> g(registry_->mu);
      for (TcpConnection* c : registry_->conns) c->addPollFds(&fds);
    }
    if (timeoutUs < 0) timeoutUs = 0;
    timespec ts{timeoutUs / 1000000, long(timeoutUs % 1000000) * 1000};
    ppoll(fds.data(), fds.size(), &ts, nullptr);
  }

 private:
  std::shared_ptr<TcpRegistry> registry_ = std::make_shared<TcpRegistry>();
};

}  // namespace
}  // namespace tcp

std::unique_ptr<Transport> createTcpTransport() { return std::make_unique<tcp::TcpTransport>(); }

void registerTcpTransport() { registerTransport("tcp", &createTcpTransport); }

}  // namespace attn
