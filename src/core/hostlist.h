// Slurm's compressed hostlists ("node[01-04,07],gpu-a[1-2]"), expanded
// without Slurm: the root of an srun-launched job is the first host of
// SLURM_STEP_NODELIST. The list comes from the environment, so it is
// untrusted: bounded in length, host count and name length.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace attn {

inline constexpr size_t kHostlistMaxChars = 64 * 1024;
inline constexpr size_t kHostlistMaxHosts = 1u << 20;  // more than any Slurm cluster
inline constexpr size_t kHostlistMaxName = 255;

// Expands `list` into at most `keep` names (the first ones, in Slurm's
// order: brackets left to right, the first varying slowest). The whole list
// is checked either way. Returns "" on success, else one line saying what
// is wrong and where (the caller names the variable).
std::string expandHostlist(std::string_view list, size_t keep, std::vector<std::string>* out,
                           size_t* count = nullptr);

}  // namespace attn
