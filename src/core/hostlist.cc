#include "src/core/hostlist.h"

#include <algorithm>
#include <cstdint>

namespace attn {

namespace {

struct Range {
  uint64_t lo, hi;
  size_t width;  // zero-padded to the low bound's digits, as Slurm does
};

// One comma-separated item: literal text and bracket groups, alternating.
struct Part {
  std::string text;          // literal, when ranges is empty
  std::vector<Range> ranges;  // a bracket group
};

bool hostChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_';
}

size_t digits(uint64_t v) {
  size_t n = 1;
  while (v >= 10) v /= 10, n++;
  return n;
}

std::string at(const std::string& what, size_t pos) { return what + " at offset " + std::to_string(pos); }

// Parses "[a-b,c]" starting at list[*pos] == '['; leaves *pos after ']'.
std::string parseGroup(std::string_view list, size_t* pos, std::vector<Range>* group,
                       uint64_t* hosts) {
  const size_t open = (*pos)++;
  *hosts = 0;
  for (;;) {
    Range r{};
    for (int bound = 0; bound < 2; bound++) {
      const size_t start = *pos;
      uint64_t v = 0;
      while (*pos < list.size() && list[*pos] >= '0' && list[*pos] <= '9') {
        if (*pos - start >= 18) return at("number longer than 18 digits", start);
        v = v * 10 + uint64_t(list[*pos] - '0');
        (*pos)++;
      }
      if (*pos == start) {
        if (*pos >= list.size()) return at("unclosed '['", open);
        return at("expected a number", *pos);
      }
      if (bound == 0) r.lo = r.hi = v, r.width = *pos - start;
      else r.hi = v;
      if (bound == 1 || *pos >= list.size() || list[*pos] != '-') break;
      (*pos)++;  // '-'
    }
    if (r.hi < r.lo) return at("range runs backwards", *pos);
    const uint64_t n = r.hi - r.lo + 1;
    if (n > kHostlistMaxHosts || *hosts + n > kHostlistMaxHosts)
      return at("bracket holds more than " + std::to_string(kHostlistMaxHosts) + " hosts", open);
    *hosts += n;
    group->push_back(r);
    if (*pos >= list.size()) return at("unclosed '['", open);
    const char c = list[(*pos)++];
    if (c == ']') return "";
    if (c != ',') return at("unexpected character in brackets", *pos - 1);
  }
}

// Parses one item up to a top-level ',' or the end; counts its hosts and
// bounds its longest name.
std::string parseItem(std::string_view list, size_t* pos, std::vector<Part>* parts, uint64_t* hosts) {
  const size_t start = *pos;
  size_t longest = 0;
  *hosts = 1;
  while (*pos < list.size() && list[*pos] != ',') {
    const char c = list[*pos];
    if (c == '[') {
      Part p;
      uint64_t n = 0;
      std::string err = parseGroup(list, pos, &p.ranges, &n);
      if (!err.empty()) return err;
      size_t w = 0;
      for (const Range& r : p.ranges) w = std::max(w, std::max(r.width, digits(r.hi)));
      longest += w;
      // Saturating product: any item over the cap fails below.
      *hosts = (*hosts > kHostlistMaxHosts / n) ? kHostlistMaxHosts + 1 : *hosts * n;
      parts->push_back(std::move(p));
    } else if (c == ']') {
      return at("']' without '['", *pos);
    } else if (!hostChar(c)) {
      return at("character not allowed in a host name", *pos);
    } else {
      if (parts->empty() || !parts->back().ranges.empty()) parts->push_back({});
      parts->back().text += c;
      longest++;
      (*pos)++;
    }
    if (longest > kHostlistMaxName)
      return at("host name longer than " + std::to_string(kHostlistMaxName) + " characters", start);
  }
  if (*pos == start) return at("empty host name", start);
  return "";
}

std::string formatNumber(uint64_t v, size_t width) {
  std::string s = std::to_string(v);
  if (s.size() < width) s.insert(0, width - s.size(), '0');
  return s;
}

// Appends the item's names, first bracket slowest, until `out` holds `keep`.
void expandItem(const std::vector<Part>& parts, size_t keep, std::vector<std::string>* out) {
  // Odometer over the groups: (range index, offset in range) per part.
  std::vector<std::pair<size_t, uint64_t>> pick(parts.size(), {0, 0});
  while (out->size() < keep) {
    std::string name;
    for (size_t i = 0; i < parts.size(); i++) {
      if (parts[i].ranges.empty()) {
        name += parts[i].text;
      } else {
        const Range& r = parts[i].ranges[pick[i].first];
        name += formatNumber(r.lo + pick[i].second, r.width);
      }
    }
    out->push_back(std::move(name));
    size_t i = parts.size();
    for (; i-- > 0;) {
      if (parts[i].ranges.empty()) continue;
      auto& [ri, off] = pick[i];
      const Range& r = parts[i].ranges[ri];
      if (r.lo + off < r.hi) { off++; break; }
      off = 0;
      if (++ri < parts[i].ranges.size()) break;
      ri = 0;  // carry into the group to the left
    }
    if (i == size_t(-1)) return;  // every group wrapped: done
  }
}

}  // namespace

std::string expandHostlist(std::string_view list, size_t keep, std::vector<std::string>* out,
                           size_t* count) {
  out->clear();
  if (count) *count = 0;
  if (list.empty()) return "empty hostlist";
  if (list.size() > kHostlistMaxChars)
    return "hostlist longer than " + std::to_string(kHostlistMaxChars) + " characters";
  uint64_t total = 0;
  size_t pos = 0;
  for (;;) {
    std::vector<Part> parts;
    uint64_t hosts = 0;
    std::string err = parseItem(list, &pos, &parts, &hosts);
    if (!err.empty()) return out->clear(), err;
    total += hosts;
    if (total > kHostlistMaxHosts)
      return out->clear(), "hostlist names more than " + std::to_string(kHostlistMaxHosts) + " hosts";
    if (out->size() < keep) expandItem(parts, keep, out);
    if (pos >= list.size()) break;
    pos++;  // ','
    if (pos >= list.size()) return out->clear(), at("empty host name", pos);
  }
  if (count) *count = size_t(total);
  return "";
}

}  // namespace attn
