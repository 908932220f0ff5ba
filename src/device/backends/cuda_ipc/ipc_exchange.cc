#include "src/device/backends/cuda_ipc/ipc_exchange.h"

#include "src/coll/coll.h"
#include "src/core/error.h"

namespace attn::ipc {

attnResult_t exchangeBytes(Engine& e, const void* toPeer, void* fromPeer, size_t recordBytes) {
  const int n = e.nranks();
  std::vector<Block> blocks(n);
  for (int p = 0; p < n; ++p) blocks[p] = {p * recordBytes, recordBytes};
  return pairwiseAllToAllv(e, static_cast<const char*>(toPeer), blocks, static_cast<char*>(fromPeer),
                           blocks);
}

attnResult_t settle(Engine& e, attnResult_t mine, const char* what) {
  std::vector<int32_t> all;
  // A successful exchange sets no error, so this rank's own cause stays the
  // thread's text; a failed one (peer gone) is the more urgent news.
  ATTN_CHECK(allGatherRecord(e, int32_t(mine), &all));
  if (mine != attnSuccess) return mine;
  for (int r = 0; r < e.nranks(); ++r)
    if (all[r] != attnSuccess)
      return setError(attnRemoteError, "cuda_ipc %s: rank %d failed (%s); see its error", what, r,
                      attnGetErrorString(attnResult_t(all[r])));
  return attnSuccess;
}

}  // namespace attn::ipc
