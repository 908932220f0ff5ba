// A small streaming JSON writer: it tracks where commas go and escapes
// strings (quotes, backslashes, control bytes), so the report code only
// says what to write.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

namespace attnperf {

class JsonWriter {
 public:
  explicit JsonWriter(FILE* f) : f_(f) {}
  void key(const char* k);
  void beginObject();
  void endObject();
  void beginList();
  void endList();
  void str(const std::string& s);
  void num(double v);  // NaN/inf become null: JSON has no such numbers
  void integer(long long v);
  void boolean(bool v);
  void null();

  static std::string escape(const std::string& s);

 private:
  void value();  // a comma before every element but the first
  FILE* f_;
  std::vector<bool> first_{true};  // per open container
  bool afterKey_ = false;
};

}  // namespace attnperf
