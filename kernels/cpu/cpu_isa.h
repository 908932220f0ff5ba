// Which SIMD level the CPU kernels run at. Chosen once from the CPU's
// features; tests can force a lower level to exercise every code path.
#pragma once

namespace attn::cpu {

enum class Isa : int {
  kGeneric = 0,     // portable C++ (SSE2 on x86-64), no target attributes
  kAvx2 = 1,        // AVX2 + FMA + F16C
  kAvx512 = 2,      // AVX-512 F/BW/DQ/VL + FMA + F16C
  kAvx512Bf16 = 3,  // kAvx512 + AVX512_BF16 (bf16 dot products for bf16 decode)
};

// The best level this CPU supports.
Isa detectedIsa();
// The level kernels use now: detectedIsa() unless lowered by forceIsa or by
// the caller's setting (generic|avx2|avx512|avx512bf16, asked once on first
// use; never raised above detected).
Isa activeIsa();
// Where that setting comes from: the caller (src/ fills it from ATTN_CPU_ISA)
// installs a function returning the level's name, or nullptr for none. Must
// be installed before the first kernel call to take effect.
using IsaSettingFn = const char* (*)();
void setIsaSetting(IsaSettingFn fn);
// Lowers (or restores) the level for tests; returns the level now active.
Isa forceIsa(Isa isa);
const char* isaName(Isa isa);

}  // namespace attn::cpu
