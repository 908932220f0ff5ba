// Fixtures of the attnLevelAttention tests (host and device): contiguous
// placement, importance scores, and the reference over exactly the keys a
// rank should see, picked by the documented rule written out again here.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "attncomm.h"
#include "tests/support/attn_fixtures.h"

namespace attn_test {

// Full prefill of sequences of the given lengths, every sequence cut into
// nranks contiguous chunks, chunk r on rank r (CSPS's proximity-aware SPT
// allocation: near tokens on near ranks). Uneven lengths leave the last
// chunks shorter; `empty_rank` (>= 0) holds nothing at all.
Placement ContiguousPlacement(const AttnCase& c, int nranks, int empty_rank = -1);

std::shared_ptr<const AttnCase> PrefillCase(const std::string& name, const attnAttnConfig_t& cfg,
                                            const std::vector<int32_t>& lens, uint64_t seed);

// Random importance per global key row (continuous: ties have probability 0).
std::vector<float> RandomImportance(const AttnCase& c, uint64_t seed);

// The documented rule: round(keep * n), at least one when keep > 0.
int64_t ExpectedKept(int64_t n, float keep);

// The global key rows `peer` sends to a rank at keep fraction `keep`.
std::vector<int64_t> KeptFrom(const AttnCase& c, const Placement& pl, int peer, float keep,
                              const std::vector<float>& imp);

// The case restricted to the keys `rank` should see, with its reference
// recomputed over them. tierOf(a, b) is the tier between ranks a and b.
AttnCase ReferenceOverKeptKeys(const AttnCase& c, const Placement& pl, int rank, const float keep[4],
                               const std::vector<float>& imp, const std::function<int(int, int)>& tierOf);

}  // namespace attn_test
