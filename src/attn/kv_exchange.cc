#include "src/attn/kv_exchange.h"

#include <cstdint>
#include <memory>
#include <new>

#include "src/attn/break_on_early_exit.h"
#include "src/core/error.h"

namespace attn {

attnResult_t exchangeWithPeers(Engine& e, int me, int n, const char* what,
                               attnResult_t localStatus, const std::vector<std::vector<char>>& out,
                               const std::vector<uint64_t>& maxBytes, PeerExchange* got) {
  using Header = KvExchangeHeader;
  got->in.clear();
  got->in.resize(size_t(n));
  got->arrival.clear();
  std::vector<Header> sendH(static_cast<size_t>(n)), recvH(static_cast<size_t>(n));
  std::unique_ptr<Request[]> hreq(new Request[2 * size_t(n)]);
  BreakOnEarlyExit headerGuard(e);
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    sendH[p] = {int32_t(localStatus), 0, localStatus == attnSuccess ? uint64_t(out[p].size()) : 0};
    ATTN_CHECK(e.irecv(p, &recvH[p], sizeof(Header), &hreq[2 * p]));
    ATTN_CHECK(e.isend(p, &sendH[p], sizeof(Header), &hreq[2 * p + 1]));
  }
  for (int p = 0; p < n; ++p)
    if (p != me) ATTN_CHECK(e.waitAll(&hreq[2 * p], 2));
  headerGuard.done();
  if (localStatus != attnSuccess) return localStatus;  // its own text stands
  // A peer that could not take part fails the call on every rank alike:
  // nobody sends a payload, and the communicator stays usable.
  for (int p = 0; p < n; ++p)
    if (p != me && recvH[p].status != attnSuccess)
      return parseKvExchangeHeader(reinterpret_cast<const char*>(&recvH[p]), sizeof(Header), p, 0, what, &recvH[p]);
  // From here a failure leaves peers sending payloads nobody receives: the
  // guard breaks the engine so that they fail now instead of waiting.
  BreakOnEarlyExit payloadGuard(e);
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    ATTN_CHECK(parseKvExchangeHeader(reinterpret_cast<const char*>(&recvH[p]), sizeof(Header), p, maxBytes[size_t(p)],
                                     what, &recvH[p]));
    if (recvH[p].bytes == 0) continue;
    got->in[p].buf.reset(new (std::nothrow) char[recvH[p].bytes]);
    if (!got->in[p].buf)
      return setError(attnSystemError, "%s: out of memory for the %llu bytes rank %d announced", what,
                      (unsigned long long)recvH[p].bytes, p);
    got->in[p].size = recvH[p].bytes;
  }
  std::unique_ptr<Request[]> preq(new Request[2 * size_t(n)]);
  std::vector<Request*> recvs;
  std::vector<int> from;
  std::vector<Request*> sends;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    if (recvH[p].bytes > 0) {
      ATTN_CHECK(e.irecv(p, got->in[p].buf.get(), got->in[p].size, &preq[2 * p]));
      recvs.push_back(&preq[2 * p]);
      from.push_back(p);
    }
    if (!out[p].empty()) {
      ATTN_CHECK(e.isend(p, out[p].data(), out[p].size(), &preq[2 * p + 1]));
      sends.push_back(&preq[2 * p + 1]);
    }
  }
  while (!recvs.empty()) {
    size_t i = 0;
    ATTN_CHECK(e.waitAny(recvs.data(), recvs.size(), &i));
    if (recvs[i]->bytes != got->in[from[i]].size)
      return setError(attnRemoteError, "%s: rank %d sent %zu bytes, announced %zu", what, from[i],
                      recvs[i]->bytes, got->in[from[i]].size);
    got->arrival.push_back(from[i]);
    recvs.erase(recvs.begin() + long(i));
    from.erase(from.begin() + long(i));
  }
  for (Request* s : sends) ATTN_CHECK(e.wait(s));
  payloadGuard.done();
  return attnSuccess;
}

}  // namespace attn
