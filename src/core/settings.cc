#include "src/core/settings.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "src/core/env.h"
#include "src/core/error.h"
#include "src/core/log.h"

namespace attn {

std::optional<std::string> settingString(Setting s) { return envString(settingName(s)); }

const char* settingRaw(Setting s) { return std::getenv(settingName(s)); }

bool settingIsSet(Setting s) { return settingString(s).has_value(); }

const char* settingRawByName(const char* name) {
  for (const SettingInfo& info : kSettings)
    if (std::strcmp(info.name, name) == 0) return std::getenv(info.name);
  return nullptr;
}

namespace detail {

int64_t readInt(Setting s) {
  const SettingInfo& info = settingInfo(s);
  const int64_t v = envInt(info.name, info.intDefault);
  if (v >= info.lo && v <= info.hi) return v;
  if (info.range == SettingRange::kWarn) {
    ATTN_WARN(kLogInit, "ignoring %s=%lld: out of [%lld, %lld]; using %lld", info.name, (long long)v,
              (long long)info.lo, (long long)info.hi, (long long)info.intDefault);
    return info.intDefault;
  }
  return std::clamp(v, info.lo, info.hi);
}

attnResult_t readIntStrict(Setting s, int64_t* out) {
  const SettingInfo& info = settingInfo(s);
  const auto v = envString(info.name);
  if (!v) {
    *out = info.intDefault;
    return attnSuccess;
  }
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v->c_str(), &end, 10);
  if (errno != 0 || end == v->c_str() || *end != '\0' || x < info.lo || x > info.hi)
    return setError(attnInvalidArgument, "%s=\"%s\" is not a whole number in [%lld, %lld] (%s)", info.name,
                    v->c_str(), (long long)info.lo, (long long)info.hi, info.meaning);
  *out = x;
  return attnSuccess;
}

bool readBool(Setting s) {
  const SettingInfo& info = settingInfo(s);
  return envBool(info.name, info.intDefault != 0);
}

attnResult_t readEnum(Setting s, int* index) {
  const SettingInfo& info = settingInfo(s);
  const std::optional<std::string> v = envString(info.name);
  const std::string_view all = info.text;
  const std::string_view def = all.substr(0, all.find(','));
  if (!v) {
    *index = 0;
    return attnSuccess;
  }
  const int i = settingChoiceIndex(s, *v);
  if (i >= 0) {
    *index = i;
    return attnSuccess;
  }
  // "ATTN_ALGO='x' is not one of ring, hier, direct, auto": the default last.
  std::string names;
  std::string_view rest = all.substr(std::min(all.size(), def.size() + 1));
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    names += std::string(rest.substr(0, comma)) + ", ";
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  return setError(attnInvalidArgument, "%s='%s' is not one of %s%s", info.name, v->c_str(), names.c_str(),
                  std::string(def).c_str());
}

std::optional<double> readReal(Setting s) {
  const auto v = settingString(s);
  if (!v) return std::nullopt;
  return std::atof(v->c_str());
}

}  // namespace detail
}  // namespace attn
