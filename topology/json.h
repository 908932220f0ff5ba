// A small JSON reader and writer (RFC 8259 subset: no duplicate-key checks,
// \u escapes outside ASCII become UTF-8). Enough for topology files; errors
// name the line and column and never throw.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace attn {

struct JsonMember;

struct JsonValue {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<JsonValue> array;
  std::vector<JsonMember> object;  // in file order

  const JsonValue* find(const std::string& key) const;
  static const char* kindName(Kind k);
};

// One key of an object and its value. A struct rather than a std::pair:
// a pair of an incomplete JsonValue is ill-formed (clang refuses it).
struct JsonMember {
  std::string first;
  JsonValue second;
};

// Parses `text`; on failure returns false and sets *error ("line 3, column 7: ...").
bool parseJson(const std::string& text, JsonValue* out, std::string* error);

// Writer helpers.
std::string jsonQuote(const std::string& s);
std::string jsonNumber(double x);  // round-trips exactly (%.17g); integers plain

}  // namespace attn
