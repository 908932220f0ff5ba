// Collective algorithms written on the engine's point-to-point primitives.
// One algorithm per file; each works on bytes laid out in blocks, so the
// public entry points (src/api/api_coll.cc) and the attention collectives
// can reuse them with any ring order and any block sizes.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "attncomm.h"
#include "src/core/engine.h"

namespace attn {

// A block of a buffer, in bytes.
struct Block {
  size_t offset = 0;
  size_t bytes = 0;
};

// A ring: ranks in ring order and this rank's position in it.
struct Ring {
  std::vector<int> ranks;
  int pos = 0;
  int size() const { return static_cast<int>(ranks.size()); }
  int at(int i) const { int n = size(); return ranks[((i % n) + n) % n]; }
  int next() const { return at(pos + 1); }
  int prev() const { return at(pos - 1); }
  static Ring identity(int rank, int nranks);
};

// attnInvalidUsage naming `coll` and `peer` unless the completed receive
// `r` brought exactly `bytes` (the ranks' counts differ otherwise).
attnResult_t checkWholeMessage(const Request& r, const char* coll, int peer, size_t bytes);
// Receives one message of exactly `bytes` from `peer` into `buf`.
attnResult_t recvWholeMessage(Engine& e, int peer, void* buf, size_t bytes, const char* coll);

// Pipeline granularity for large messages (ATTN_CHUNK_SIZE, bytes).
size_t chunkBytes(size_t elemSize);

// Ring all-gather, in place: blocks[i] (ring position i) of `buf` holds this
// rank's data at i == ring.pos; on return every block is filled.
attnResult_t ringAllGatherv(Engine& e, const Ring& ring, char* buf,
                            const std::vector<Block>& blocks, size_t chunk);

// Ring reduce-scatter: `in` holds every block (by ring position); `out`
// receives op over ranks of block ring.pos. `out` may alias that block of
// `in`. elemSize-aligned blocks. `staging` (2 x the largest block) is where
// partials land; null: the engine's scratch.
attnResult_t ringReduceScatterv(Engine& e, const Ring& ring, const char* in, char* out,
                                const std::vector<Block>& blocks, attnDataType_t type,
                                attnRedOp_t op, size_t chunk, char* staging = nullptr);

// The same two as step machines, to run beside other ops (coll_op.h).
// `blocks` and `ring` are copied; the buffers must outlive the op.
class CollOp;
std::unique_ptr<CollOp> makeRingAllGatherOp(Engine& e, const Ring& ring, char* buf,
                                            std::vector<Block> blocks, size_t chunk);
std::unique_ptr<CollOp> makeRingReduceScatterOp(Engine& e, const Ring& ring, const char* in, char* out,
                                                std::vector<Block> blocks, attnDataType_t type,
                                                attnRedOp_t op, size_t chunk, char* staging);

struct Hierarchy;  // src/coll/hierarchy.h

// Hierarchical all-gather over a regular hierarchy: from the outermost level
// in, each rank exchanges over its rail (the ranks sharing every coordinate
// but that level's) what it holds so far. `blocks[r]` is rank r's block of
// `buf` (global rank order); on entry `me`'s block holds its data.
attnResult_t hierAllGatherv(Engine& e, const Hierarchy& h, int me, char* buf,
                            const std::vector<Block>& blocks, size_t chunk);

// Hierarchical reduce-scatter, the mirror image: from the innermost level
// out, reduce-scatter over each level's group what is still to be reduced
// (partials staged in the engine's scratch). `blocks[r]` is rank r's block
// of `in`; `out` (may alias me's block of `in`) receives op over all ranks.
attnResult_t hierReduceScatterv(Engine& e, const Hierarchy& h, int me, const char* in, char* out,
                                const std::vector<Block>& blocks, attnDataType_t type,
                                attnRedOp_t op, size_t chunk);

// Binomial-tree reduce to ring position 0 (the root): log2(n) message
// steps, for small messages; `out` is written on the root only.
attnResult_t treeReduce(Engine& e, const Ring& ring, const char* in, char* out, size_t count,
                        attnDataType_t type, attnRedOp_t op);

// Recursive-doubling all-reduce over the ring's positions (every rank gets
// op over every rank's `in` in `out`, which may alias it): ceil(log2 n)
// exchanges of the whole buffer, for small messages. attnAvg is the
// caller's (sum, then divide).
attnResult_t doublingAllReduce(Engine& e, const Ring& ring, const char* in, char* out, size_t count,
                               attnDataType_t type, attnRedOp_t op);

// Direct reduce: every rank sends `in` to `root`, which folds the n inputs
// in rank order into `out` (may alias `in`); one message step, for small
// messages between few ranks. attnAvg is the caller's.
attnResult_t directReduce(Engine& e, int root, const char* in, char* out, size_t count, attnDataType_t type,
                          attnRedOp_t op);

// Pipelined chain broadcast from ring position 0 along the ring. On the
// root `buf` holds the data; elsewhere it receives it.
attnResult_t chainBroadcast(Engine& e, const Ring& ring, char* buf, size_t bytes, size_t chunk);
// Pipelined chain reduce of `count` elements towards ring position n-1 (the
// root), whose `out` (may alias `in`) receives op over every rank's `in`;
// `out` is not touched elsewhere. attnAvg is the caller's (sum, then
// divide). Partials wait in a window of chunk slots in the engine's scratch.
attnResult_t chainReduce(Engine& e, const Ring& ring, const char* in, char* out, size_t count,
                         attnDataType_t type, attnRedOp_t op, size_t chunk);
// Binomial-tree broadcast from ring position 0: ceil(log2 n) message
// steps, for small messages. On the root `buf` holds the data.
attnResult_t treeBroadcast(Engine& e, const Ring& ring, char* buf, size_t bytes);
// Direct broadcast: the root sends `bytes` from `src` to every rank at once;
// the others receive them into `buf`.
attnResult_t directBroadcast(Engine& e, int root, const char* src, char* buf, size_t bytes);

// How the pairwise all-to-all posts its exchanges: every peer at once
// (single-copy shm, where each receiver copies from all peers in
// parallel), or one pair of peers per step (TCP: fewer flows competing for
// the same cores and sockets). Ranks may differ: each pair exchanges one
// message each way either way.
enum class AllToAllSchedule { kConcurrent, kStepped };

// Pairwise all-to-all: sendBlocks[p] goes to rank p, recvBlocks[p] comes
// from rank p. Self block copied locally.
attnResult_t pairwiseAllToAllv(Engine& e, const char* send, const std::vector<Block>& sendBlocks,
                               char* recv, const std::vector<Block>& recvBlocks,
                               AllToAllSchedule schedule = AllToAllSchedule::kConcurrent);

// Dissemination barrier (ceil(log2 n) rounds of empty messages).
attnResult_t disseminationBarrier(Engine& e);

// Equal split of `count` elements into n blocks (the first count % n get one
// more element), in bytes.
std::vector<Block> splitEvenly(size_t count, int n, size_t elemSize);

}  // namespace attn
