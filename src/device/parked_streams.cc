#include "src/device/parked_streams.h"

#include <algorithm>
#include <vector>

#include "src/device/stream_bridge.h"

namespace attn::parked {
namespace {

struct Registry {
  std::mutex gate;      // enqueueGate(): order gate, then mu
  std::mutex mu;        // guards bridges
  std::vector<const StreamBridge*> bridges;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: bridges may outlive static destructors
  return *r;
}

}  // namespace

void add(const StreamBridge* bridge) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  r.bridges.push_back(bridge);
}

void remove(const StreamBridge* bridge) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  r.bridges.erase(std::remove(r.bridges.begin(), r.bridges.end(), bridge), r.bridges.end());
}

std::mutex& enqueueGate() { return registry().gate; }

bool whileNoneParked(const std::function<void()>& fn) {
  Registry& r = registry();
  std::lock_guard<std::mutex> gate(r.gate);
  {
    std::lock_guard<std::mutex> g(r.mu);
    for (const StreamBridge* b : r.bridges)
      if (b->mayParkStreams()) return false;
  }
  fn();
  return true;
}

}  // namespace attn::parked
