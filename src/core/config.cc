#include "src/core/config.h"

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "src/core/settings.h"
#include "src/core/error.h"

namespace attn {
attnResult_t parseTransportList(const std::string& list, uint32_t* mask) {
  uint32_t m = 0;
  std::stringstream ss(list);
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    if (tok == "shm") m |= kTransportShm;
    else if (tok == "tcp") m |= kTransportTcp;
    else if (tok == "ucx") {
#if ATTN_HAVE_UCX
      m |= kTransportUcx;
#else
      return setError(attnNotSupported,
                      "transport \"ucx\" in \"%s\": this build of attncomm has no UCX "
                      "(install libucx-dev and rebuild)",
                      list.c_str());
#endif
    }
    else if (tok == "cuda_ipc") {
#if ATTN_HAVE_CUDA
      m |= kTransportCudaIpc;
#else
      return setError(attnNotSupported,
                      "transport \"cuda_ipc\" in \"%s\": this build of attncomm has no CUDA",
                      list.c_str());
#endif
    }
    else if (tok.empty()) continue;
    else
      return setError(attnInvalidArgument,
                      "unknown transport \"%s\" in \"%s\" (known: shm, tcp, ucx, cuda_ipc)",
                      tok.c_str(), list.c_str());
  }
  if (m == 0) return setError(attnInvalidArgument, "transport list \"%s\" names no transport", list.c_str());
  if (!(m & (kTransportShm | kTransportTcp | kTransportUcx)))
    return setError(attnInvalidArgument,
                    "transport list \"%s\" names no host transport: cuda_ipc moves device buffers "
                    "only, add shm, tcp or ucx",
                    list.c_str());
  *mask = m;
  return attnSuccess;
}

std::string transportListString(uint32_t mask) {
  std::string s;
  if (mask & kTransportShm) s += "shm";
  if (mask & kTransportTcp) s += s.empty() ? "tcp" : ",tcp";
  if (mask & kTransportUcx) s += s.empty() ? "ucx" : ",ucx";
#if ATTN_HAVE_CUDA
  if (mask & kTransportCudaIpc) s += s.empty() ? "cuda_ipc" : ",cuda_ipc";
#endif
  return s;
}

attnResult_t resolveConfig(const attnConfig_t* user, const CommConfig* inherit,
                           CommConfig* out) {
  CommConfig c;
  if (inherit) {
    c = *inherit;
  } else {
    c.blocking = settingBool<Setting::kCommBlocking>();
    // Strictly: a timeout that wrapped or defaulted to 0 would mean "wait forever".
    int64_t timeoutMs = 0;
    ATTN_CHECK(settingIntStrict<Setting::kTimeoutMs>(&timeoutMs));
    c.timeoutMs = int(timeoutMs);
    if (auto t = settingString(Setting::kTransport)) ATTN_CHECK(parseTransportList(*t, &c.transports));
    c.checkSignatures = settingBool<Setting::kCheck>();
  }
  if (user) {
    ATTN_REQUIRE(user->magic == ATTN_CONFIG_MAGIC,
                 "attnConfig_t not initialised: start from ATTN_CONFIG_INITIALIZER (magic 0x%x)",
                 user->magic);
    // Older callers pass a smaller struct: read only the fields they have.
    ATTN_REQUIRE(user->size >= offsetof(attnConfig_t, device) + sizeof(int),
                 "attnConfig_t size %zu is too small", user->size);
    if (user->blocking != ATTN_CONFIG_UNDEF_INT) {
      ATTN_REQUIRE(user->blocking == 0 || user->blocking == 1,
                   "config.blocking must be 0 or 1, got %d", user->blocking);
      c.blocking = user->blocking == 1;
    }
    if (user->timeout_ms != ATTN_CONFIG_UNDEF_INT) {
      ATTN_REQUIRE(user->timeout_ms >= 0, "config.timeout_ms must be >= 0, got %d", user->timeout_ms);
      c.timeoutMs = user->timeout_ms;
    }
    if (user->transports != nullptr) ATTN_CHECK(parseTransportList(user->transports, &c.transports));
    if (user->device != ATTN_CONFIG_UNDEF_INT) {
      ATTN_REQUIRE(user->device >= ATTN_DEVICE_HOST, "config.device %d is invalid", user->device);
      c.device = user->device;
    }
    if (user->size >= offsetof(attnConfig_t, comm_name) + sizeof(const char*) && user->comm_name)
      c.name = user->comm_name;
  }
  if (c.device != ATTN_DEVICE_HOST && !ATTN_HAVE_CUDA)
    return setError(attnNotSupported,
                    "config.device=%d: device communicators need the CUDA path, "
                    "which this build does not provide; use ATTN_DEVICE_HOST",
                    c.device);
  *out = c;
  return attnSuccess;
}

}  // namespace attn
