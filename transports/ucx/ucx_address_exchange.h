// Worker addresses travel over the bootstrap at connect time.
#pragma once

#include <cstdint>
#include <vector>

#include "src/core/transport.h"

namespace attn::ucx {

// Collective over all ranks of ctx: gives every rank's worker address
// (variable length), all->at(r) for rank r (this rank's own included).
attnResult_t exchangeAddresses(const TransportContext& ctx, const std::vector<uint8_t>& mine,
                               std::vector<std::vector<uint8_t>>* all);

}  // namespace attn::ucx
