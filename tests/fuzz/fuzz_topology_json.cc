// ATTN_TOPO_FILE: rank 0 reads the file and sends its text to every rank,
// which parses it and applies it to its fabric model. Neither the JSON
// reader nor the model loaders may crash, loop or allocate without bound on
// any text, and whatever they accept must dump and load back.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "topology/fabric_json.h"
#include "topology/fabric_model.h"
#include "topology/json.h"

namespace {

attn::RankPlace place(int rank, const char* host, const char* rack) {
  attn::RankPlace p;
  p.rank = rank;
  p.pid = 100 + rank;
  p.host = host;
  p.rack = rack;
  std::memset(&p.local, 0, sizeof(p.local));
  p.local.numaNodes = 2;
  p.local.numaNode = rank % 2;
  return p;
}

// Four ranks on two hosts, as a live communicator's model would be.
attn::FabricModel liveModel() {
  attn::FabricModel m;
  const char* hosts[] = {"a/boot1", "a/boot1", "b/boot2", "b/boot2"};
  for (int r = 0; r < 4; ++r) m.ranks.push_back(place(r, hosts[r], ""));
  attn::applyDefaultTiers(&m, attn::TransportSet{true, true, false});
  m.finalize();
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1 << 16)) return 0;  // files are read whole; size is not the point
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::string err;
  attn::JsonValue v;
  (void)attn::parseJson(text, &v, &err);

  attn::FabricModel live = liveModel();
  (void)attn::applyFabricOverrides(text, &live, &err);

  attn::FabricModel loaded = liveModel();
  if (attn::fabricFromJson(text, &loaded, &err)) {
    // A model that loaded must survive a dump and a reload.
    attn::FabricModel again = liveModel();
    std::string dumped = attn::fabricToJson(loaded);
    if (!attn::fabricFromJson(dumped, &again, &err)) std::abort();
    if (again.nranks() != loaded.nranks()) std::abort();
  }
  return 0;
}
