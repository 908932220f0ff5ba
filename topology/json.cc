#include "topology/json.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace attn {

namespace {

constexpr int kMaxDepth = 64;

class Parser {
 public:
  explicit Parser(const std::string& t) : t_(t) {}

  bool parse(JsonValue* out, std::string* error) {
    skipSpace();
    if (!value(out, 0)) return fail(error);
    skipSpace();
    if (pos_ != t_.size()) {
      err_ = "unexpected text after the JSON value";
      return fail(error);
    }
    return true;
  }

 private:
  bool fail(std::string* error) {
    int line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < t_.size(); ++i) {
      if (t_[i] == '\n') ++line, col = 1;
      else ++col;
    }
    if (error) *error = "line " + std::to_string(line) + ", column " + std::to_string(col) + ": " + err_;
    return false;
  }
  bool error(const std::string& e) {
    err_ = e;
    return false;
  }
  void skipSpace() {
    while (pos_ < t_.size() && std::strchr(" \t\r\n", t_[pos_]) && t_[pos_] != '\0') ++pos_;
  }
  bool literal(const char* word) {
    size_t n = std::strlen(word);
    if (t_.compare(pos_, n, word) != 0) return false;
    pos_ += n;
    return true;
  }

  bool value(JsonValue* v, int depth) {
    if (depth > kMaxDepth) return error("nested deeper than 64 levels");
    if (pos_ >= t_.size()) return error("unexpected end of input, expected a value");
    char c = t_[pos_];
    if (c == '{') return object(v, depth);
    if (c == '[') return array(v, depth);
    if (c == '"') {
      v->kind = JsonValue::kString;
      return string(&v->string);
    }
    if (literal("true")) return v->kind = JsonValue::kBool, v->boolean = true, true;
    if (literal("false")) return v->kind = JsonValue::kBool, v->boolean = false, true;
    if (literal("null")) return v->kind = JsonValue::kNull, true;
    if (c == '-' || (c >= '0' && c <= '9')) return number(v);
    return error(std::string("unexpected character '") + (c >= 32 && c < 127 ? std::string(1, c) : "?") +
                 "', expected a value");
  }

  bool number(JsonValue* v) {
    size_t start = pos_;
    auto digits = [&] {
      size_t s = pos_;
      while (pos_ < t_.size() && t_[pos_] >= '0' && t_[pos_] <= '9') ++pos_;
      return pos_ > s;
    };
    if (t_[pos_] == '-') ++pos_;
    if (pos_ < t_.size() && t_[pos_] == '0') ++pos_;
    else if (!digits()) return error("malformed number");
    if (pos_ < t_.size() && t_[pos_] == '.') {
      ++pos_;
      if (!digits()) return error("malformed number: digits expected after '.'");
    }
    if (pos_ < t_.size() && (t_[pos_] == 'e' || t_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < t_.size() && (t_[pos_] == '+' || t_[pos_] == '-')) ++pos_;
      if (!digits()) return error("malformed number: digits expected in the exponent");
    }
    v->kind = JsonValue::kNumber;
    v->number = std::strtod(t_.substr(start, pos_ - start).c_str(), nullptr);
    if (!std::isfinite(v->number)) return pos_ = start, error("number out of range");
    return true;
  }

