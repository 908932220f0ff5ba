#include "transports/shm/shm_channel.h"

#include <unistd.h>

#include <new>

#include "src/core/error.h"
#include "transports/shm/shm_header_check.h"

namespace attn::shm {

void Channel::bind(std::shared_ptr<Segment> s, uint32_t slotCount, uint64_t bytesPerSlot) {
  seg = std::move(s);
  auto* base = static_cast<uint8_t*>(seg->base());
  hdr = reinterpret_cast<ChannelHeader*>(base);
  ChannelLayout l = ChannelLayout::make(slotCount, bytesPerSlot);
  slots = reinterpret_cast<SlotHeader*>(base + l.slotHeadersOffset);
  data = base + l.dataOffset;
  nslots = slotCount;
  slotBytes = bytesPerSlot;
}

attnResult_t Channel::create(const std::string& name, int senderRank, uint32_t nslots,
                             uint64_t slotBytes, Channel* out) {
  ChannelLayout l = ChannelLayout::make(nslots, slotBytes);
  std::shared_ptr<Segment> s;
  ATTN_CHECK(Segment::create(name, l.totalBytes, &s));
  // Fresh segments are zero-filled: every atomic starts at 0 (kOpen, empty).
  auto* h = new (s->base()) ChannelHeader();
  h->magic = kChannelMagic;
  h->version = kLayoutVersion;
  h->nslots = nslots;
  h->senderRank = static_cast<uint32_t>(senderRank);
  h->slotBytes = slotBytes;
  h->senderPid = getpid();
  h->totalBytes = l.totalBytes;
  out->bind(std::move(s), nslots, slotBytes);
  return attnSuccess;
}

attnResult_t Channel::attach(const std::string& name, int senderRank, Channel* out) {
  std::shared_ptr<Segment> s;
  ATTN_CHECK(Segment::open(name, 0, &s));
  if (s->size() < sizeof(ChannelHeader))
    return setError(attnRemoteError, "shm: segment %s from peer %d is too small", name.c_str(),
                    senderRank);
  // One copy of the header, checked and used: the peer may rewrite it.
  const ChannelView v = copyChannelHeader(*static_cast<const ChannelHeader*>(s->base()));
  ChannelLayout layout;
  const char* why = "";
  if (!checkChannelHeader(v, senderRank, s->size(), &layout, &why))
    return setError(attnRemoteError,
                    "shm: segment %s from peer %d has a bad header (%s: magic %#x, version %u, "
                    "%u slots of %llu bytes, %llu bytes in all, segment %zu bytes)",
                    name.c_str(), senderRank, why, v.magic, v.version, v.nslots,
                    (unsigned long long)v.slotBytes, (unsigned long long)v.totalBytes, s->size());
  out->bind(std::move(s), v.nslots, v.slotBytes);
  return attnSuccess;
}

}  // namespace attn::shm
