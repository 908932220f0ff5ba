#include "topology/fabric_json.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "topology/json.h"

namespace attn {

namespace {

constexpr double kSchemaVersion = 1;
constexpr size_t kMaxFileBytes = 64u << 20;

// What a file says; fields absent from it stay unset.
struct FileTier {
  bool has = false, hasBw = false, hasLat = false;
  double bandwidth = 0, latency = 0;
  std::string source;
};
struct FileRank {
  int rank = -1;
  bool hasHost = false, hasRack = false;
  RankPlace place;
};
struct FabricFile {
  FileTier tiers[kTierCount];
  std::vector<std::pair<std::string, std::string>> hostRacks;  // host -> rack
  bool hasRanks = false;
  std::vector<FileRank> ranks;
};

class Reader {
 public:
  std::string err;

  bool fail(const std::string& where, const std::string& what) {
    err = where + ": " + what;
    return false;
  }
  bool expect(const JsonValue& v, JsonValue::Kind k, const std::string& where) {
    if (v.kind == k) return true;
    return fail(where, std::string("expected ") + JsonValue::kindName(k) + ", found " +
                           JsonValue::kindName(v.kind));
  }
  bool integer(const JsonValue& v, const std::string& where, long lo, long hi, long* out) {
    if (!expect(v, JsonValue::kNumber, where)) return false;
    if (v.number != std::floor(v.number) || v.number < double(lo) || v.number > double(hi))
      return fail(where, "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    *out = long(v.number);
    return true;
  }
  bool text(const JsonValue& v, const std::string& where, size_t cap, std::string* out) {
    if (!expect(v, JsonValue::kString, where)) return false;
    if (v.string.size() >= cap)
      return fail(where, "longer than " + std::to_string(cap - 1) + " characters");
    *out = v.string;
    return true;
  }

  bool tier(const JsonValue& v, const std::string& where, FileTier* t) {
    if (!expect(v, JsonValue::kObject, where)) return false;
    t->has = true;
    for (const auto& [k, x] : v.object) {
      std::string w = where + "." + k;
      if (k == "bandwidth_Bps") {
        if (!expect(x, JsonValue::kNumber, w)) return false;
        if (!(x.number > 0)) return fail(w, "must be > 0 (bytes per second)");
        t->hasBw = true, t->bandwidth = x.number;
      } else if (k == "latency_s") {
        if (!expect(x, JsonValue::kNumber, w)) return false;
        if (!(x.number >= 0) || x.number > 3600) return fail(w, "must be in [0, 3600] (seconds)");
        t->hasLat = true, t->latency = x.number;
      } else if (k == "source") {
        if (!text(x, w, 256, &t->source)) return false;
      } else {
        return fail(w, "unknown key (expected bandwidth_Bps, latency_s, source)");
      }
    }
    return true;
  }

  bool rank(const JsonValue& v, const std::string& where, FileRank* r) {
    if (!expect(v, JsonValue::kObject, where)) return false;
    LocalSummary& s = r->place.local;
    std::memset(&s, 0, sizeof(s));
    s.numaNode = -1;
    for (const auto& [k, x] : v.object) {
      std::string w = where + "." + k, str;
      long i = 0;
      if (k == "rank") {
        if (!integer(x, w, 0, 1 << 24, &i)) return false;
        r->rank = int(i);
      } else if (k == "host") {
        if (!text(x, w, 64, &r->place.host)) return false;
        r->hasHost = true;
      } else if (k == "rack") {
        if (!text(x, w, 64, &r->place.rack)) return false;
        r->hasRack = true;
      } else if (k == "pid") {
        if (!integer(x, w, 0, 1L << 40, &i)) return false;
        r->place.pid = i;
      } else if (k == "numa") {
        if (!integer(x, w, -1, 1 << 16, &i)) return false;
        s.numaNode = int32_t(i);
      } else if (k == "numa_nodes" || k == "bound_cpus" || k == "cores" || k == "gpus" ||
                 k == "nics" || k == "rdma_nics") {
        if (!integer(x, w, 0, 1 << 20, &i)) return false;
        int32_t* f = k == "numa_nodes" ? &s.numaNodes : k == "bound_cpus" ? &s.boundCpus
                   : k == "cores" ? &s.cores : k == "gpus" ? &s.gpuCount
                   : k == "nics" ? &s.nicCount : &s.rdmaNicCount;
        *f = int32_t(i);
      } else if (k == "numa_bound") {
        if (!expect(x, JsonValue::kBool, w)) return false;
        s.numaBound = x.boolean ? 1 : 0;
      } else if (k == "gpu") {
        if (!text(x, w, sizeof(s.gpuBusId), &str)) return false;
        std::memcpy(s.gpuBusId, str.c_str(), str.size() + 1);
      } else if (k == "nic") {
        if (!text(x, w, sizeof(s.bestNic), &str)) return false;
        std::memcpy(s.bestNic, str.c_str(), str.size() + 1);
      } else if (k == "nic_gbps") {
        if (!expect(x, JsonValue::kNumber, w)) return false;
        if (x.number < 0) return fail(w, "must be >= 0");
        s.bestNicGbps = x.number;
      } else {
        return fail(w, "unknown key");
      }
    }
    if (r->rank < 0) return fail(where, "missing \"rank\"");
    r->place.rank = r->rank;
    return true;
  }

  bool file(const std::string& text, FabricFile* f) {
    JsonValue root;
    std::string perr;
    if (!parseJson(text, &root, &perr)) return fail("malformed JSON", perr);
    if (!expect(root, JsonValue::kObject, "top level")) return false;
    for (const auto& [k, v] : root.object) {
      if (k == "attncomm_topology") {
        if (!expect(v, JsonValue::kNumber, k)) return false;
        if (v.number != kSchemaVersion)
          return fail(k, "schema version " + jsonNumber(v.number) + " is not supported (this library reads 1)");
      } else if (k == "comment") {
        // free text for people
      } else if (k == "tiers") {
        if (!expect(v, JsonValue::kObject, k)) return false;
        for (const auto& [name, t] : v.object) {
          Tier tier;
          if (!parseTierName(name, &tier))
            return fail("tiers." + name, "unknown tier (expected device, host, rack, cluster)");
          if (!this->tier(t, "tiers." + name, &f->tiers[int(tier)])) return false;
        }
      } else if (k == "hosts") {
        if (!expect(v, JsonValue::kObject, k)) return false;
        for (const auto& [host, h] : v.object) {
          std::string w = "hosts." + host;
          if (!expect(h, JsonValue::kObject, w)) return false;
          for (const auto& [hk, hv] : h.object) {
            std::string rack;
            if (hk != "rack") return fail(w + "." + hk, "unknown key (expected rack)");
            if (!this->text(hv, w + ".rack", 64, &rack)) return false;
            f->hostRacks.emplace_back(host, rack);
          }
        }
      } else if (k == "ranks") {
        if (!expect(v, JsonValue::kArray, k)) return false;
        f->hasRanks = true;
        for (size_t i = 0; i < v.array.size(); ++i) {
          f->ranks.emplace_back();
          if (!rank(v.array[i], "ranks[" + std::to_string(i) + "]", &f->ranks.back())) return false;
        }
      } else if (k == "order") {
        if (!expect(v, JsonValue::kArray, k)) return false;  // informational; recomputed
      } else {
        return fail(k, "unknown top-level key (expected attncomm_topology, comment, tiers, hosts, ranks, order)");
      }
    }
    return true;
  }
};

bool hostMatches(const std::string& pattern, const std::string& hostId) {
  return pattern == hostId || pattern == hostId.substr(0, hostId.find('/'));
}

void applyTiers(const FabricFile& f, FabricModel* m, const char* defaultSource) {
  for (int i = 0; i < kTierCount; ++i) {
    const FileTier& t = f.tiers[i];
    if (!t.has) continue;
    if (t.hasBw) m->tiers[i].bandwidth = t.bandwidth;
    if (t.hasLat) m->tiers[i].latency = t.latency;
    m->tiers[i].source = t.source.empty() ? defaultSource : t.source;
    m->tiers[i].fromFile = true;
  }
}

void applyHostRacks(const FabricFile& f, FabricModel* m) {
  for (const auto& [host, rack] : f.hostRacks)
    for (RankPlace& p : m->ranks)
      if (hostMatches(host, p.host)) p.rack = rack;
}

}  // namespace

std::string fabricToJson(const FabricModel& m) {
  std::ostringstream o;
  o << "{\n  \"attncomm_topology\": 1,\n  \"tiers\": {\n";
  for (int i = 0; i < kTierCount; ++i) {
    const TierLink& t = m.tiers[i];
    o << "    " << jsonQuote(tierName(Tier(i))) << ": {\"bandwidth_Bps\": " << jsonNumber(t.bandwidth)
      << ", \"latency_s\": " << jsonNumber(t.latency) << ", \"source\": " << jsonQuote(t.source) << "}"
      << (i + 1 < kTierCount ? "," : "") << "\n";
  }
  o << "  },\n  \"hosts\": {";
  std::set<std::string> seen;
  bool first = true;
  for (int r : m.order()) {
    const RankPlace& p = m.ranks[size_t(r)];
    if (!seen.insert(p.host).second) continue;
    o << (first ? "\n" : ",\n") << "    " << jsonQuote(p.host) << ": {\"rack\": " << jsonQuote(p.rack) << "}";
    first = false;
  }
  o << (first ? "},\n" : "\n  },\n") << "  \"ranks\": [\n";
  for (int r = 0; r < m.nranks(); ++r) {
    const RankPlace& p = m.ranks[size_t(r)];
    const LocalSummary& s = p.local;
    o << "    {\"rank\": " << r << ", \"host\": " << jsonQuote(p.host) << ", \"rack\": " << jsonQuote(p.rack)
      << ", \"pid\": " << p.pid << ", \"numa\": " << s.numaNode << ", \"numa_nodes\": " << s.numaNodes
      << ", \"numa_bound\": " << (s.numaBound ? "true" : "false") << ", \"bound_cpus\": " << s.boundCpus
      << ", \"cores\": " << s.cores << ", \"gpus\": " << s.gpuCount
      << ", \"gpu\": " << jsonQuote(std::string(s.gpuBusId, strnlen(s.gpuBusId, sizeof(s.gpuBusId))))
      << ", \"nics\": " << s.nicCount << ", \"rdma_nics\": " << s.rdmaNicCount
      << ", \"nic\": " << jsonQuote(std::string(s.bestNic, strnlen(s.bestNic, sizeof(s.bestNic))))
      << ", \"nic_gbps\": " << jsonNumber(s.bestNicGbps) << "}" << (r + 1 < m.nranks() ? "," : "") << "\n";
  }
  o << "  ],\n  \"order\": [";
  for (size_t i = 0; i < m.order().size(); ++i) o << (i ? ", " : "") << m.order()[i];
  o << "]\n}\n";
  return o.str();
}

bool fabricFromJson(const std::string& text, FabricModel* m, std::string* error) {
  FabricFile f;
  Reader rd;
  if (!rd.file(text, &f)) return *error = rd.err, false;
  if (!f.hasRanks || f.ranks.empty()) return *error = "ranks: missing or empty (a whole model needs them)", false;
  std::vector<RankPlace> ranks(f.ranks.size());
  std::vector<bool> seen(f.ranks.size(), false);
  for (const FileRank& r : f.ranks) {
    std::string w = "ranks: rank " + std::to_string(r.rank);
    if (size_t(r.rank) >= f.ranks.size())
      return *error = w + " is out of range for " + std::to_string(f.ranks.size()) + " ranks", false;
    if (seen[size_t(r.rank)]) return *error = w + " is listed twice", false;
    if (!r.hasHost || r.place.host.empty()) return *error = w + " has no host", false;
    seen[size_t(r.rank)] = true;
    ranks[size_t(r.rank)] = r.place;
  }
  m->ranks = std::move(ranks);
  m->selfRank = -1;
  m->localText.clear();
  applyTiers(f, m, "file");
  applyHostRacks(f, m);
  for (const FileRank& r : f.ranks)  // a rank's own rack beats its host's
    if (r.hasRack) m->ranks[size_t(r.rank)].rack = r.place.rack;
  m->finalize();
  return true;
}

bool applyFabricOverrides(const std::string& text, FabricModel* m, std::string* error) {
  FabricFile f;
  Reader rd;
  if (!rd.file(text, &f)) return *error = rd.err, false;
  for (const FileRank& r : f.ranks)
    if (r.rank >= m->nranks())
      return *error = "ranks: rank " + std::to_string(r.rank) + " does not exist in a communicator of " +
                      std::to_string(m->nranks()) + " ranks", false;
  applyTiers(f, m, "file");
  applyHostRacks(f, m);
  for (const FileRank& r : f.ranks)
    if (r.hasRack) m->ranks[size_t(r.rank)].rack = r.place.rack;
  m->finalize();
  return true;
}

bool readTextFile(const std::string& path, std::string* text, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return *error = "cannot open " + path + ": " + std::strerror(errno), false;
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return *error = "cannot read " + path, false;
  *text = ss.str();
  if (text->size() > kMaxFileBytes) return *error = path + " is larger than 64 MiB", false;
  return true;
}

}  // namespace attn
