// One directed channel (sender -> receiver) as this process sees it: the
// mapped segment and typed pointers into it. The sender creates it, the
// receiver attaches to it by name.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "attncomm.h"
#include "transports/shm/shm_layout.h"
#include "transports/shm/shm_segment.h"

namespace attn::shm {

struct Channel {
  std::shared_ptr<Segment> seg;
  ChannelHeader* hdr = nullptr;
  SlotHeader* slots = nullptr;
  uint8_t* data = nullptr;
  uint32_t nslots = 0;
  uint64_t slotBytes = 0;

  SlotHeader& slot(uint64_t i) const { return slots[i % nslots]; }
  uint8_t* slotData(uint64_t i) const { return data + (i % nslots) * slotBytes; }

  // Sender side: a fresh segment with an initialised header.
  static attnResult_t create(const std::string& name, int senderRank, uint32_t nslots,
                             uint64_t slotBytes, Channel* out);
  // Receiver side: maps the sender's segment and checks its header (once:
  // the sizes used are those checked, whatever the sender writes later).
  static attnResult_t attach(const std::string& name, int senderRank, Channel* out);

 private:
  void bind(std::shared_ptr<Segment> s, uint32_t slotCount, uint64_t bytesPerSlot);
};

}  // namespace attn::shm
