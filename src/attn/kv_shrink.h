// attnKvPoolShrink: a KV pool follows its communicator through
// attnCommShrink, so the surviving ranks keep the KV they hold.
#pragma once

#include <cstdint>
#include <vector>

#include "attncomm.h"

struct attnComm;

namespace attn {

class KvPool;

// Collective over `shrunk` (made by attnCommShrink from the pool's
// communicator). localStatus != attnSuccess (this rank's bad input; `pool`
// may then be null) fails the call on every rank before anything moves.
// Then:
//   1. each rank moves its pool locally (KvPool::moveToShrunk);
//   2. each owner tells each holder which blocks of its requests it holds;
//      a holder frees the blocks no owner claims (a migration cut short by
//      the failure, a release not yet delivered) and answers with the
//      requests whose claimed blocks it lacks;
//   3. an owner releases those requests too.
// *lost receives the own requests dropped, in increasing order.
attnResult_t kvPoolShrink(KvPool* pool, attnComm* shrunk, attnResult_t localStatus, std::vector<int64_t>* lost);

}  // namespace attn
