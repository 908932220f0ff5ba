// Addresses differ in length between ranks (transports, devices), and the
// bootstrap all-gathers fixed-size slots: first the lengths, then the
// addresses padded to the longest.
#include "transports/ucx/ucx_address_exchange.h"

#include <algorithm>
#include <cstring>

#include "src/core/bootstrap.h"
#include "src/core/error.h"

namespace attn::ucx {
namespace {
// Far above any real worker address (a few hundred bytes per device); a
// bigger claim means a corrupt exchange.
constexpr uint64_t kMaxAddressBytes = 1 << 20;
}  // namespace

attnResult_t exchangeAddresses(const TransportContext& ctx, const std::vector<uint8_t>& mine,
                               std::vector<std::vector<uint8_t>>* all) {
  if (!ctx.bootstrap) return setError(attnInternalError, "ucx: no bootstrap to exchange addresses");
  const int n = ctx.nranks;
  std::vector<uint64_t> lens(n, 0);
  lens[ctx.rank] = mine.size();
  ATTN_CHECK(ctx.bootstrap->allGather(lens.data(), sizeof(uint64_t)));
  uint64_t longest = 0;
  for (int r = 0; r < n; ++r) {
    if (lens[r] == 0 || lens[r] > kMaxAddressBytes)
      return setError(attnInvalidUsage, "ucx: rank %d published a worker address of %lu bytes",
                      r, (unsigned long)lens[r]);
    longest = std::max(longest, lens[r]);
  }
  std::vector<uint8_t> slots(size_t(n) * longest, 0);
  std::memcpy(slots.data() + size_t(ctx.rank) * longest, mine.data(), mine.size());
  ATTN_CHECK(ctx.bootstrap->allGather(slots.data(), longest));
  all->assign(n, {});
  for (int r = 0; r < n; ++r) {
    const uint8_t* p = slots.data() + size_t(r) * longest;
    (*all)[r].assign(p, p + lens[r]);
  }
  return attnSuccess;
}

}  // namespace attn::ucx
