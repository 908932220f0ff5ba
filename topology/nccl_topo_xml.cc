// NCCL topology XML -> MachineView. The grammar is NCCL's (src/graph/xml.cc,
// topo.cc): <system version="1"> holds <cpu numaid affinity>, which holds
// <pci busid class> trees and <nic>; a <pci> with a <nic><net name speed>
// child, or of class 0x02.., is a NIC; class 0x03.. is a GPU; any other
// <pci> is a bridge/switch whose children sit below it. Unknown elements and
// attributes are skipped, as NCCL does, but still count against the bounds.
#include "topology/nccl_topo_xml.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#if ATTN_HAVE_LIBXML2
#include <libxml/parser.h>
#include <libxml/tree.h>
#endif

namespace attn {

using L = NcclTopoLimits;

bool parseCpuMask(const std::string& mask, std::vector<int>* cpus) {
  std::vector<std::string> words;
  size_t start = 0;
  while (true) {
    size_t comma = mask.find(',', start);
    words.push_back(mask.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (words.size() * 32 > size_t(L::kMaxCpus)) return false;
  cpus->clear();
  for (size_t w = 0; w < words.size(); ++w) {
    const std::string& s = words[w];
    if (s.empty() || s.size() > 8) return false;
    unsigned long v = 0;
    for (char c : s) {
      if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
      v = v * 16 + unsigned(std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : std::tolower(c) - 'a' + 10);
    }
    int base = int(words.size() - 1 - w) * 32;  // the last word holds CPUs 0-31
    for (int b = 0; b < 32; ++b)
      if (v >> b & 1ul) cpus->push_back(base + b);
  }
  std::sort(cpus->begin(), cpus->end());
  return true;
}

bool loadNcclTopoFile(const std::string& path, MachineView* out, std::string* err) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    *err = path + ": cannot open: " + std::strerror(errno);
    return false;
  }
  std::string text(L::kMaxBytes + 1, '\0');
  f.read(text.data(), std::streamsize(text.size()));
  text.resize(size_t(f.gcount()));
  if (text.size() > L::kMaxBytes) {
    *err = path + ": larger than " + std::to_string(L::kMaxBytes) + " bytes; not an NCCL topology file";
    return false;
  }
  return parseNcclTopoXml(text, path, out, err);
}

#if ATTN_HAVE_LIBXML2

bool ncclTopoXmlAvailable() { return true; }

namespace {

bool isName(const char* n, const char* want) { return std::strcmp(n, want) == 0; }

// "0000:17:00.0" with a 4-8 digit domain; lower-cased.
bool normalizeBusId(const std::string& in, std::string* out) {
  size_t colon = in.find(':');
  if (colon < 4 || colon > 8 || in.size() != colon + 8) return false;
  std::string s = in;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = char(std::tolower(static_cast<unsigned char>(s[i])));
    bool sep = i == colon || i == colon + 3 || i == colon + 6;
    char want = i == colon + 6 ? '.' : ':';
    if (sep ? c != want : !std::isxdigit(static_cast<unsigned char>(c))) return false;
    s[i] = c;
  }
  *out = s;
  return true;
}

bool parseInt(const std::string& s, long lo, long hi, long* v) {
  if (s.empty() || s.size() > 20) return false;
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(s.c_str(), &end, 10);
  if (errno || *end || x < lo || x > hi) return false;
  *v = x;
  return true;
}

// "0x030200": PCI class, subclass, interface (NCCL matches on prefixes).
bool isHexClass(const std::string& s) {
  if (s.size() < 3 || s.size() > 10 || s[0] != '0' || (s[1] != 'x' && s[1] != 'X')) return false;
  return std::all_of(s.begin() + 2, s.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
}

bool isPlainName(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && !std::strchr("_-.:", c)) return false;
  return true;
}

using Attrs = std::map<std::string, std::string>;

// Walks the document once, building the device tree (parents and depths, to
// measure GPU-NIC distances) and the MachineView.
class Walker {
 public:
  Walker(const std::string& name, MachineView* m) : name_(name), m_(m) {}

