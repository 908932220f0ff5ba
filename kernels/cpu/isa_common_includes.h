// Everything an isa_*.cc unit includes *before* its `#pragma GCC target`.
// Inline functions with external linkage (the standard library's, half.h's)
// must be compiled for the baseline ISA: the linker keeps one copy of each,
// and a copy built for AVX-512 would crash older CPUs wherever it was chosen.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "attncomm.h"
#include "kernels/cpu/attention_task.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/kernel_table.h"
