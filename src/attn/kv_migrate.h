// KV block migration between pools (Infinite-LLM §6.2): try_move, then move.
#pragma once

#include <vector>

#include "attncomm.h"
#include "src/attn/kv_pool.h"

namespace attn {

// Where a move's K and V bytes are sent from and received into: the slots
// themselves (host pools), or pinned host copies of them (device pools,
// kv_device.h).
class KvBlockIo {
 public:
  virtual ~KvBlockIo() = default;
  // Host addresses of the K and V of `slots`, to send from.
  virtual attnResult_t sendFrom(const std::vector<int64_t>& slots, std::vector<const char*>* k,
                                std::vector<const char*>* v) = 0;
  // Host addresses to receive the K and V of `slots` into.
  virtual attnResult_t receiveInto(const std::vector<int64_t>& slots, std::vector<char*>* k,
                                   std::vector<char*>* v) = 0;
  // Everything receiveInto handed out has arrived.
  virtual attnResult_t received() = 0;
};

// Checks what needs no books: src is this rank, dst a peer, the owner src
// or dst, num_blocks >= 0. The error text names the move.
attnResult_t checkKvMovesShape(const KvPool& pool, const std::vector<attnKvMove_t>& moves);

// Checks this rank's moves against its pool (src is this rank, the owner is
// src or dst, enough blocks to move). The error text names the move.
attnResult_t checkKvMoves(KvPool& pool, const std::vector<attnKvMove_t>& moves);

// The collective: releases owed to peers are delivered, each move asks its
// destination to reserve the blocks (granted whole, first come first
// served, while free blocks last), and granted blocks are sent and freed
// here. granted[i]: the blocks moved for moves[i]. `localStatus` !=
// success (bad moves) fails the call on every rank, after the exchange
// that tells them.
attnResult_t kvMigrate(KvPool& pool, const std::vector<attnKvMove_t>& moves,
                       attnResult_t localStatus, std::vector<int64_t>* granted);

}  // namespace attn
