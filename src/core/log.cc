#include "src/core/log.h"

#include <unistd.h>
#include <sys/syscall.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <strings.h>

#include "src/core/error.h"
#include "src/core/settings.h"

namespace attn {
namespace {

struct SubsysName {
  const char* name;
  uint32_t bit;
};
constexpr SubsysName kSubsys[] = {
    {"INIT", kLogInit}, {"BOOT", kLogBoot}, {"NET", kLogNet},   {"SHM", kLogShm},
    {"COLL", kLogColl}, {"P2P", kLogP2p},   {"ATTN", kLogAttn}, {"TOPO", kLogTopo},
    {"PROXY", kLogProxy}, {"ALL", kLogAll},
};

const char* subsysName(uint32_t bit) {
  for (const auto& s : kSubsys)
    if (s.bit == bit) return s.name;
  return "?";
}

struct LogConfig {
  LogLevel level = LogLevel::kNone;
  uint32_t mask = kLogAll;
  FILE* out = stderr;
  char host[64] = {};

  LogConfig() {
    gethostname(host, sizeof(host) - 1);
    if (char* dot = strchr(host, '.')) *dot = '\0';
    if (const char* lv = settingRaw(Setting::kDebug)) {
      if (!strcasecmp(lv, "WARN")) level = LogLevel::kWarn;
      else if (!strcasecmp(lv, "INFO")) level = LogLevel::kInfo;
      else if (!strcasecmp(lv, "TRACE")) level = LogLevel::kTrace;
      else if (!strcasecmp(lv, "VERSION")) level = LogLevel::kWarn;
    }
    if (const char* ss = settingRaw(Setting::kDebugSubsys)) parseSubsys(ss);
    if (const char* f = settingRaw(Setting::kDebugFile)) openFile(f);
  }

  void parseSubsys(const char* spec) {
    bool invert = spec[0] == '^';
    if (invert) ++spec;
    uint32_t bits = 0;
    std::string s(spec);
    size_t pos = 0;
    while (pos <= s.size()) {
      size_t comma = s.find(',', pos);
      std::string tok = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
      for (const auto& e : kSubsys)
        if (!strcasecmp(tok.c_str(), e.name)) bits |= e.bit;
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
    mask = invert ? ~bits : bits;
  }

  void openFile(const char* pattern) {
    std::string path;
    for (const char* p = pattern; *p; ++p) {
      if (p[0] == '%' && p[1] == 'h') { path += host; ++p; }
      else if (p[0] == '%' && p[1] == 'p') { path += std::to_string(getpid()); ++p; }
      else path += *p;
    }
    if (FILE* f = fopen(path.c_str(), "a")) out = f;
  }
};

LogConfig& config() {
  static LogConfig c;
  return c;
}

}  // namespace

bool logEnabled(LogLevel level, uint32_t subsys) {
  const LogConfig& c = config();
  return static_cast<int>(level) <= static_cast<int>(c.level) &&
         (level == LogLevel::kWarn || (c.mask & subsys) != 0);
}

void logMessage(LogLevel level, uint32_t subsys, const char* file, int line,
                const char* fmt, ...) {
  static std::mutex mu;
  LogConfig& c = config();
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  const char* lv = level == LogLevel::kWarn ? "WARN" : level == LogLevel::kInfo ? "INFO" : "TRACE";
  const std::string& ctx = ErrorContext::current();
  const char* base = strrchr(file, '/');
  std::lock_guard<std::mutex> g(mu);
  if (level == LogLevel::kTrace)
    fprintf(c.out, "%s:%d:%ld [%s] ATTN %s %s %s:%d %s\n", c.host, getpid(),
            (long)syscall(SYS_gettid), ctx.c_str(), lv, subsysName(subsys),
            base ? base + 1 : file, line, msg);
  else
    fprintf(c.out, "%s:%d:%ld [%s] ATTN %s %s %s\n", c.host, getpid(),
            (long)syscall(SYS_gettid), ctx.c_str(), lv, subsysName(subsys), msg);
  fflush(c.out);
}

}  // namespace attn
