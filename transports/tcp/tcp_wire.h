// Wire formats of the TCP transport.
//
// Connection setup: the lower rank dials the higher one K times; each socket
// starts with a TcpHello frame (length-prefixed, socket.h) proving the
// bootstrap secret and naming the communicator, ranks and socket index; the
// acceptor answers with a TcpAck frame.
//
// Data: every message is sent as one or more chunks, each a ChunkHeader
// followed by `len` payload bytes. Small messages are one chunk on one
// socket; large ones are split into stripes spread over the K sockets. The
// receiver matches `seq` (per direction, counting from 0) with its posted
// receives in order and writes each stripe at `offset` of the user buffer.
#pragma once

#include <cstdint>

namespace attn::tcp {

constexpr uint32_t kHelloMagic = 0x41745448;  // "AtTH"
constexpr uint32_t kAckMagic = 0x41745441;    // "AtTA"
constexpr uint32_t kWireVersion = 1;
constexpr int kMaxSockets = 64;

struct TcpHello {
  uint32_t magic;
  uint32_t version;
  uint8_t secret[16];
  uint64_t commHash;
  int32_t from;
  int32_t to;
  int32_t index;   // which of the nsocks sockets this is
  int32_t nsocks;  // chosen by the dialling (lower) rank
};

struct TcpAck {
  uint32_t magic;
  int32_t status;  // 0: accepted
};

struct ChunkHeader {
  uint64_t seq;     // message number in this direction
  uint64_t total;   // message size
  uint64_t offset;  // where this chunk's payload goes in the message
  uint64_t len;     // payload bytes following this header
};

}  // namespace attn::tcp
