// Pipelining of the hierarchical collectives. The data is cut into segments
// (every rank's block split the same way) and each level of the algorithm
// is a stage; in wave w, stage l works on segment w - l. Stages of one wave
// talk to different peers (each level's rail differs in one coordinate), so
// they run at once: the cross-host exchange of one segment proceeds while
// the host's shared-memory rings handle the segment before it, and the
// total approaches the slow link's time instead of the sum of the levels.
#pragma once

#include <functional>
#include <memory>

#include "src/coll/coll.h"
#include "src/coll/coll_op.h"

namespace attn {

// How many segments for blocks of at most `maxBlockBytes`: ATTN_HIER_SEGMENTS
// if set (1 turns pipelining off), else about one per 256 KiB, at most 8.
int hierSegments(size_t maxBlockBytes);

// Segment s of `segments` of a block, cut on `align`-byte boundaries.
Block segmentOf(const Block& b, int s, int segments, size_t align);

// Runs stages x segments ops in waves; make(stage, segment) builds the op
// of one stage for one segment (called when its wave starts).
attnResult_t runWaves(Engine& e, int stages, int segments,
                      const std::function<std::unique_ptr<CollOp>(int stage, int segment)>& make);

}  // namespace attn
