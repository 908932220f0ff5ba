#include "src/core/env.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <strings.h>

#include "src/core/log.h"

namespace attn {

std::optional<std::string> envString(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

int64_t envInt(const char* name, int64_t fallback) {
  auto v = envString(name);
  if (!v) return fallback;
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v->c_str(), &end, 0);
  if (errno != 0 || end == v->c_str() || *end != '\0') {
    ATTN_WARN(kLogInit, "ignoring %s=\"%s\": not an integer", name, v->c_str());
    return fallback;
  }
  return x;
}

bool envBool(const char* name, bool fallback) {
  auto v = envString(name);
  if (!v) return fallback;
  const char* s = v->c_str();
  if (!strcasecmp(s, "1") || !strcasecmp(s, "true") || !strcasecmp(s, "yes") || !strcasecmp(s, "on"))
    return true;
  if (!strcasecmp(s, "0") || !strcasecmp(s, "false") || !strcasecmp(s, "no") || !strcasecmp(s, "off"))
    return false;
  ATTN_WARN(kLogInit, "ignoring %s=\"%s\": not a boolean", name, s);
  return fallback;
}

}  // namespace attn
