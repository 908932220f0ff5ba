// Every environment variable the library reads, declared once in
// src/core/settings.def and read only through this header:
//
//   int64_t slots = settingInt<Setting::kShmSlots>();
//   if (auto path = settingString(Setting::kTopoFile)) ...
//
// A `Setting` exists only for a declared variable, so reading an undeclared
// one does not compile; reading one as the wrong kind (an int as a bool)
// fails a static_assert. Reads are never cached here: every call looks at
// the environment again, and callers that read once keep the value
// themselves. tests/test_settings.cc checks the table against the README's.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "attncomm.h"

namespace attn {

enum class SettingKind { kInt, kBool, kEnum, kReal, kString, kForeign };
// What an integer outside [lo, hi] becomes (settings.def says more).
enum class SettingRange { kClamp, kWarn, kError };

struct SettingInfo {
  const char* name;
  SettingKind kind;
  int64_t intDefault;       // kInt, kBool
  int64_t lo, hi;           // kInt
  SettingRange range;       // kInt
  const char* text;         // kEnum: its choices, default first; kString: what unset means
  const char* meaning;
};

enum class Setting : int {
#define ATTN_INT(id, ...) id,
#define ATTN_BOOL(id, ...) id,
#define ATTN_ENUM(id, ...) id,
#define ATTN_REAL(id, ...) id,
#define ATTN_STRING(id, ...) id,
#define ATTN_FOREIGN(id, ...) id,
#include "src/core/settings.def"
#undef ATTN_INT
#undef ATTN_BOOL
#undef ATTN_ENUM
#undef ATTN_REAL
#undef ATTN_STRING
#undef ATTN_FOREIGN
  kCount
};

inline constexpr std::array<SettingInfo, size_t(Setting::kCount)> kSettings = {{
#define ATTN_INT(id, name, def, lo, hi, range, meaning) \
  {name, SettingKind::kInt, def, lo, hi, SettingRange::range, "", meaning},
#define ATTN_BOOL(id, name, def, meaning) {name, SettingKind::kBool, (def) ? 1 : 0, 0, 1, SettingRange::kClamp, "", meaning},
#define ATTN_ENUM(id, name, choices, meaning) {name, SettingKind::kEnum, 0, 0, 0, SettingRange::kClamp, choices, meaning},
#define ATTN_REAL(id, name, meaning) {name, SettingKind::kReal, 0, 0, 0, SettingRange::kClamp, "measured", meaning},
#define ATTN_STRING(id, name, unset, meaning) {name, SettingKind::kString, 0, 0, 0, SettingRange::kClamp, unset, meaning},
#define ATTN_FOREIGN(id, name, meaning) {name, SettingKind::kForeign, 0, 0, 0, SettingRange::kClamp, "unset", meaning},
#include "src/core/settings.def"
#undef ATTN_INT
#undef ATTN_BOOL
#undef ATTN_ENUM
#undef ATTN_REAL
#undef ATTN_STRING
#undef ATTN_FOREIGN
}};

constexpr const SettingInfo& settingInfo(Setting s) { return kSettings[size_t(s)]; }
constexpr const char* settingName(Setting s) { return settingInfo(s).name; }
constexpr int64_t settingDefault(Setting s) { return settingInfo(s).intDefault; }

// The index of `word` among an enum setting's choices (0: the default), or
// -1. constexpr, so code can check its enum's order against the table.
constexpr int settingChoiceIndex(Setting s, std::string_view word) {
  std::string_view all = settingInfo(s).text;
  int i = 0;
  while (true) {
    const size_t comma = all.find(',');
    if (all.substr(0, comma) == word) return i;
    if (comma == std::string_view::npos) return -1;
    all.remove_prefix(comma + 1);
    ++i;
  }
}

// The value as set; nullopt when unset or empty. Any kind.
std::optional<std::string> settingString(Setting s);
// getenv as is: nullptr when unset, "" when set empty (the logger, which
// tells the two apart and must not log while reading).
const char* settingRaw(Setting s);
bool settingIsSet(Setting s);
// settingRaw by name, for the launchers' lookup (src/core/launch_env.h),
// which names their variables itself: nullptr for a name not in the table.
const char* settingRawByName(const char* name);

namespace detail {
int64_t readInt(Setting s);
attnResult_t readIntStrict(Setting s, int64_t* out);
bool readBool(Setting s);
attnResult_t readEnum(Setting s, int* index);
std::optional<double> readReal(Setting s);
}  // namespace detail

// kInt (kClamp / kWarn): the default when unset, or malformed (WARN), or out
// of range under kWarn (WARN); clamped into [lo, hi] under kClamp.
template <Setting S>
int64_t settingInt() {
  static_assert(settingInfo(S).kind == SettingKind::kInt, "not an integer setting");
  static_assert(settingInfo(S).range != SettingRange::kError, "read it with settingIntStrict");
  return detail::readInt(S);
}
// kInt (kError): base 10, in [lo, hi], else attnInvalidArgument naming it.
template <Setting S>
attnResult_t settingIntStrict(int64_t* out) {
  static_assert(settingInfo(S).kind == SettingKind::kInt, "not an integer setting");
  static_assert(settingInfo(S).range == SettingRange::kError, "read it with settingInt");
  return detail::readIntStrict(S, out);
}
template <Setting S>
bool settingBool() {
  static_assert(settingInfo(S).kind == SettingKind::kBool, "not a boolean setting");
  return detail::readBool(S);
}
// kEnum: *index into its choices (0, the default, when unset or empty);
// another value is attnInvalidArgument naming the choices.
template <Setting S>
attnResult_t settingEnum(int* index) {
  static_assert(settingInfo(S).kind == SettingKind::kEnum, "not an enum setting");
  return detail::readEnum(S, index);
}
// kReal: atof of the value; nullopt when unset.
template <Setting S>
std::optional<double> settingReal() {
  static_assert(settingInfo(S).kind == SettingKind::kReal, "not a real setting");
  return detail::readReal(S);
}

}  // namespace attn
