// Direct broadcast: every rank reads the whole message straight from the
// root at once, instead of waiting for it to be forwarded down a chain. On
// one host between processes the root's data sits in shareable memory
// (staged there when it is not), so the N-1 reads are memcpy from mappings
// running in parallel; the chain would make N-1 CMA copies in sequence.
#include <memory>

#include "src/coll/coll.h"
#include "src/core/error.h"

namespace attn {

attnResult_t directBroadcast(Engine& e, int root, const char* src, char* buf, size_t bytes) {
  const int n = e.nranks(), me = e.rank();
  if (n == 1 || bytes == 0) return attnSuccess;
  if (me != root) return recvWholeMessage(e, root, buf, bytes, "broadcast");
  std::unique_ptr<Request[]> reqs(new Request[n - 1]);
  for (int s = 1; s < n; ++s) ATTN_CHECK(e.isend((root + s) % n, src, bytes, &reqs[s - 1]));
  return e.waitAll(reqs.get(), n - 1);
}

}  // namespace attn
