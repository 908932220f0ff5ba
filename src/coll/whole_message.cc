// A received message must be exactly as long as this rank expects: a
// shorter one means the ranks called the collective with different counts,
// which must fail with a clear error rather than leave stale bytes.
#include "src/coll/coll.h"
#include "src/core/error.h"

namespace attn {

attnResult_t checkWholeMessage(const Request& r, const char* coll, int peer, size_t bytes) {
  if (r.bytes == bytes) return attnSuccess;
  return setError(attnInvalidUsage,
                  "%s: peer %d sent %zu bytes where %zu were expected "
                  "(ranks called the collective with different counts?)",
                  coll, peer, r.bytes, bytes);
}

attnResult_t recvWholeMessage(Engine& e, int peer, void* buf, size_t bytes, const char* coll) {
  Request req;
  ATTN_CHECK(e.irecv(peer, buf, bytes, &req));
  ATTN_CHECK(e.wait(&req));
  return checkWholeMessage(req, coll, peer, bytes);
}

}  // namespace attn