  static void appendUtf8(std::string* s, unsigned cp) {
    if (cp < 0x80) {
      *s += char(cp);
    } else if (cp < 0x800) {
      *s += char(0xc0 | (cp >> 6));
      *s += char(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      *s += char(0xe0 | (cp >> 12));
      *s += char(0x80 | ((cp >> 6) & 0x3f));
      *s += char(0x80 | (cp & 0x3f));
    } else {
      *s += char(0xf0 | (cp >> 18));
      *s += char(0x80 | ((cp >> 12) & 0x3f));
      *s += char(0x80 | ((cp >> 6) & 0x3f));
      *s += char(0x80 | (cp & 0x3f));
    }
  }

  bool hex4(unsigned* out) {
    if (pos_ + 4 > t_.size()) return error("truncated \\u escape");
    unsigned x = 0;
    for (int i = 0; i < 4; ++i) {
      char c = t_[pos_++];
      x <<= 4;
      if (c >= '0' && c <= '9') x |= unsigned(c - '0');
      else if (c >= 'a' && c <= 'f') x |= unsigned(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') x |= unsigned(c - 'A' + 10);
      else return error("bad hex digit in \\u escape");
    }
    *out = x;
    return true;
  }

  bool string(std::string* s) {
    ++pos_;  // opening quote
    s->clear();
    while (true) {
      if (pos_ >= t_.size()) return error("unterminated string");
      char c = t_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return --pos_, error("control character in string");
      if (c != '\\') {
        *s += c;
        continue;
      }
      if (pos_ >= t_.size()) return error("unterminated string");
      char e = t_[pos_++];
      switch (e) {
        case '"': *s += '"'; break;
        case '\\': *s += '\\'; break;
        case '/': *s += '/'; break;
        case 'b': *s += '\b'; break;
        case 'f': *s += '\f'; break;
        case 'n': *s += '\n'; break;
        case 'r': *s += '\r'; break;
        case 't': *s += '\t'; break;
        case 'u': {
          unsigned cp = 0;
          if (!hex4(&cp)) return false;
          if (cp >= 0xd800 && cp < 0xdc00) {  // surrogate pair
            unsigned lo = 0;
            if (!literal("\\u") || !hex4(&lo) || lo < 0xdc00 || lo >= 0xe000)
              return error("unpaired surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          } else if (cp >= 0xdc00 && cp < 0xe000) {
            return error("unpaired surrogate in \\u escape");
          }
          appendUtf8(s, cp);
          break;
        }
        default: return --pos_, error("unknown escape in string");
      }
    }
  }

  bool array(JsonValue* v, int depth) {
    ++pos_;
    v->kind = JsonValue::kArray;
    skipSpace();
    if (pos_ < t_.size() && t_[pos_] == ']') return ++pos_, true;
    while (true) {
      skipSpace();
      v->array.emplace_back();
      if (!value(&v->array.back(), depth + 1)) return false;
      skipSpace();
      if (pos_ < t_.size() && t_[pos_] == ',') { ++pos_; continue; }
      if (pos_ < t_.size() && t_[pos_] == ']') return ++pos_, true;
      return error("expected ',' or ']' in array");
    }
  }

  bool object(JsonValue* v, int depth) {
    ++pos_;
    v->kind = JsonValue::kObject;
    skipSpace();
    if (pos_ < t_.size() && t_[pos_] == '}') return ++pos_, true;
    while (true) {
      skipSpace();
      if (pos_ >= t_.size() || t_[pos_] != '"') return error("expected a quoted key in object");
      std::string key;
      if (!string(&key)) return false;
      skipSpace();
      if (pos_ >= t_.size() || t_[pos_] != ':') return error("expected ':' after key \"" + key + "\"");
      ++pos_;
      skipSpace();
      v->object.push_back(JsonMember{key, JsonValue{}});
      if (!value(&v->object.back().second, depth + 1)) return false;
      skipSpace();
      if (pos_ < t_.size() && t_[pos_] == ',') { ++pos_; continue; }
      if (pos_ < t_.size() && t_[pos_] == '}') return ++pos_, true;
      return error("expected ',' or '}' in object");
    }
  }

  const std::string& t_;
  size_t pos_ = 0;
  std::string err_;
};

}  // namespace

const JsonValue* JsonValue::find(const std::string& key) const {
  if (kind != kObject) return nullptr;
  for (const auto& kv : object)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

const char* JsonValue::kindName(Kind k) {
  switch (k) {
    case kNull: return "null";
    case kBool: return "a boolean";
    case kNumber: return "a number";
    case kString: return "a string";
    case kArray: return "an array";
    case kObject: return "an object";
  }
  return "?";
}

bool parseJson(const std::string& text, JsonValue* out, std::string* error) {
  *out = JsonValue{};
  return Parser(text).parse(out, error);
}

std::string jsonQuote(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\r': o += "\\r"; break;
      case '\t': o += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          o += buf;
        } else {
          o += char(c);
        }
    }
  }
  return o + "\"";
}

std::string jsonNumber(double x) {
  char buf[40];
  if (std::isfinite(x) && x == std::floor(x) && std::fabs(x) < 1e15)
    std::snprintf(buf, sizeof(buf), "%.0f", x);
  else if (std::isfinite(x))
    std::snprintf(buf, sizeof(buf), "%.17g", x);
  else
    std::snprintf(buf, sizeof(buf), "0");
  return buf;
}

}  // namespace attn
