#include "src/core/kernel_setup.h"

#include <optional>
#include <string>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/kernel_status.h"
#include "src/core/settings.h"
#include "src/core/error.h"

namespace attn {
namespace {

void reportKernelError(attnResult_t code, const char* message) { (void)setError(code, "%s", message); }

// Asked once, on the kernels' first use (not at load time).
const char* cpuIsaSetting() {
  static const std::optional<std::string> isa = settingString(Setting::kCpuIsa);
  return isa ? isa->c_str() : nullptr;
}

}  // namespace

void setUpKernels() {
  kernels::setErrorReporter(&reportKernelError);
  cpu::setIsaSetting(&cpuIsaSetting);
}

}  // namespace attn
