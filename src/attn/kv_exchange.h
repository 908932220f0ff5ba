// One round of variable-size messages between every pair of ranks, for the
// KV cache collectives: first a fixed-size header each way (a status and the
// payload's size), then the payloads that are not empty. A rank whose own
// input was bad sends a failing status instead, so every rank fails the
// call together rather than waiting for it. Payloads are reported in the
// order they arrived, for protocols that serve first come, first served.
#pragma once

#include <cstring>
#include <vector>

#include "attncomm.h"
#include "src/core/engine.h"

namespace attn {

struct PeerExchange {
  std::vector<std::vector<char>> in;  // [peer] payload received
  std::vector<int> arrival;           // peers with a payload, in arrival order
};

// out[peer] is sent to each peer (out[me] is ignored). localStatus !=
// attnSuccess sends the failure instead (and nothing else); the call then
// fails everywhere, on the other ranks naming this one.
attnResult_t exchangeWithPeers(Engine& e, int me, int nranks, const char* what,
                               attnResult_t localStatus,
                               const std::vector<std::vector<char>>& out, PeerExchange* got);

// A little writer/reader for payloads of plain values.
class WireOut {
 public:
  template <typename T>
  void put(const T& v) {
    const char* p = reinterpret_cast<const char*>(&v);
    buf_.insert(buf_.end(), p, p + sizeof(T));
  }
  void putBytes(const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    buf_.insert(buf_.end(), c, c + n);
  }
  std::vector<char>& bytes() { return buf_; }

 private:
  std::vector<char> buf_;
};

class WireIn {
 public:
  WireIn(const std::vector<char>& b) : p_(b.data()), end_(b.data() + b.size()) {}
  template <typename T>
  bool get(T* v) {
    if (size_t(end_ - p_) < sizeof(T)) return false;
    std::memcpy(v, p_, sizeof(T));
    p_ += sizeof(T);
    return true;
  }
  // Points at the next n bytes (no copy); null when fewer remain.
  const char* take(size_t n) {
    if (size_t(end_ - p_) < n) return nullptr;
    const char* at = p_;
    p_ += n;
    return at;
  }
  bool done() const { return p_ == end_; }

 private:
  const char* p_;
  const char* end_;
};

}  // namespace attn
