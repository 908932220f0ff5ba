// The receive side's checks of chunk headers (tcp_wire.h), apart from the
// sockets: pure functions of a header and the little state it is checked
// against, so a fuzzer can drive them without a connection.
//
// A header from the peer is trusted for nothing until it passes both:
//   - SocketSeqWindow: its seq is one the socket may carry next (above the
//     socket's previous chunk, not beyond the next message whose first stripe
//     belongs on this socket);
//   - MessageClaims: its range lies inside the message, the message's size is
//     the one its first chunk gave and fits the posted receive, and the range
//     overlaps no other chunk of the message. So a message's chunks claim
//     disjoint ranges, their bytes add up to at most its size, and the
//     message is complete exactly when every claimed byte has arrived: no
//     chunk can still be writing into a message that finished.
#pragma once

#include <cstdint>
#include <vector>

#include "transports/tcp/tcp_wire.h"

namespace attn::tcp {

enum class ChunkVerdict : uint8_t {
  kOk,
  kSeqBehind,      // not above the previous chunk on its socket (duplicate, reordered)
  kSeqAhead,       // beyond the messages its socket may carry next
  kBadRange,       // offset/len outside [0, total), or empty in a non-empty message
  kTotalChanged,   // total differs from the message's earlier chunks
  kOverlap,        // overlaps bytes another chunk of the message claimed
  kTooManyChunks,  // more chunks than the connection has sockets
  kTruncated,      // the message is longer than the posted receive
};

// "overlaps another chunk of its message", ... (for error messages).
const char* chunkVerdictText(ChunkVerdict v);

// The seqs socket `index` of `nsocks` may carry next. Stripe j of message m
// travels on socket (m + j) % nsocks, so every message has a chunk on the
// socket of its own number; a socket's chunks come in increasing seq order.
struct SocketSeqWindow {
  uint64_t next = 0;  // lowest seq its next chunk may carry

  // kOk (and the window moves past seq), kSeqBehind or kSeqAhead.
  ChunkVerdict admit(uint64_t seq, uint32_t index, uint32_t nsocks);
};

// The ranges of one message that its accepted chunks claimed.
class MessageClaims {
 public:
  static constexpr uint64_t kUnknown = UINT64_MAX;

  // Checks h (whose seq names this message) against a receive of `capacity`
  // bytes and the chunks accepted so far, at most maxChunks in all; claims
  // its range when the answer is kOk. Nothing changes otherwise.
  ChunkVerdict claim(const ChunkHeader& h, uint64_t capacity, uint32_t maxChunks);

  uint64_t total() const { return total_; }  // kUnknown before the first chunk
  uint64_t claimed() const { return claimed_; }

 private:
  struct Range {
    uint64_t begin, end;
  };
  bool overlaps(uint64_t begin, uint64_t end) const;

  // Inline ranges cover up to four sockets (two by default); a message
  // striped wider (several stripe minimums, so megabytes) spills to `more_`:
  // one allocation per such message, none per chunk.
  static constexpr uint32_t kInline = 4;
  uint64_t total_ = kUnknown;
  uint64_t claimed_ = 0;
  uint32_t count_ = 0;
  Range inline_[kInline];
  std::vector<Range> more_;
};

}  // namespace attn::tcp
