// Each host collective algorithm run on a communicator: the adapters from a
// public call's arguments to the engine-level algorithms of coll.h (which
// ring, rotated where, staged or not). coll_algorithms.cc lists them in its
// tables; their signatures are the rows' (coll_algorithms.h).
#pragma once

#include <cstddef>
#include <vector>

#include "attncomm.h"
#include "src/coll/algo_select.h"

struct attnComm;

namespace attn {

attnResult_t allGatherRing(attnComm* comm, char* buf, const std::vector<Block>& byRank, size_t esz);
attnResult_t allGatherHier(attnComm* comm, char* buf, const std::vector<Block>& byRank, size_t esz);
attnResult_t allGatherDirect(attnComm* comm, char* buf, const std::vector<Block>& byRank, size_t esz);

attnResult_t reduceScatterRing(attnComm* comm, const char* in, char* out, const std::vector<Block>& byRank,
                               attnDataType_t type, attnRedOp_t op);
attnResult_t reduceScatterHier(attnComm* comm, const char* in, char* out, const std::vector<Block>& byRank,
                               attnDataType_t type, attnRedOp_t op);

attnResult_t broadcastTree(attnComm* comm, int root, char* buf, size_t bytes, size_t esz);
attnResult_t broadcastChain(attnComm* comm, int root, char* buf, size_t bytes, size_t esz);
attnResult_t broadcastDirect(attnComm* comm, int root, char* buf, size_t bytes, size_t esz);

attnResult_t reduceTree(attnComm* comm, int root, const char* in, char* out, size_t count,
                        attnDataType_t type, attnRedOp_t op);
attnResult_t reduceChain(attnComm* comm, int root, const char* in, char* out, size_t count,
                         attnDataType_t type, attnRedOp_t op);
attnResult_t reduceDirect(attnComm* comm, int root, const char* in, char* out, size_t count,
                          attnDataType_t type, attnRedOp_t op);
// Reduce-scatter (ATTN_ALGO's algorithm) then a gather of the slices to the root.
attnResult_t reduceScatterGather(attnComm* comm, int root, const char* in, char* out, size_t count,
                                 attnDataType_t type, attnRedOp_t op);

attnResult_t allReduceDoubling(attnComm* comm, AlgoSetting s, const char* in, char* out, size_t count,
                               attnDataType_t type, attnRedOp_t op);
// Reduce-scatter then all-gather, each by ATTN_ALGO's algorithm.
attnResult_t allReduceScatter(attnComm* comm, AlgoSetting s, const char* in, char* out, size_t count,
                              attnDataType_t type, attnRedOp_t op);

}  // namespace attn
