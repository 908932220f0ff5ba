// An in-process Bootstrap for unit tests of transports: ranks are threads
// that share one FakeBootstrapHub.
#pragma once

#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "src/core/bootstrap.h"

namespace attn::testing {

class FakeBootstrapHub {
 public:
  explicit FakeBootstrapHub(int nranks) : nranks_(nranks) {
    for (int i = 0; i < 16; ++i) secret_[i] = uint8_t(i * 7 + 1);
  }
  int nranks() const { return nranks_; }
  const uint8_t* secret() const { return secret_; }

  void put(int from, int to, uint32_t tag, const void* data, size_t n) {
    std::lock_guard<std::mutex> g(mu_);
    auto& q = mail_[{from, to, tag}];
    q.emplace_back((const uint8_t*)data, (const uint8_t*)data + n);
    cv_.notify_all();
  }
  bool take(int from, int to, uint32_t tag, void* data, size_t n) {
    std::unique_lock<std::mutex> g(mu_);
    auto key = std::make_tuple(from, to, tag);
    cv_.wait(g, [&] { return closed_ || !mail_[key].empty(); });
    if (mail_[key].empty()) return false;
    auto msg = std::move(mail_[key].front());
    mail_[key].erase(mail_[key].begin());
    if (msg.size() != n) return false;
    std::memcpy(data, msg.data(), n);
    return true;
  }
  void close() {
    std::lock_guard<std::mutex> g(mu_);
    closed_ = true;
    cv_.notify_all();
  }

 private:
  int nranks_;
  uint8_t secret_[16];
  std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  std::map<std::tuple<int, int, uint32_t>, std::vector<std::vector<uint8_t>>> mail_;
};

class FakeBootstrap : public Bootstrap {
 public:
  FakeBootstrap(FakeBootstrapHub* hub, int rank) : hub_(hub), rank_(rank) {}
  int rank() const override { return rank_; }
  int nranks() const override { return hub_->nranks(); }
  const uint8_t* secret() const override { return hub_->secret(); }
  std::string localIp() const override { return "127.0.0.1"; }
  attnResult_t allGather(void* data, size_t bytes) override {
    const uint32_t tag = 0x7fff0000u + seq_++;
    auto* p = static_cast<uint8_t*>(data);
    for (int r = 0; r < nranks(); ++r)
      if (r != rank_) hub_->put(rank_, r, tag, p + rank_ * bytes, bytes);
    for (int r = 0; r < nranks(); ++r)
      if (r != rank_ && !hub_->take(r, rank_, tag, p + r * bytes, bytes))
        return attnRemoteError;
    return attnSuccess;
  }
  attnResult_t send(int peer, uint32_t tag, const void* d, size_t n) override {
    hub_->put(rank_, peer, tag, d, n);
    return attnSuccess;
  }
  attnResult_t recv(int peer, uint32_t tag, void* d, size_t n) override {
    return hub_->take(peer, rank_, tag, d, n) ? attnSuccess : attnRemoteError;
  }
  attnResult_t barrier() override {
    char c = 0;
    std::vector<char> all(nranks());
    all[rank_] = c;
    return allGather(all.data(), 1);
  }
  void close() override { hub_->close(); }

 private:
  FakeBootstrapHub* hub_;
  int rank_;
  uint32_t seq_ = 0;
};

}  // namespace attn::testing
