// The tiers of a communicator, seen by the hierarchical collectives: ranks
// grouped by host inside racks, each rank placed by coordinates
// (local index in its host, host index in its rack, rack index).
//
// Built from plain per-rank keys so it is a pure function (unit-tested
// without a communicator). Tiers where every group has a single member are
// dropped, so "2 racks of 1 host of 4 ranks" has two levels (ranks in a
// host, hosts across racks), not three.
//
// The rail algorithms need a regular tree (every group of a level has the
// same number of members); an irregular one (3 ranks on one host, 1 on
// another) is reported as such and the callers use the flat ring, which in
// proximity order crosses every boundary the fewest times a ring can.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attn {

// Identity of a rank at each tier, outermost first (e.g. {rackHash,
// hostHash}); equal keys at a tier (and at every tier above) = same group.
using TierKeys = std::vector<uint64_t>;

struct Hierarchy {
  int nranks = 0;
  bool regular = false;
  // Members per group at each kept level, innermost first: shape[0] =
  // ranks per host, shape[1] = hosts per rack, ... (regular only).
  std::vector<int> shape;
  // Tier each kept level came from (0 = innermost input tier, ...).
  std::vector<int> tierOfLevel;
  // coords[r][k]: rank r's index at level k (regular only).
  std::vector<std::vector<int>> coords;
  // Rank at mixed-radix index sum_k coords[k] * stride[k], stride[0] = 1
  // (regular only).
  std::vector<int> rankAt;
  // Groups at each input tier (innermost tier first): how many, and the
  // largest; for the cost model and logs.
  std::vector<int> groupsPerTier;
  std::vector<int> maxGroupSizePerTier;

  int levels() const { return static_cast<int>(shape.size()); }
  // Rank at `c` (one coordinate per level).
  int rank(const std::vector<int>& c) const;
  // Does a hierarchical algorithm differ from the flat ring here? (more than
  // one group at some tier and some group with more than one member).
  bool worthwhile() const;
  // "2x4 (hosts x ranks)" style summary for logs.
  std::string describe() const;
};

// keys[r] = rank r's tier keys (outermost first, same length for every
// rank); order = the ranks in proximity order (groups keep the order of
// their first member in it; members keep their order in it).
Hierarchy buildHierarchy(const std::vector<TierKeys>& keys, const std::vector<int>& order);

// All-gather pieces: at level k the ring runs over the ranks that share every
// coordinate but k, once per combination of the outer coordinates
// ("slice"). Returns, for slice j of level k on `rank`, the ranks with
// `rank`'s inner coordinates, outer coordinates j and level-k coordinate
// 0..shape[k]-1. Slices enumerate outer coordinates with the innermost of
// them (k+1) most significant.
//
// Level k's ring always runs over `rank`'s own group (sliceMembers of
// sliceOf(rank, k)); slice j says whose blocks it carries: position m
// carries the block of sliceMembers(h, rank, k, j)[m].
int slicesAbove(const Hierarchy& h, int k);
std::vector<int> sliceMembers(const Hierarchy& h, int rank, int k, int slice);
// The slice of `rank`'s own outer coordinates at level k.
int sliceOf(const Hierarchy& h, int rank, int k);

}  // namespace attn
