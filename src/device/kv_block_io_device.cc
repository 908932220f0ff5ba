// Migration's bytes for a device pool: the blocks a move sends come down
// into pinned host memory (R.hostOut) before the sends; those it receives
// land in pinned memory (R.hostIn) and go up into their reserved slots once
// all have arrived. One copy per run of consecutive slots, on the compute
// stream of the communicator's DeviceAttnState (the proxy runs one call at
// a time, so its buffers are free).
#include <cuda_runtime_api.h>

#include "src/core/comm.h"
#include "src/device/cuda_check.h"
#include "src/device/device_state.h"
#include "src/device/kv_device.h"

namespace attn {
namespace {

// Calls f(firstIndex, count) for each run of consecutive slots.
template <typename F>
attnResult_t forEachRun(const std::vector<int64_t>& slots, F f) {
  size_t i = 0;
  while (i < slots.size()) {
    size_t j = i + 1;
    while (j < slots.size() && slots[j] == slots[j - 1] + 1) ++j;
    ATTN_CHECK(f(i, j - i));
    i = j;
  }
  return attnSuccess;
}

class DeviceBlockIo : public KvBlockIo {
 public:
  DeviceBlockIo(KvPool& pool, DeviceAttnState& R) : pool_(pool), R_(R) {}

  // Staged as [K of every slot][V of every slot], so a run is one copy each.
  attnResult_t sendFrom(const std::vector<int64_t>& slots, std::vector<const char*>* k,
                        std::vector<const char*>* v) override {
    if (slots.empty()) return attnSuccess;
    ATTN_CHECK(R_.prepare(0));
    const size_t bb = pool_.blockBytes(), n = slots.size();
    ATTN_CHECK(R_.hostOut.reserve(2 * n * bb));
    char* host = R_.hostOut.base();
    ATTN_CHECK(forEachRun(slots, [&](size_t i, size_t count) -> attnResult_t {
      ATTN_CUDA_CHECK(cudaMemcpyAsync(host + i * bb, pool_.k(slots[i]), count * bb, cudaMemcpyDeviceToHost,
                                      R_.compute));
      ATTN_CUDA_CHECK(cudaMemcpyAsync(host + (n + i) * bb, pool_.v(slots[i]), count * bb,
                                      cudaMemcpyDeviceToHost, R_.compute));
      return attnSuccess;
    }));
    ATTN_CUDA_CHECK(cudaStreamSynchronize(R_.compute));
    for (size_t i = 0; i < n; ++i) {
      k->push_back(host + i * bb);
      v->push_back(host + (n + i) * bb);
    }
    return attnSuccess;
  }

  attnResult_t receiveInto(const std::vector<int64_t>& slots, std::vector<char*>* k,
                           std::vector<char*>* v) override {
    landing_ = slots;
    if (slots.empty()) return attnSuccess;
    const size_t bb = pool_.blockBytes(), n = slots.size();
    ATTN_CHECK(R_.hostIn.reserve(2 * n * bb));
    char* host = R_.hostIn.base();
    for (size_t i = 0; i < n; ++i) {
      k->push_back(host + i * bb);
      v->push_back(host + (n + i) * bb);
    }
    return attnSuccess;
  }

  attnResult_t received() override {
    if (landing_.empty()) return attnSuccess;
    ATTN_CHECK(R_.prepare(0));
    const size_t bb = pool_.blockBytes(), n = landing_.size();
    const char* host = R_.hostIn.base();
    ATTN_CHECK(forEachRun(landing_, [&](size_t i, size_t count) -> attnResult_t {
      ATTN_CUDA_CHECK(cudaMemcpyAsync(pool_.k(landing_[i]), host + i * bb, count * bb, cudaMemcpyHostToDevice,
                                      R_.compute));
      ATTN_CUDA_CHECK(cudaMemcpyAsync(pool_.v(landing_[i]), host + (n + i) * bb, count * bb,
                                      cudaMemcpyHostToDevice, R_.compute));
      return attnSuccess;
    }));
    ATTN_CUDA_CHECK(cudaStreamSynchronize(R_.compute));
    return attnSuccess;
  }

 private:
  KvPool& pool_;
  DeviceAttnState& R_;
  std::vector<int64_t> landing_;
};

}  // namespace

std::unique_ptr<KvBlockIo> makeKvBlockIoDevice(KvPool& pool) {
  return std::make_unique<DeviceBlockIo>(pool, pool.comm()->device->attn);
}

}  // namespace attn
