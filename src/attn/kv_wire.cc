#include "src/attn/kv_wire.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include "src/core/checked_size.h"
#include "src/core/datatype.h"
#include "src/core/error.h"

namespace attn {
namespace {

constexpr uint64_t kListHeader = sizeof(uint32_t);

// A count read from a message: at most `max` (what this rank allows) and no
// more items of `itemBytes` than the message still holds.
attnResult_t checkCount(const KvPeerLimits& lim, const char* items, uint64_t count, uint64_t max,
                        size_t itemBytes, const WireIn& in) {
  if (count > max || count > in.remaining() / itemBytes)
    return setError(attnRemoteError, "%s: rank %d announced %llu %s; at most %llu can come from it (%zu bytes left)",
                    lim.what, lim.peer, (unsigned long long)count, items,
                    (unsigned long long)std::min<uint64_t>(max, in.remaining() / itemBytes), in.remaining());
  return attnSuccess;
}

attnResult_t truncated(const KvPeerLimits& lim, const char* part) {
  return setError(attnRemoteError, "%s: rank %d sent a truncated %s", lim.what, lim.peer, part);
}

// A u32 count and that many request ids, at most `max`.
attnResult_t parseIdList(WireIn& in, const KvPeerLimits& lim, const char* items, uint64_t max,
                         std::vector<int64_t>* out) {
  uint32_t count = 0;
  if (!in.get(&count)) return truncated(lim, items);
  ATTN_CHECK(checkCount(lim, items, count, max, sizeof(int64_t), in));
  out->resize(count);
  for (int64_t& id : *out) in.get(&id);
  return attnSuccess;
}

attnResult_t parseReleases(WireIn& in, const KvPeerLimits& lim, std::vector<int64_t>* out) {
  return parseIdList(in, lim, "releases", lim.maxReleases, out);
}

attnResult_t expectEnd(const WireIn& in, const KvPeerLimits& lim) {
  if (in.done()) return attnSuccess;
  return setError(attnRemoteError, "%s: rank %d sent %zu bytes past the end of its message", lim.what, lim.peer,
                  in.remaining());
}

// One query row's bytes (Hq x D in the pool's dtype), UINT64_MAX when it
// overflows.
uint64_t queryRowBytes(const KvPeerLimits& lim, int32_t numQHeads) {
  return satMul(satMul(uint64_t(numQHeads), uint64_t(lim.headDim)), dataTypeSize(lim.dtype));
}

}  // namespace

uint64_t kvMigrateRequestBound(const KvPeerLimits& lim) {
  return satAdd(satAdd(kListHeader, satMul(lim.maxReleases, sizeof(int64_t))),
                satAdd(kListHeader, satMul(lim.maxMoves, sizeof(TryMove))));
}

uint64_t kvQueryRequestBound(const KvPeerLimits& lim) {
  const uint64_t fixed =
      satAdd(satAdd(kListHeader, satMul(lim.maxReleases, sizeof(int64_t))), sizeof(KvQueryHeader));
  // Without a block of the peer's here, it may ask nothing; with one, the
  // rows of its queries are its call's (up to 2^31 - 1): no local bound.
  return lim.maxEntries == 0 ? fixed : UINT64_MAX;
}

attnResult_t parseKvExchangeHeader(const char* data, size_t bytes, int peer, uint64_t maxBytes, const char* what,
                                   KvExchangeHeader* out) {
  if (bytes != sizeof(KvExchangeHeader))
    return setError(attnRemoteError, "%s: rank %d sent a %zu-byte header, %zu expected", what, peer, bytes,
                    sizeof(KvExchangeHeader));
  KvExchangeHeader h;
  std::memcpy(&h, data, sizeof(h));
  if (h.status != attnSuccess)
    return setError(attnRemoteError, "%s: rank %d could not take part (%s; its own error says why)", what, peer,
                    h.status > 0 && h.status < attnNumResults ? attnGetErrorString(attnResult_t(h.status))
                                                              : "an unknown result code");
  if (h.bytes > maxBytes)
    return setError(attnRemoteError,
                    "%s: rank %d announced a %llu-byte message, more than this call can take from it "
                    "(%llu bytes)", what, peer, (unsigned long long)h.bytes, (unsigned long long)maxBytes);
  *out = h;
  return attnSuccess;
}

attnResult_t parseKvMigrateRequest(const char* data, size_t bytes, const KvPeerLimits& lim, KvMigrateRequest* out) {
  WireIn in(data, bytes);
  ATTN_CHECK(parseReleases(in, lim, &out->releases));
  uint32_t count = 0;
  if (!in.get(&count)) return truncated(lim, "move list");
  ATTN_CHECK(checkCount(lim, "moves", count, lim.maxMoves, sizeof(TryMove), in));
  out->moves.resize(count);
  for (TryMove& t : out->moves) in.get(&t);
  return expectEnd(in, lim);
}

KvQueryHeader kvQueryHeaderOf(const attnAttnConfig_t& cfg, int32_t numQHeads) {
  KvQueryHeader h{};
  h.numQHeads = numQHeads;
  h.causal = cfg.causal ? 1 : 0;
  h.scale = cfg.softmax_scale;
  h.windowLeft = cfg.window_left;
  h.windowRight = cfg.window_right;
  h.softcap = cfg.softcap;
  return h;
}

attnResult_t parseKvQueryRequest(const char* data, size_t bytes, const KvPeerLimits& lim, KvQueryRequest* out) {
  WireIn in(data, bytes);
  ATTN_CHECK(parseReleases(in, lim, &out->releases));
  KvQueryHeader& h = out->header;
  if (!in.get(&h)) return truncated(lim, "query header");
  out->entries.clear();
  out->rows = 0;
  if (h.entries == 0) return expectEnd(in, lim);
  if (h.numQHeads < 1 || h.numQHeads % lim.numKvHeads != 0 || !std::isfinite(h.scale) || h.scale < 0 ||
      (h.causal != 0 && h.causal != 1) || h.windowLeft < -1 || h.windowRight < -1 || !std::isfinite(h.softcap) ||
      h.softcap < 0)
    return setError(attnRemoteError,
                    "%s: rank %d sent queries with %d heads (the pool has %d kv heads), scale %g, causal %d, "
                    "window (%d, %d), softcap %g",
                    lim.what, lim.peer, h.numQHeads, lim.numKvHeads, double(h.scale), h.causal, h.windowLeft,
                    h.windowRight, double(h.softcap));
  ATTN_CHECK(checkCount(lim, "requests of queries", h.entries, lim.maxEntries, sizeof(QueryEntry), in));
  std::vector<QueryEntry> entries(h.entries);
  for (QueryEntry& en : entries) {
    in.get(&en);
    if (en.rows < 0 || out->rows + en.rows > INT32_MAX)
      return setError(attnRemoteError, "%s: rank %d sent %d query rows for request %lld (%lld before it)", lim.what,
                      lim.peer, en.rows, (long long)en.req, (long long)out->rows);
    out->rows += en.rows;
  }
  const uint64_t rowBytes = queryRowBytes(lim, h.numQHeads);
  out->entries.reserve(entries.size());
  for (const QueryEntry& en : entries) {
    KvQueryRows r;
    r.req = en.req;
    r.rows = en.rows;
    const uint64_t qBytes = satMul(uint64_t(en.rows), rowBytes);
    r.pos = in.take(size_t(en.rows) * sizeof(int32_t));
    r.q = r.pos && qBytes <= in.remaining() ? in.take(size_t(qBytes)) : nullptr;
    if (!r.pos || !r.q)
      return setError(attnRemoteError, "%s: rank %d sent fewer query rows than it announced (request %lld)",
                      lim.what, lim.peer, (long long)en.req);
    out->entries.push_back(r);
  }
  return expectEnd(in, lim);
}

attnResult_t parseKvClaims(const char* data, size_t bytes, int peer, uint64_t maxClaims,
                           std::vector<std::pair<int64_t, int64_t>>* out) {
  KvPeerLimits lim;
  lim.peer = peer;
  lim.what = "attnKvPoolShrink";
  WireIn in(data, bytes);
  uint32_t nreqs = 0;
  if (!in.get(&nreqs)) return truncated(lim, "block claim");
  ATTN_CHECK(checkCount(lim, "claimed requests", nreqs, maxClaims, sizeof(int64_t) + sizeof(uint32_t), in));
  out->clear();
  for (uint32_t q = 0; q < nreqs; ++q) {
    int64_t id = 0;
    uint32_t count = 0;
    if (!in.get(&id) || !in.get(&count)) return truncated(lim, "block claim");
    ATTN_CHECK(checkCount(lim, "claimed blocks", count, maxClaims - out->size(), sizeof(int64_t), in));
    for (uint32_t i = 0; i < count; ++i) {
      int64_t index = 0;
      in.get(&index);
      if (index < 0)
        return setError(attnRemoteError, "attnKvPoolShrink: rank %d claims block %lld of request %lld", peer,
                        (long long)index, (long long)id);
      out->emplace_back(id, index);
    }
  }
  return expectEnd(in, lim);
}

attnResult_t parseKvLostList(const char* data, size_t bytes, int peer, uint64_t maxIds, std::vector<int64_t>* out) {
  KvPeerLimits lim;
  lim.peer = peer;
  lim.what = "attnKvPoolShrink";
  WireIn in(data, bytes);
  ATTN_CHECK(parseIdList(in, lim, "lost requests", maxIds, out));
  return expectEnd(in, lim);
}

}  // namespace attn
