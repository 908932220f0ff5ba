#include "transports/shm/shm_header_check.h"

namespace attn::shm {

ChannelView copyChannelHeader(const ChannelHeader& h) {
  // volatile: one read per field, never folded into a second one later.
  const volatile ChannelHeader& s = h;
  return ChannelView{s.magic, s.version, s.nslots, s.senderRank,
                     s.slotBytes, s.senderPid, s.totalBytes};
}

bool checkChannelHeader(const ChannelView& v, int senderRank, size_t mappedBytes,
                        ChannelLayout* layout, const char** why) {
  if (v.magic != kChannelMagic) return *why = "bad magic", false;
  if (v.version != kLayoutVersion) return *why = "another layout version", false;
  if (senderRank < 0 || v.senderRank != uint32_t(senderRank)) return *why = "another sender", false;
  if (v.nslots < kMinSlots || v.nslots > kMaxSlots) return *why = "slot count out of range", false;
  if (v.slotBytes < kMinSlotBytes || v.slotBytes > kMaxSlotBytes)
    return *why = "slot size out of range", false;
  ChannelLayout l;
  if (!ChannelLayout::fit(v.nslots, v.slotBytes, &l)) return *why = "layout overflows", false;
  if (v.totalBytes != mappedBytes || l.totalBytes != mappedBytes)
    return *why = "sizes do not match the segment", false;
  *layout = l;
  return true;
}

SlotView copySlotHeader(const SlotHeader& h) {
  const volatile SlotHeader& s = h;
  SlotView v{};
  v.msgIndex = s.msgIndex;
  v.msgBytes = s.msgBytes;
  v.offset = s.offset;
  v.chunkBytes = s.chunkBytes;
  v.kind = s.kind;
  // The rest lies on the header's second cache-line pair, which a small
  // message never needs (shm_layout.h): read only for direct messages.
  if (v.kind == kSlotInline) return v;
  v.regionFd = s.regionFd;
  v.addr = s.addr;
  v.regionPid = s.regionPid;
  v.regionSerial = s.regionSerial;
  v.regionBytes = s.regionBytes;
  v.regionOffset = s.regionOffset;
  return v;
}

const char* slotVerdictText(SlotVerdict v) {
  switch (v) {
    case SlotVerdict::kOk: return "ok";
    case SlotVerdict::kOutOfSequence: return "slot out of sequence";
    case SlotVerdict::kSizeChanged: return "message size changed between slots";
    case SlotVerdict::kTruncated: return "message longer than the receive";
    case SlotVerdict::kBadChunk: return "chunk outside its slot or message";
    case SlotVerdict::kDirectRefused: return "direct message to a ring-only receiver";
    case SlotVerdict::kBadKind: return "bad slot kind";
  }
  return "unknown";
}

SlotVerdict checkSlot(const SlotView& v, const SlotExpect& e) {
  if (v.msgIndex != e.msgIndex) return SlotVerdict::kOutOfSequence;
  if (!e.started) {
    if (v.offset != 0) return SlotVerdict::kOutOfSequence;
    if (v.msgBytes > e.capacity) return SlotVerdict::kTruncated;
  } else if (v.msgBytes != e.total) {
    return SlotVerdict::kSizeChanged;
  }
  const uint64_t got = e.started ? e.got : 0;
  if (got > v.msgBytes) return SlotVerdict::kBadChunk;  // the caller's state, never the peer's
  switch (v.kind) {
    case kSlotInline:
      // Every chunk moves the message on: an empty one only for an empty message.
      if (v.offset != got || v.chunkBytes > e.slotBytes || v.chunkBytes > v.msgBytes - got ||
          (v.chunkBytes == 0 && v.msgBytes != 0))
        return SlotVerdict::kBadChunk;
      return SlotVerdict::kOk;
    case kSlotDirect:
    case kSlotMapped:
      if (e.mode == kDirectNone) return SlotVerdict::kDirectRefused;
      if (e.started) return SlotVerdict::kBadKind;  // a direct message is one slot
      return SlotVerdict::kOk;
    default:
      return SlotVerdict::kBadKind;
  }
}

}  // namespace attn::shm
