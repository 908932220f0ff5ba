// Makes a CUDA device current for a scope and restores the caller's device
// after: library calls must not change the application's current device.
#pragma once

#include <cuda_runtime_api.h>

#include "src/device/cuda_check.h"

namespace attn {

class DeviceScope {
 public:
  DeviceScope() = default;
  ~DeviceScope() {
    if (prev_ >= 0 && prev_ != cur_) cudaSetDevice(prev_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

  attnResult_t enter(int device) {
    ATTN_CUDA_CHECK(cudaGetDevice(&prev_));
    cur_ = prev_;
    if (device != prev_) ATTN_CUDA_CHECK(cudaSetDevice(device));
    cur_ = device;
    return attnSuccess;
  }

 private:
  int prev_ = -1;
  int cur_ = -1;
};

}  // namespace attn
