// A receive buffer with guard bytes on both sides: a transport that writes
// outside the bytes it was given shows up as a changed guard.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace attn::testing {

class GuardedBuffer {
 public:
  static constexpr size_t kGuard = 4096;
  static constexpr uint8_t kGuardByte = 0xA5;
  static constexpr uint8_t kFillByte = 0x5A;

  explicit GuardedBuffer(size_t n) : bytes_(n + 2 * kGuard, kGuardByte), n_(n) {
    for (size_t i = 0; i < n; ++i) bytes_[kGuard + i] = kFillByte;
  }
  uint8_t* data() { return bytes_.data() + kGuard; }
  const uint8_t* data() const { return bytes_.data() + kGuard; }
  size_t size() const { return n_; }
  bool guardsIntact() const {
    for (size_t i = 0; i < kGuard; ++i)
      if (bytes_[i] != kGuardByte || bytes_[kGuard + n_ + i] != kGuardByte) return false;
    return true;
  }

 private:
  std::vector<uint8_t> bytes_;
  size_t n_;
};

}  // namespace attn::testing
