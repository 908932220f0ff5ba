// A POSIX shared-memory segment mapped into this process (RAII).
//
// The creator makes the name, the peer opens it; the name is unlinked as
// soon as both have mapped it, so nothing is left in /dev/shm even when a
// process crashes later. Until then the creator unlinks it on destruction.
//
// A peer in the same process (ranks as threads) gets the creator's mapping
// back instead of a second one: one address per shared byte keeps tools
// such as ThreadSanitizer able to see the release/acquire pairs.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "attncomm.h"

namespace attn::shm {

class Segment {
 public:
  // Creates `name` (exclusive) of `bytes` zero bytes and maps it.
  static attnResult_t create(const std::string& name, size_t bytes,
                             std::shared_ptr<Segment>* out);
  // Maps an existing segment; fails unless it is exactly `bytes` long
  // (bytes == 0: any size).
  static attnResult_t open(const std::string& name, size_t bytes,
                           std::shared_ptr<Segment>* out);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  void* base() const { return base_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

  // Removes the name (idempotent; ENOENT is fine: the peer got there first).
  void unlink();

 private:
  Segment(std::string name, void* base, size_t size, bool ownsName)
      : name_(std::move(name)), base_(base), size_(size), linked_(ownsName) {}

  std::string name_;
  void* base_;
  size_t size_;
  bool linked_;  // we created the name and have not unlinked it yet
};

}  // namespace attn::shm
