#include "perf/json_writer.h"

#include <cmath>

namespace attnperf {

std::string JsonWriter::escape(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\t': o += "\\t"; break;
      case '\r': o += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char b[8];
          snprintf(b, sizeof b, "\\u%04x", unsigned(static_cast<unsigned char>(c)));
          o += b;
        } else {
          o += c;
        }
    }
  }
  return o + "\"";
}

void JsonWriter::value() {
  if (afterKey_) {
    afterKey_ = false;
    return;
  }
  if (!first_.back()) fputc(',', f_);
  first_.back() = false;
}

void JsonWriter::key(const char* k) {
  value();
  fprintf(f_, "%s:", escape(k).c_str());
  afterKey_ = true;
}

void JsonWriter::beginObject() {
  value();
  fputc('{', f_);
  first_.push_back(true);
}

void JsonWriter::endObject() {
  first_.pop_back();
  fputc('}', f_);
}

void JsonWriter::beginList() {
  value();
  fputc('[', f_);
  first_.push_back(true);
}

void JsonWriter::endList() {
  first_.pop_back();
  fputc(']', f_);
}

void JsonWriter::str(const std::string& s) {
  value();
  fputs(escape(s).c_str(), f_);
}

void JsonWriter::num(double v) {
  value();
  if (std::isfinite(v)) fprintf(f_, "%.6f", v);
  else fputs("null", f_);
}

void JsonWriter::integer(long long v) {
  value();
  fprintf(f_, "%lld", v);
}

void JsonWriter::boolean(bool v) {
  value();
  fputs(v ? "true" : "false", f_);
}

void JsonWriter::null() {
  value();
  fputs("null", f_);
}

}  // namespace attnperf
