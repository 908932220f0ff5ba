#include "src/attn/attn_algorithms.h"

#include <array>

namespace attn {
namespace {

#if ATTN_HAVE_CUDA
#define ATTN_DEVICE_RUN(f) f
#else
#define ATTN_DEVICE_RUN(f) nullptr
#endif

constexpr std::array<AttnAlgorithm, 5> kAlgorithms = {{
    {attnModePassKV, "pass_kv", runPassKv, ATTN_DEVICE_RUN(runPassKvDevice)},
    {attnModePassQ, "pass_q", runPassQ, ATTN_DEVICE_RUN(runPassQDevice)},
    {attnModeShipQ, "ship_q", runShipQ, ATTN_DEVICE_RUN(runShipQDevice)},
    {attnModeHeadParallel, "head_parallel", runHeadParallel, ATTN_DEVICE_RUN(runHeadParallelDevice)},
    // No device run yet: a device communicator refuses it at the call.
    {attnModeAllGatherKV, "all_gather_kv", runAllGatherKv, nullptr},
}};

#undef ATTN_DEVICE_RUN

}  // namespace

std::span<const AttnAlgorithm> attnAlgorithms() { return kAlgorithms; }

const AttnAlgorithm* findAttnAlgorithm(attnAttnMode_t mode) {
  for (const AttnAlgorithm& a : kAlgorithms)
    if (a.mode == mode) return &a;
  return nullptr;
}

const AttnAlgorithm* findAttnAlgorithm(std::string_view name) {
  for (const AttnAlgorithm& a : kAlgorithms)
    if (name == a.name) return &a;
  return nullptr;
}

}  // namespace attn
