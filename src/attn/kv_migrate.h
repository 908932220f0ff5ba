// KV block migration between pools (Infinite-LLM §6.2): try_move, then move.
#pragma once

#include <cstdint>
#include <vector>

#include "attncomm.h"
#include "src/attn/kv_pool.h"

namespace attn {

// One block's K and V moving between this rank and a peer.
struct KvBlockTransfer {
  int peer;
  bool send;     // out of this rank's slot, else into it
  int64_t slot;
};

// How a move's K and V bytes travel: straight between the slots over the
// engine (host pools), or as a group of device sends and receives (device
// pools, kv_device.h: pulled GPU to GPU where cuda_ipc reaches the peer).
class KvBlockIo {
 public:
  virtual ~KvBlockIo() = default;
  // Moves every block of `blocks`. Per peer, a sender and its receiver list
  // their blocks in the same order (that of the try_move message). Returns
  // once every block has arrived here and no block sent from here is read
  // any more.
  virtual attnResult_t move(const std::vector<KvBlockTransfer>& blocks) = 0;
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