  bool run(xmlNode* root) {
    Attrs a;
    if (!enter(root, 0, &a)) return false;
    if (!isName(name(root), "system"))
      return fail(root, "root element is <" + std::string(name(root)) + ">, expected <system>");
    auto v = a.find("version");
    if (v == a.end()) return fail(root, "<system> has no version attribute");
    if (v->second != "1") return fail(root, "<system version=\"" + v->second + "\">: only version 1 is known");
    int sys = addNode(-1);
    for (xmlNode* c = root->children; c; c = c->next) {
      if (c->type != XML_ELEMENT_NODE) continue;
      if (!(isName(name(c), "cpu") ? cpu(c, sys, 1) : skip(c, 1))) return false;
    }
    finish();
    return true;
  }

  std::string err;

 private:
  static const char* name(const xmlNode* n) { return reinterpret_cast<const char*>(n->name); }

  bool fail(const xmlNode* n, const std::string& msg) {
    err = name_ + ":" + std::to_string(xmlGetLineNo(const_cast<xmlNode*>(n))) + ": " + msg;
    return false;
  }

  // Every element passes here: bounds on count, depth and attributes.
  bool enter(xmlNode* n, int depth, Attrs* attrs) {
    if (++elements_ > L::kMaxElements)
      return fail(n, "more than " + std::to_string(L::kMaxElements) + " elements");
    if (depth > L::kMaxDepth) return fail(n, "nested deeper than " + std::to_string(L::kMaxDepth) + " levels");
    int count = 0;
    for (xmlAttr* a = n->properties; a; a = a->next) {
      if (++count > L::kMaxAttrs)
        return fail(n, "<" + std::string(name(n)) + "> has more than " + std::to_string(L::kMaxAttrs) + " attributes");
      xmlChar* raw = xmlNodeListGetString(n->doc, a->children, 1);
      std::string value = raw ? reinterpret_cast<const char*>(raw) : "";
      if (raw) xmlFree(raw);
      std::string key = reinterpret_cast<const char*>(a->name);
      if (value.size() > L::kMaxAttrLen)
        return fail(n, "attribute " + key + " is longer than " + std::to_string(L::kMaxAttrLen) + " bytes");
      (*attrs)[key] = value;
    }
    return true;
  }

  bool skip(xmlNode* n, int depth) {
    Attrs a;
    if (!enter(n, depth, &a)) return false;
    for (xmlNode* c = n->children; c; c = c->next)
      if (c->type == XML_ELEMENT_NODE && !skip(c, depth + 1)) return false;
    return true;
  }

  int addNode(int parent) {
    parent_.push_back(parent);
    depth_.push_back(parent < 0 ? 0 : depth_[size_t(parent)] + 1);
    return int(parent_.size()) - 1;
  }

  bool cpu(xmlNode* n, int sys, int depth) {
    Attrs a;
    if (!enter(n, depth, &a)) return false;
    long numa = 0;
    auto id = a.find("numaid");
    if (id == a.end()) return fail(n, "<cpu> has no numaid attribute");
    if (!parseInt(id->second, 0, L::kMaxNumaId, &numa))
      return fail(n, "<cpu numaid=\"" + id->second + "\">: not a NUMA node number (0-" +
                         std::to_string(L::kMaxNumaId) + ")");
    for (const NumaInfo& x : m_->numa)
      if (x.os == numa) return fail(n, "<cpu numaid=\"" + id->second + "\"> appears twice");
    if (int(m_->numa.size()) >= L::kMaxNuma)
      return fail(n, "more than " + std::to_string(L::kMaxNuma) + " NUMA nodes");
    NumaInfo info;
    info.os = int(numa);
    auto aff = a.find("affinity");
    if (aff != a.end() && !parseCpuMask(aff->second, &info.cpus))
      return fail(n, "<cpu affinity=\"" + aff->second + "\">: not a CPU mask (hex words, comma-separated, at most " +
                         std::to_string(L::kMaxCpus) + " CPUs)");
    m_->numa.push_back(info);
    int node = addNode(sys);
    for (xmlNode* c = n->children; c; c = c->next) {
      if (c->type != XML_ELEMENT_NODE) continue;
      bool ok = isName(name(c), "pci")   ? pci(c, node, int(numa), depth + 1)
                : isName(name(c), "nic") ? nic(c, node, int(numa), "", "", depth + 1)
                                         : skip(c, depth + 1);
      if (!ok) return false;
    }
    return true;
  }

