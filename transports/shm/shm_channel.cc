#include "transports/shm/shm_channel.h"

#include <unistd.h>

#include <new>

#include "src/core/error.h"

namespace attn::shm {

void Channel::bind(std::shared_ptr<Segment> s) {
  seg = std::move(s);
  auto* base = static_cast<uint8_t*>(seg->base());
  hdr = reinterpret_cast<ChannelHeader*>(base);
  ChannelLayout l = ChannelLayout::make(hdr->nslots, hdr->slotBytes);
  slots = reinterpret_cast<SlotHeader*>(base + l.slotHeadersOffset);
  data = base + l.dataOffset;
  nslots = hdr->nslots;
  slotBytes = hdr->slotBytes;
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
  out->bind(std::move(s));
  return attnSuccess;
}

attnResult_t Channel::attach(const std::string& name, int senderRank, Channel* out) {
  std::shared_ptr<Segment> s;
  ATTN_CHECK(Segment::open(name, 0, &s));
  if (s->size() < sizeof(ChannelHeader))
    return setError(attnInternalError, "shm: segment %s from peer %d is too small", name.c_str(),
                    senderRank);
  const auto* h = static_cast<const ChannelHeader*>(s->base());
  if (h->magic != kChannelMagic || h->version != kLayoutVersion ||
      h->senderRank != static_cast<uint32_t>(senderRank) || h->nslots < 1 ||
      h->totalBytes != s->size() ||
      ChannelLayout::make(h->nslots, h->slotBytes).totalBytes != s->size())
    return setError(attnInternalError,
                    "shm: segment %s from peer %d has a bad header (magic %#x, version %u)",
                    name.c_str(), senderRank, h->magic, h->version);
  out->bind(std::move(s));
  return attnSuccess;
}

}  // namespace attn::shm
