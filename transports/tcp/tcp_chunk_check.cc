#include "transports/tcp/tcp_chunk_check.h"

namespace attn::tcp {

const char* chunkVerdictText(ChunkVerdict v) {
  switch (v) {
    case ChunkVerdict::kOk: return "ok";
    case ChunkVerdict::kSeqBehind: return "not after the previous chunk on its socket";
    case ChunkVerdict::kSeqAhead: return "beyond the messages its socket may carry";
    case ChunkVerdict::kBadRange: return "range outside its message";
    case ChunkVerdict::kTotalChanged: return "size differs from its message's first chunk";
    case ChunkVerdict::kOverlap: return "overlaps another chunk of its message";
    case ChunkVerdict::kTooManyChunks: return "more chunks than sockets";
    case ChunkVerdict::kTruncated: return "message longer than the posted receive";
  }
  return "unknown";
}

ChunkVerdict SocketSeqWindow::admit(uint64_t seq, uint32_t index, uint32_t nsocks) {
  if (seq < next) return ChunkVerdict::kSeqBehind;
  // The first message from `next` on whose own number is this socket's:
  // its chunk must come here, so nothing after it may come first.
  const uint64_t k = nsocks == 0 ? 1 : nsocks;
  const uint64_t ahead = (index % k + k - next % k) % k;
  const uint64_t last = next > UINT64_MAX - ahead ? UINT64_MAX : next + ahead;
  if (seq > last) return ChunkVerdict::kSeqAhead;
  next = seq + 1;  // seq <= last < UINT64_MAX unless the peer sent 2^64 messages
  return ChunkVerdict::kOk;
}

bool MessageClaims::overlaps(uint64_t begin, uint64_t end) const {
  const uint32_t nInline = count_ < kInline ? count_ : kInline;
  for (uint32_t i = 0; i < nInline; ++i)
    if (begin < inline_[i].end && inline_[i].begin < end) return true;
  for (const Range& r : more_)
    if (begin < r.end && r.begin < end) return true;
  return false;
}

ChunkVerdict MessageClaims::claim(const ChunkHeader& h, uint64_t capacity, uint32_t maxChunks) {
  if (h.total == kUnknown) return ChunkVerdict::kBadRange;  // no buffer is that large
  if (total_ == kUnknown) {
    if (h.total > capacity) return ChunkVerdict::kTruncated;
  } else if (h.total != total_) {
    return ChunkVerdict::kTotalChanged;
  }
  // Written so that nothing wraps: len <= total, then offset <= total - len.
  if (h.len > h.total || h.offset > h.total - h.len) return ChunkVerdict::kBadRange;
  if (h.len == 0 && h.total != 0) return ChunkVerdict::kBadRange;
  if (count_ >= maxChunks) return ChunkVerdict::kTooManyChunks;
  // An empty message has one empty chunk; a second one is a duplicate.
  if (h.len == 0 ? count_ > 0 : overlaps(h.offset, h.offset + h.len)) return ChunkVerdict::kOverlap;
  total_ = h.total;
  claimed_ += h.len;  // disjoint ranges inside [0, total): never past total
  const Range r{h.offset, h.offset + h.len};
  if (count_ < kInline) inline_[count_] = r;
  else more_.push_back(r);
  ++count_;
  return ChunkVerdict::kOk;
}

}  // namespace attn::tcp
