#include "kernels/cpu/cpu_isa.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <atomic>
#include <cstring>

namespace attn::cpu {
namespace {

#if defined(__x86_64__) || defined(__i386__)
// F16C and AVX512-BF16 straight from CPUID: clang 14's
// __builtin_cpu_supports knows neither name. Both ride on registers whose
// OS support the avx2 / avx512f checks below already establish.
bool hasF16c() {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
bool hasAvx512Bf16() {
  unsigned a, b, c, d;
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
}
#endif

Isa probe() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // __builtin_cpu_supports also checks that the OS saves the wide registers.
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("fma") && hasF16c())
    return hasAvx512Bf16() ? Isa::kAvx512Bf16 : Isa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && hasF16c())
    return Isa::kAvx2;
#endif
  return Isa::kGeneric;
}

Isa lower(Isa a, Isa b) { return static_cast<int>(a) < static_cast<int>(b) ? a : b; }

std::atomic<IsaSettingFn> g_setting{nullptr};

Isa fromSetting(Isa detected) {
  IsaSettingFn fn = g_setting.load(std::memory_order_acquire);
  const char* s = fn ? fn() : nullptr;
  if (s == nullptr) return detected;
  if (std::strcmp(s, "generic") == 0) return Isa::kGeneric;
  if (std::strcmp(s, "avx2") == 0) return lower(Isa::kAvx2, detected);
  if (std::strcmp(s, "avx512") == 0) return lower(Isa::kAvx512, detected);
  return detected;
}

std::atomic<int>& activeSlot() {
  static std::atomic<int> slot{static_cast<int>(fromSetting(detectedIsa()))};
  return slot;
}

}  // namespace

void setIsaSetting(IsaSettingFn fn) { g_setting.store(fn, std::memory_order_release); }

Isa detectedIsa() {
  static const Isa isa = probe();
  return isa;
}

Isa activeIsa() {
  return static_cast<Isa>(activeSlot().load(std::memory_order_relaxed));
}

Isa forceIsa(Isa isa) {
  Isa v = lower(isa, detectedIsa());
  activeSlot().store(static_cast<int>(v), std::memory_order_relaxed);
  return v;
}

const char* isaName(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Bf16: return "avx512bf16";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    default: return "generic";
  }
}

}  // namespace attn::cpu