  bool pci(xmlNode* n, int parent, int numa, int depth) {
    Attrs a;
    if (!enter(n, depth, &a)) return false;
    std::string busId, cls;
    auto b = a.find("busid");
    if (b == a.end()) return fail(n, "<pci> has no busid attribute");
    if (!normalizeBusId(b->second, &busId))
      return fail(n, "<pci busid=\"" + b->second + "\">: not a PCI bus id (dddd:bb:dd.f)");
    if (!busIds_.insert(busId).second) return fail(n, "<pci busid=\"" + busId + "\"> appears twice");
    auto c = a.find("class");
    if (c == a.end()) return fail(n, "<pci busid=\"" + busId + "\"> has no class attribute");
    cls = c->second;
    if (!isHexClass(cls)) return fail(n, "<pci busid=\"" + busId + "\" class=\"" + cls + "\">: class is not a hex number");
    for (char& ch : cls) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    int node = addNode(parent);

    xmlNode* nicChild = nullptr;
    for (xmlNode* k = n->children; k && !nicChild; k = k->next)
      if (k->type == XML_ELEMENT_NODE && isName(name(k), "nic")) nicChild = k;
    bool isNic = nicChild || cls.rfind("0x02", 0) == 0;
    bool isGpu = !isNic && cls.rfind("0x03", 0) == 0;
    if (isGpu) {
      if (int(m_->gpus.size()) >= L::kMaxGpus) return fail(n, "more than " + std::to_string(L::kMaxGpus) + " GPUs");
      GpuInfo g;
      g.busId = busId;
      g.name = "class " + cls;
      g.numaNode = numa;
      m_->gpus.push_back(g);
      gpuNode_.push_back(node);
    } else if (isNic && !nicChild) {
      if (!addNic(n, node, numa, busId, cls, {})) return false;
    }
    for (xmlNode* k = n->children; k; k = k->next) {
      if (k->type != XML_ELEMENT_NODE) continue;
      bool ok;
      if (k == nicChild) ok = nic(k, node, numa, busId, cls, depth + 1, true);
      else if (!isNic && !isGpu && isName(name(k), "pci")) ok = pci(k, node, numa, depth + 1);
      else ok = skip(k, depth + 1);
      if (!ok) return false;
    }
    return true;
  }

  struct Net {
    std::string name;
    double gbps = 0;
    bool rdma = false;
  };

  // <nic> holds one <net> per port; the first name names the NIC, the best
  // speed (Mbit/s in NCCL's files) is its rate.
  bool nic(xmlNode* n, int parent, int numa, const std::string& busId, const std::string& cls, int depth,
           bool underPci = false) {
    Attrs a;
    if (!enter(n, depth, &a)) return false;
    std::vector<Net> nets;
    for (xmlNode* k = n->children; k; k = k->next) {
      if (k->type != XML_ELEMENT_NODE) continue;
      if (!isName(name(k), "net")) {
        if (!skip(k, depth + 1)) return false;
        continue;
      }
      Attrs na;
      if (!enter(k, depth + 1, &na)) return false;
      Net net;
      auto nm = na.find("name");
      if (nm != na.end()) {
        if (!isPlainName(nm->second))
          return fail(k, "<net name=\"" + nm->second + "\">: not a device name (letters, digits, _-.:, at most 64)");
        net.name = nm->second;
      }
      long v = 0;
      auto sp = na.find("speed");
      if (sp != na.end() && !parseInt(sp->second, -1, 100000000, &v))
        return fail(k, "<net speed=\"" + sp->second + "\">: not a speed in Mbit/s");
      net.gbps = v > 0 ? double(v) / 1000.0 : 0.0;
      auto gdr = na.find("gdr"), port = na.find("port");
      net.rdma = (gdr != na.end() && gdr->second == "1") || (port != na.end() && port->second != "0");
      nets.push_back(net);
      for (xmlNode* s = k->children; s; s = s->next)
        if (s->type == XML_ELEMENT_NODE && !skip(s, depth + 2)) return false;
    }
    return addNic(n, underPci ? parent : addNode(parent), numa, busId, cls, nets);
  }

  bool addNic(xmlNode* n, int node, int numa, const std::string& busId, const std::string& cls,
              const std::vector<Net>& nets) {
    if (int(m_->nics.size()) >= L::kMaxNics) return fail(n, "more than " + std::to_string(L::kMaxNics) + " NICs");
    NicInfo nic;
    nic.busId = busId;
    nic.numaNode = numa;
    bool ib = cls.rfind("0x0207", 0) == 0;
    if (ib) nic.linkLayer = "InfiniBand";
    for (const Net& net : nets) {
      if (nic.rdmaDevice.empty() && nic.netdev.empty() && !net.name.empty())
        (ib || net.rdma ? nic.rdmaDevice : nic.netdev) = net.name;
      nic.rateGbps = std::max(nic.rateGbps, net.gbps);
    }
    m_->nics.push_back(nic);
    nicNode_.push_back(node);
    return true;
  }

