// The attention algorithms attnRingAttention runs, one row each: the mode
// the C API names, its name (logs, benchmarks, the Python layer), and its
// host and device runs. The C entry point looks the mode up here, host or
// device alike; a new algorithm is a file in src/attn (its device side in
// src/attn/device) and a row in attn_algorithms.cc.
#pragma once

#include <span>
#include <string_view>

#include "attncomm.h"
#include "src/attn/attn_call.h"
#include "src/attn/device/ring_attn_device.h"

namespace attn {

struct AttnAlgorithm {
  attnAttnMode_t mode;
  const char* name;  // "pass_kv", as the Python layer spells modes
  // On host memory, over the host transports (plan_call.h runs it).
  attnResult_t (*host)(AttnCall&);
  // On a device communicator's proxy thread with the CUDA kernels; null in
  // builds without CUDA.
  attnResult_t (*device)(AttnCall&, const DeviceAttnBuffers&);
};

// Every algorithm, in the order of attnAttnMode_t.
std::span<const AttnAlgorithm> attnAlgorithms();
// The row of `mode`, or null (attnModeAuto, an unknown value).
const AttnAlgorithm* findAttnAlgorithm(attnAttnMode_t mode);
const AttnAlgorithm* findAttnAlgorithm(std::string_view name);

}  // namespace attn
