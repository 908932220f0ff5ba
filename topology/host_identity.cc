#include "topology/host_identity.h"

#include <unistd.h>

#include <fstream>

namespace attn {

uint64_t hash64(const void* data, size_t n, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;  // FNV-1a prime
  }
  return h;
}

std::string shortHostName() {
  char buf[256] = {};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

std::string hostIdentity(const std::string& configured) {
  if (!configured.empty()) return configured;
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  return shortHostName() + (boot.empty() ? "" : "/" + boot);
}

std::string rackIdentity(const std::string& configured) { return configured; }

}  // namespace attn
