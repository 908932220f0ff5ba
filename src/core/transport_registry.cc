#include "src/core/transport_registry.h"

#include <map>
#include <mutex>
#include <string>

namespace attn {
namespace {

std::mutex& registryMutex() {
  static std::mutex mu;
  return mu;
}
std::map<std::string, TransportMaker>& registry() {
  static std::map<std::string, TransportMaker> r;
  return r;
}

}  // namespace

void registerTransport(const char* name, TransportMaker make) {
  std::lock_guard<std::mutex> lk(registryMutex());
  registry()[name] = make;
}

TransportMaker findTransport(const char* name) {
  static std::once_flag builtins;
  std::call_once(builtins, [] { registerBuiltinTransports(); });
  std::lock_guard<std::mutex> lk(registryMutex());
  auto it = registry().find(name);
  return it == registry().end() ? nullptr : it->second;
}

}  // namespace attn
