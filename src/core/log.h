// Logging in the manner of NCCL_DEBUG:
//   ATTN_DEBUG=WARN|INFO|TRACE         level (default: none; WARN still prints
//                                      errors of failing calls when set)
//   ATTN_DEBUG_SUBSYS=INIT,NET,...     subsystems to show (default: all);
//                                      a leading ^ excludes the listed ones
//   ATTN_DEBUG_FILE=path               write there (%h host, %p pid) instead
//                                      of stderr
// Lines look like "host:pid:tid [rank] ATTN INFO NET message".
#pragma once

#include <cstdint>

namespace attn {

enum class LogLevel : int { kNone = 0, kWarn = 1, kInfo = 2, kTrace = 3 };

enum LogSubsys : uint32_t {
  kLogInit = 1u << 0,   // communicator creation, config, env
  kLogBoot = 1u << 1,   // bootstrap
  kLogNet = 1u << 2,    // tcp transport and sockets
  kLogShm = 1u << 3,    // shared-memory transport
  kLogColl = 1u << 4,   // collectives
  kLogP2p = 1u << 5,    // send/recv, groups
  kLogAttn = 1u << 6,   // attention collectives
  kLogTopo = 1u << 7,   // topology
  kLogProxy = 1u << 8,  // progress engine
  kLogAll = 0xffffffffu,
};

bool logEnabled(LogLevel level, uint32_t subsys);
void logMessage(LogLevel level, uint32_t subsys, const char* file, int line,
                const char* fmt, ...) __attribute__((format(printf, 5, 6)));

}  // namespace attn

#define ATTN_LOG_(lvl, sub, ...)                                          \
  do {                                                                    \
    if (::attn::logEnabled(lvl, sub))                                     \
      ::attn::logMessage(lvl, sub, __FILE__, __LINE__, __VA_ARGS__);      \
  } while (0)
#define ATTN_WARN(sub, ...) ATTN_LOG_(::attn::LogLevel::kWarn, sub, __VA_ARGS__)
#define ATTN_INFO(sub, ...) ATTN_LOG_(::attn::LogLevel::kInfo, sub, __VA_ARGS__)
#define ATTN_TRACE(sub, ...) ATTN_LOG_(::attn::LogLevel::kTrace, sub, __VA_ARGS__)
