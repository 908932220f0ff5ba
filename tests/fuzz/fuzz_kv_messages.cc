// The distributed KV cache's messages (src/attn/kv_wire.h): the exchange
// header, attnKvMigrate's moves, attnKvAttention's queries and
// attnKvPoolShrink's claims and answers. The first bytes say which parser
// and what this rank allows the peer; the rest is the message. Nothing may
// be sized by a peer's count before its bytes are there (the fuzzer's
// -malloc_limit_mb turns a large allocation into a finding), and what a
// parser accepts must stay within the limits and the bytes received.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "src/attn/kv_wire.h"
#include "src/core/datatype.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  const int which = data[0] % 5;
  attn::KvPeerLimits lim;
  lim.peer = 2;
  lim.what = "fuzz";
  lim.maxReleases = data[1];
  lim.maxMoves = data[2];
  lim.maxEntries = data[3];
  lim.numKvHeads = 1 + data[4] % 8;
  lim.headDim = 1 + data[5] % 128;
  const attnDataType_t types[] = {attnFloat32, attnBfloat16, attnFloat16};
  lim.dtype = types[data[6] % 3];
  const uint64_t maxBytes = uint64_t(data[7]) << 8;
  const size_t bytes = size - 8;
  std::unique_ptr<char[]> msg(new char[bytes ? bytes : 1]);
  if (bytes) std::memcpy(msg.get(), data + 8, bytes);
  const char* p = msg.get();

  switch (which) {
    case 0: {
      attn::KvExchangeHeader h;
      if (attn::parseKvExchangeHeader(p, bytes, lim.peer, maxBytes, lim.what, &h) == attnSuccess &&
          h.bytes > maxBytes)
        std::abort();
      break;
    }
    case 1: {
      attn::KvMigrateRequest r;
      if (attn::parseKvMigrateRequest(p, bytes, lim, &r) == attnSuccess &&
          (r.releases.size() > lim.maxReleases || r.moves.size() > lim.maxMoves))
        std::abort();
      break;
    }
    case 2: {
      attn::KvQueryRequest r;
      if (attn::parseKvQueryRequest(p, bytes, lim, &r) != attnSuccess) break;
      if (r.releases.size() > lim.maxReleases || r.entries.size() > lim.maxEntries) std::abort();
      // Every row the parser points at lies in the message.
      const size_t qRow = size_t(r.header.numQHeads) * size_t(lim.headDim) *
                          attn::dataTypeSize(lim.dtype);
      uint64_t sum = 0;  // every byte read: ASan sees a view past the message
      for (const auto& e : r.entries) {
        if (e.rows < 0) std::abort();
        for (int32_t i = 0; i < e.rows; ++i) {
          int32_t pos;
          std::memcpy(&pos, e.pos + 4 * size_t(i), 4);
          sum += uint32_t(pos);
        }
        for (size_t i = 0; i < size_t(e.rows) * qRow; ++i) sum += uint8_t(e.q[i]);
      }
      static volatile uint64_t sink;
      sink = sum;  // keeps the reads
      break;
    }
    case 3: {
      std::vector<std::pair<int64_t, int64_t>> claims;
      if (attn::parseKvClaims(p, bytes, lim.peer, lim.maxMoves, &claims) == attnSuccess &&
          claims.size() > lim.maxMoves)
        std::abort();
      break;
    }
    default: {
      std::vector<int64_t> ids;
      if (attn::parseKvLostList(p, bytes, lim.peer, lim.maxEntries, &ids) == attnSuccess &&
          ids.size() > lim.maxEntries)
        std::abort();
      break;
    }
  }
  return 0;
}
