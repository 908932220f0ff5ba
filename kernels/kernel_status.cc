#include "kernels/kernel_status.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>

namespace attn::kernels {
namespace {

std::atomic<ErrorReporter> g_reporter{nullptr};
thread_local char t_last[1536];

}  // namespace

void setErrorReporter(ErrorReporter reporter) { g_reporter.store(reporter, std::memory_order_release); }

attnResult_t fail(attnResult_t code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(t_last, sizeof t_last, fmt, ap);
  va_end(ap);
  if (ErrorReporter r = g_reporter.load(std::memory_order_acquire)) r(code, t_last);
  return code;
}

const char* kernelLastError() { return t_last; }

}  // namespace attn::kernels
