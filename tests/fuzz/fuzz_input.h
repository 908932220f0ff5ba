// Reads a harness's settings off the front of a fuzz input: each read takes
// bytes while there are some and yields zeros after, so every input, however
// short, means something.
#pragma once

#include <cstddef>
#include <cstdint>

namespace attn::fuzz {

struct Input {
  const uint8_t* p;
  size_t n;  // bytes left

  uint8_t byte() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
  // Big endian.
  uint64_t u16() {
    uint64_t hi = byte();
    return hi << 8 | byte();
  }
  int32_t i32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = v << 8 | byte();
    return int32_t(v);
  }
  // Moves past up to `len` bytes (the rest when fewer remain); returns how many.
  size_t skip(size_t len) {
    if (len > n) len = n;
    p += len;
    n -= len;
    return len;
  }
};

}  // namespace attn::fuzz
