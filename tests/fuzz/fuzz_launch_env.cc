// Launcher variables come from the environment: Slurm's compressed hostlist
// (SLURM_STEP_NODELIST) and every rank, size and job-id variable. Whatever
// they hold, the readers must answer with a bounded result or one line, in
// bounded time and memory.
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "attncomm.h"
#include "src/core/hostlist.h"
#include "src/core/launch_env.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

bool hostChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_';
}

void checkHostlist(std::string_view list, size_t keep) {
  std::vector<std::string> out;
  size_t count = 0;
  const std::string err = attn::expandHostlist(list, keep, &out, &count);
  if (!err.empty()) {
    if (!out.empty() || count != 0 || err.find('\n') != std::string::npos || err.size() > 200) std::abort();
    return;
  }
  if (count == 0 || count > attn::kHostlistMaxHosts) std::abort();
  if (out.size() != (keep < count ? keep : count)) std::abort();
  for (const std::string& h : out) {
    if (h.empty() || h.size() > attn::kHostlistMaxName) std::abort();
    for (char c : h)
      if (!hostChar(c)) std::abort();
  }
}

// Each line of the input is the value of the next variable.
const char* const kVars[] = {"SLURM_STEP_NODELIST", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID",
                             "SLURM_STEP_ID", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS",
                             "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE",
                             "PMIX_NAMESPACE", "MASTER_ADDR", "MASTER_PORT", "SLURM_LOCALID",
                             "SLURM_STEP_NUM_TASKS", "RANK", "WORLD_SIZE", "ATTN_ROOT"};

void checkLaunchEnv(std::string_view text, uint64_t ppid) {
  std::map<std::string, std::string> vars;
  size_t i = 0;
  for (const char* name : kVars) {
    if (i > text.size()) break;
    size_t end = text.find('\n', i);
    if (end == std::string_view::npos) end = text.size();
    vars[name] = std::string(text.substr(i, end - i));
    i = end + 1;
  }
  attn::LaunchEnv env;
  const std::string err = attn::readLaunchEnv(
      [&](const char* name) -> const char* {
        auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
      },
      &env, ppid);
  if (!err.empty()) {
    if (env.rank != -1 || err.find('\n') != std::string::npos || err.size() > 400) std::abort();
    return;
  }
  if (env.nranks < 1 || env.nranks > ATTN_MAX_NRANKS || env.rank < 0 || env.rank >= env.nranks) std::abort();
  if (env.root.empty() || env.root.size() > 1100) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  attn::fuzz::Input in{data, size};
  const uint8_t mode = in.byte();
  const size_t keep = in.byte();
  std::string_view text(reinterpret_cast<const char*>(in.p), in.n);
  if (mode & 1) checkLaunchEnv(text, keep);
  else checkHostlist(text, keep);
  return 0;
}
