// Topology entry points: proximity rank, splits by locality (on top of
// attnCommSplit), and dumps of the fabric model.
#include <cstring>
#include <string>

#include "src/core/api_call.h"
#include "topology/fabric_json.h"
#include "topology/fabric_model.h"
#include "topology/fabric_print.h"

namespace attn {
attnResult_t commSplit(attnComm* comm, int color, int64_t key, attnComm_t* newcomm,
                       attnConfig_t* config);
}

using namespace attn;

namespace {
attnResult_t checkFabric(attnComm* comm) {
  ATTN_CHECK(checkCommUsable(comm));
  if (!comm->fabric) return setError(attnInternalError, "communicator has no fabric model");
  return attnSuccess;
}
}  // namespace

extern "C" attnResult_t attnCommTopoRank(attnComm_t comm, int* topoRank) {
  return guardedEntry([&]() -> attnResult_t {
    ApiCall call(comm);
    ATTN_CHECK(call.finish(call.check()));
    if (topoRank == nullptr) return call.finish(setError(attnInvalidArgument, "topoRank is NULL"));
    ATTN_CHECK(call.finish(checkFabric(comm)));
    *topoRank = comm->fabric->topoRank(comm->rank);
    return attnSuccess;
  });
}

extern "C" attnResult_t attnCommSplitType(attnComm_t comm, int type, int key, attnComm_t* newcomm,
                                          attnConfig_t* config) {
  return guardedEntry([&]() -> attnResult_t {
    ApiCall call(comm);
    if (newcomm == nullptr) return call.finish(setError(attnInvalidArgument, "newcomm is NULL"));
    *newcomm = nullptr;
    ATTN_CHECK(call.finish(call.check()));
    ATTN_CHECK(call.finish(checkFabric(comm)));
    const FabricModel& m = *comm->fabric;
    const ProximityGroups& g = m.groups();
    const int me = comm->rank;
    int color = 0;
    switch (type) {
      case attnSplitTypeHost: color = g.hostOf[size_t(me)]; break;
      case attnSplitTypeRack: color = g.rackOf[size_t(me)]; break;
      case attnSplitTypeProximity: color = 0; break;
      case attnSplitTypeHostLeaders:
        color = g.hostLeaders[size_t(g.hostOf[size_t(me)])] == me ? 0 : ATTN_SPLIT_NOCOLOR;
        break;
      default:
        return call.finish(setError(attnInvalidArgument,
                                    "split type %d is not one of attnSplitTypeHost (0), HostLeaders "
                                    "(1), Rack (2), Proximity (3)", type));
    }
    // Order by the caller's key, then by proximity.
    const int64_t key64 = (int64_t(key) << 32) | int64_t(m.topoRank(me));
    return call.finish(commSplit(comm, color, key64, newcomm, config));
  });
}

extern "C" attnResult_t attnCommTopoDump(attnComm_t comm, int format, char* buf, size_t* size) {
  return guardedEntry([&]() -> attnResult_t {
    ApiCall call(comm);
    ATTN_CHECK(call.finish(call.check()));
    if (size == nullptr) return call.finish(setError(attnInvalidArgument, "size is NULL"));
    ATTN_CHECK(call.finish(checkFabric(comm)));
    std::string text;
    switch (format) {
      case attnTopoFormatText: text = fabricToText(*comm->fabric); break;
      case attnTopoFormatDot: text = fabricAsGraphviz(*comm->fabric); break;
      case attnTopoFormatJson: text = fabricToJson(*comm->fabric); break;
      default:
        return call.finish(setError(attnInvalidArgument,
                                    "format %d is not attnTopoFormatText (0), Dot (1) or Json (2)", format));
    }
    const size_t need = text.size() + 1;
    if (buf == nullptr) {
      *size = need;
      return attnSuccess;
    }
    if (*size < need) {
      size_t cap = *size;
      *size = need;
      return call.finish(setError(attnInvalidArgument, "buffer of %zu bytes is too small: the dump needs %zu",
                                  cap, need));
    }
    std::memcpy(buf, text.c_str(), need);
    *size = need;
    return attnSuccess;
  });
}
