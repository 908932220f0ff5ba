// The receiver's view of a peer process's shareable regions (attnMemAlloc):
// maps a region the first time a message from it arrives, by opening the
// peer's memfd through /proc/<pid>/fd, and keeps the mapping for the next
// messages. Least recently used mappings go first once more than
// `maxRegions` are held (a freed region stays mapped here until then: its
// memory lives while mapped, so a late read never faults).
//
// Anything odd (the descriptor is gone, names another file, is smaller than
// the slot says) makes lookup() return null and the caller copies with CMA
// instead; a peer whose regions cannot be opened at all is not asked again.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <utility>

#include "transports/shm/shm_header_check.h"

namespace attn::shm {

class PeerRegions {
 public:
  PeerRegions(pid_t pid, int peer, size_t maxRegions);
  ~PeerRegions();
  PeerRegions(const PeerRegions&) = delete;
  PeerRegions& operator=(const PeerRegions&) = delete;

  // Local address of the message the slot describes (region base + offset),
  // or null when it cannot be mapped (use CMA from s.addr). `s` is the
  // receiver's copy of the slot, so what is checked is what is used.
  const uint8_t* lookup(const SlotView& s);
  size_t mapped() const { return lru_.size(); }

 private:
  using Key = std::pair<int64_t, uint64_t>;  // (owner pid, serial)
  struct Mapping {
    Key key;
    uint8_t* base;
    size_t bytes;
  };
  const uint8_t* mapRegion(const SlotView& s);

  pid_t pid_;
  int peer_;
  size_t maxRegions_;
  bool refused_ = false;  // opening the peer's descriptors failed: use CMA
  std::list<Mapping> lru_;  // most recent first
  std::map<Key, std::list<Mapping>::iterator> byKey_;
};

}  // namespace attn::shm
