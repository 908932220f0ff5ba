// The messages of the distributed KV cache's collectives, and their parsers.
// Every parser is a pure function of (bytes, length, what this rank allows
// the peer): no books, no communicator, so a libFuzzer harness can drive
// it. A message that is malformed, or asks for more than the limits allow,
// is attnRemoteError naming the peer; nothing is sized by a count before
// the bytes it describes are known to be there.
//
//   exchange header   {status, reserved, bytes}            (kv_exchange.h)
//   attnKvMigrate     releases | u32 n | TryMove[n]
//   attnKvAttention   releases | KvQueryHeader | QueryEntry[entries] |
//                     per entry: pos[rows] (i32), q[rows, Hq, D]
//   attnKvPoolShrink  claims: u32 nreqs | {i64 req, u32 n, i64 index[n]}...
//                     answers: u32 n | i64 req[n]
//   releases          u32 n | i64 req[n]
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "attncomm.h"

namespace attn {

// A little writer/reader for payloads of plain values.
class WireOut {
 public:
  template <typename T>
  void put(const T& v) {
    const char* p = reinterpret_cast<const char*>(&v);
    buf_.insert(buf_.end(), p, p + sizeof(T));
  }
  void putBytes(const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    buf_.insert(buf_.end(), c, c + n);
  }
  std::vector<char>& bytes() { return buf_; }

 private:
  std::vector<char> buf_;
};

class WireIn {
 public:
  WireIn(const char* data, size_t bytes) : p_(data), end_(data + bytes) {}
  template <typename T>
  bool get(T* v) {
    if (size_t(end_ - p_) < sizeof(T)) return false;
    std::memcpy(v, p_, sizeof(T));
    p_ += sizeof(T);
    return true;
  }
  // Points at the next n bytes (no copy); null when fewer remain.
  const char* take(size_t n) {
    if (size_t(end_ - p_) < n) return nullptr;
    const char* at = p_;
    p_ += n;
    return at;
  }
  bool done() const { return p_ == end_; }
  size_t remaining() const { return size_t(end_ - p_); }

 private:
  const char* p_;
  const char* end_;
};

struct KvExchangeHeader {
  int32_t status;
  int32_t reserved;
  uint64_t bytes;
};

struct TryMove {
  int32_t owner;
  int32_t reserved;
  int64_t req;
  int64_t blocks;
};

// What a peer's queries ask of one of its requests here.
struct KvQueryHeader {
  int32_t numQHeads;
  int32_t causal;
  float scale;
  uint32_t entries;
  int32_t windowLeft, windowRight;  // attnAttnConfig_t's: -1 unbounded
  float softcap;                    // 0: none
};
// The header of a call with config `cfg` and `numQHeads` query heads.
KvQueryHeader kvQueryHeaderOf(const attnAttnConfig_t& cfg, int32_t numQHeads);

struct QueryEntry {
  int64_t req;
  int32_t rows;
  int32_t reserved;
};

// What this rank takes from one peer in one call.
struct KvPeerLimits {
  int peer = -1;                 // errors name it
  const char* what = "";         // the call, e.g. "attnKvMigrate"
  uint64_t maxReleases = 0;      // releases it may owe us
  uint64_t maxMoves = 0;         // attnKvMigrate: moves it may ask of us
  uint64_t maxEntries = 0;       // attnKvAttention: its requests with blocks here
  int numKvHeads = 1;            // the pool's layout (a query row's size)
  int headDim = 1;
  attnDataType_t dtype = attnFloat32;
};

// The most bytes each message may have under `lim` (UINT64_MAX when its
// size has no bound this rank knows: the query rows of requests it holds
// blocks of, up to the API's 2^31 - 1 per rank).
uint64_t kvMigrateRequestBound(const KvPeerLimits& lim);
uint64_t kvQueryRequestBound(const KvPeerLimits& lim);

// The exchange's fixed header from `peer`: its status (a failure there
// names it) and its payload size, at most maxBytes.
attnResult_t parseKvExchangeHeader(const char* data, size_t bytes, int peer, uint64_t maxBytes,
                                   const char* what, KvExchangeHeader* out);

struct KvMigrateRequest {
  std::vector<int64_t> releases;
  std::vector<TryMove> moves;
};
attnResult_t parseKvMigrateRequest(const char* data, size_t bytes, const KvPeerLimits& lim,
                                   KvMigrateRequest* out);

// One request's queries in a parsed message: pointers into its bytes.
struct KvQueryRows {
  int64_t req = 0;
  int32_t rows = 0;
  const char* pos = nullptr;  // rows x int32, not aligned
  const char* q = nullptr;    // rows x numQHeads x headDim in the pool's dtype
};
struct KvQueryRequest {
  std::vector<int64_t> releases;
  KvQueryHeader header{};
  std::vector<KvQueryRows> entries;
  int64_t rows = 0;  // all entries'
};
attnResult_t parseKvQueryRequest(const char* data, size_t bytes, const KvPeerLimits& lim, KvQueryRequest* out);

// attnKvPoolShrink: an owner's claims on this holder, (request, block index)
// pairs, at most maxClaims; and a holder's answer, at most maxIds requests.
attnResult_t parseKvClaims(const char* data, size_t bytes, int peer, uint64_t maxClaims,
                           std::vector<std::pair<int64_t, int64_t>>* out);
attnResult_t parseKvLostList(const char* data, size_t bytes, int peer, uint64_t maxIds, std::vector<int64_t>* out);

}  // namespace attn
