// Connection setup of the TCP transport: every rank listens, the listen
// addresses are all-gathered over the bootstrap, the lower rank of each pair
// dials the higher one K times, and every socket is authenticated both ways
// (tcp_wire.h, tcp_handshake.h: hello, challenge, proof, signed ack) before
// it carries data. The K sockets of one peer must all come from the source
// address of its first one; other claims are refused and logged.
#pragma once

#include <vector>

#include "src/core/socket.h"
#include "src/core/transport.h"
#include "transports/tcp/tcp_connection.h"

namespace attn::tcp {

struct PeerSockets {
  std::vector<int> fds;  // non-blocking, TCP_NODELAY, ready for data
  SocketAddress addr;    // the peer's listen address (for messages)
};

// Collective over all ranks (it all-gathers). out->at(i) serves peers[i].
// The peer lists must be symmetric: p in rank r's list <=> r in p's.
attnResult_t establishSockets(const TransportContext& ctx, const std::vector<int>& peers,
                              const TcpOptions& opt, std::vector<PeerSockets>* out);

}  // namespace attn::tcp