  int hops(int a, int b) const {
    int n = 0;
    while (depth_[size_t(a)] > depth_[size_t(b)]) a = parent_[size_t(a)], ++n;
    while (depth_[size_t(b)] > depth_[size_t(a)]) b = parent_[size_t(b)], ++n;
    while (a != b) a = parent_[size_t(a)], b = parent_[size_t(b)], n += 2;
    return n;
  }

  void finish() {
    for (size_t i = 0; i < m_->nics.size(); ++i) {
      m_->nics[i].hopsToGpu.clear();
      for (int g : gpuNode_) m_->nics[i].hopsToGpu.push_back(hops(nicNode_[i], g));
    }
    std::sort(m_->numa.begin(), m_->numa.end(), [](const NumaInfo& x, const NumaInfo& y) { return x.os < y.os; });
  }

  std::string name_;
  MachineView* m_;
  int elements_ = 0;
  std::vector<int> parent_, depth_, gpuNode_, nicNode_;
  std::set<std::string> busIds_;
};

int lineOf(const std::string& text, size_t pos) {
  return 1 + int(std::count(text.begin(), text.begin() + std::ptrdiff_t(pos), '\n'));
}

struct DocFree {
  void operator()(xmlDoc* d) const { xmlFreeDoc(d); }
};
struct CtxtFree {
  void operator()(xmlParserCtxt* c) const { xmlFreeParserCtxt(c); }
};

}  // namespace

bool parseNcclTopoXml(const std::string& text, const std::string& name, MachineView* out, std::string* err) {
  if (text.size() > L::kMaxBytes) {
    *err = name + ": larger than " + std::to_string(L::kMaxBytes) + " bytes; not an NCCL topology file";
    return false;
  }
  // NCCL's files have no DTD; refusing one keeps entity expansion (and any
  // external entity) out of reach.
  for (const char* bad : {"<!DOCTYPE", "<!ENTITY"}) {
    size_t at = text.find(bad);
    if (at != std::string::npos) {
      *err = name + ":" + std::to_string(lineOf(text, at)) + ": " + bad + " is not allowed in an NCCL topology file";
      return false;
    }
  }
  static std::once_flag once;
  std::call_once(once, [] { xmlInitParser(); });
  std::unique_ptr<xmlParserCtxt, CtxtFree> ctxt(xmlNewParserCtxt());
  if (!ctxt) {
    *err = name + ": out of memory";
    return false;
  }
  const int opts = XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING | XML_PARSE_BIG_LINES;
  std::unique_ptr<xmlDoc, DocFree> doc(
      xmlCtxtReadMemory(ctxt.get(), text.data(), int(text.size()), nullptr, nullptr, opts));
  if (!doc || !ctxt->wellFormed) {
    const xmlError* e = xmlCtxtGetLastError(ctxt.get());
    std::string msg = e && e->message ? e->message : "not well-formed XML";
    while (!msg.empty() && std::isspace(static_cast<unsigned char>(msg.back()))) msg.pop_back();
    for (char& c : msg)
      if (c == '\n' || c == '\r') c = ' ';
    *err = name + ":" + std::to_string(e ? e->line : 0) + ": " + msg;
    return false;
  }
  xmlNode* root = xmlDocGetRootElement(doc.get());
  if (!root) {
    *err = name + ":1: no root element";
    return false;
  }
  MachineView m;
  m.source = "NCCL topology " + name;
  Walker w(name, &m);
  if (!w.run(root)) {
    *err = w.err;
    return false;
  }
  *out = std::move(m);
  return true;
}

#else  // !ATTN_HAVE_LIBXML2

bool ncclTopoXmlAvailable() { return false; }

bool parseNcclTopoXml(const std::string&, const std::string& name, MachineView*, std::string* err) {
  *err = name + ": attncomm was built without libxml2, so NCCL topology files are not read "
                "(install libxml2-dev and rebuild)";
  return false;
}

#endif

}  // namespace attn
