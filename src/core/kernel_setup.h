// What the library hands its kernels (kernels/ read no environment and know
// no library error type): a reporter that turns kernel failures into
// setError records, and the ATTN_CPU_ISA cap. Installed once per process,
// before main (error.cc), so every caller of the library sees them.
#pragma once

namespace attn {

void setUpKernels();

}  // namespace attn
