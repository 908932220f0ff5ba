// The resolved options of a communicator: attnConfig_t fields, with unset
// ones taken from the environment or the defaults.
#pragma once

#include <cstdint>
#include <string>

#include "attncomm.h"

namespace attn {

// kTransportUcx is never in the default set: UCX serves a communicator only
// when asked for (ATTN_TRANSPORT / config.transports).
enum TransportBit : uint32_t {
  kTransportShm = 1u << 0,
  kTransportTcp = 1u << 1,
  kTransportUcx = 1u << 2,
  kTransportCudaIpc = 1u << 3,  // device communicators: GPU-to-GPU on one host (src/device/backends/cuda_ipc)
};

struct CommConfig {
  bool blocking = true;
  int timeoutMs = 300000;
  uint32_t transports = kTransportShm | kTransportTcp | kTransportCudaIpc;
  int device = ATTN_DEVICE_HOST;
  std::string name;
  bool checkSignatures = false;  // ATTN_CHECK
};

// Validates `user` (may be NULL) and fills `out`. `inherit` (may be NULL)
// supplies values for unset fields before the environment does (split).
attnResult_t resolveConfig(const attnConfig_t* user, const CommConfig* inherit,
                           CommConfig* out);
// Parses "shm,tcp" into TransportBit flags; unknown names are an error, and
// so is "ucx" in a build without UCX, or "cuda_ipc" without CUDA
// (attnNotSupported), or a list naming no host transport.
attnResult_t parseTransportList(const std::string& list, uint32_t* mask);
std::string transportListString(uint32_t mask);

}  // namespace attn
