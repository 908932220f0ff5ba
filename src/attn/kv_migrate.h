// KV block migration between pools (Infinite-LLM §6.2): try_move, then move.
#pragma once

#include <vector>

#include "attncomm.h"
#include "src/attn/kv_pool.h"

namespace attn {

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
