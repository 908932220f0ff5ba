#include "src/core/launch_env.h"

#include <vector>

#include "attncomm.h"
#include "src/core/hostlist.h"

namespace attn {

namespace {

enum class Launcher { kAttn, kTorch, kOpenMpi, kPmi, kSlurm };

constexpr size_t kMaxShown = 64;      // of a bad value, in a message
constexpr size_t kMaxRootChars = 1024;
constexpr int64_t kSlurmSpecialSteps = 0xfffffff0;  // SLURM_BATCH_SCRIPT, SLURM_EXTERN_CONT, ...

// Unset and empty are the same to every launcher convention.
const char* value(const EnvLookup& get, const char* name) {
  const char* v = get(name);
  return v && *v ? v : nullptr;
}

// name="value", the value cut short and made printable: it is untrusted.
std::string shown(const char* name, const char* v) {
  std::string s = std::string(name) + "=\"";
  size_t i = 0;
  for (; v[i] && i < kMaxShown; i++) s += (v[i] >= 0x20 && v[i] < 0x7f) ? v[i] : '?';
  return s + (v[i] ? "...\"" : "\"");
}

// A decimal integer in [lo, hi]; "" or why not.
std::string parseNum(const char* name, const char* v, int64_t lo, int64_t hi, int64_t* out) {
  int64_t x = 0;
  size_t i = 0;
  for (; v[i] >= '0' && v[i] <= '9'; i++) {
    if (x > (INT64_MAX - 9) / 10) return shown(name, v) + " is out of range";
    x = x * 10 + (v[i] - '0');
  }
  if (i == 0 || v[i] != '\0') return shown(name, v) + " is not a number";
  if (x < lo || x > hi)
    return shown(name, v) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  *out = x;
  return "";
}

// Optional integer: leaves *out alone when unset.
std::string readOptional(const EnvLookup& get, const char* name, int64_t lo, int64_t hi, int* out) {
  const char* v = value(get, name);
  if (!v) return "";
  int64_t x = 0;
  std::string err = parseNum(name, v, lo, hi, &x);
  if (err.empty()) *out = int(x);
  return err;
}

// This rank and the size; the size variable must come with the rank one.
std::string readRankPair(const EnvLookup& get, const char* rankVar, const char* sizeVar, LaunchEnv* env) {
  const char* s = value(get, sizeVar);
  if (!s) return std::string(rankVar) + " is set but " + sizeVar + " is not";
  int64_t rank = 0, size = 0;
  std::string err = parseNum(sizeVar, s, 1, ATTN_MAX_NRANKS, &size);
  if (err.empty()) err = parseNum(rankVar, value(get, rankVar), 0, ATTN_MAX_NRANKS - 1, &rank);
  if (!err.empty()) return err;
  if (rank >= size) return shown(rankVar, value(get, rankVar)) + " is not below " + shown(sizeVar, s);
  env->rank = int(rank);
  env->nranks = int(size);
  env->source = std::string(rankVar) + "/" + sizeVar;
  return "";
}

const char* slurmSizeVar(const EnvLookup& get) {
  return value(get, "SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
}

// srun's PMI plugins set PMI_RANK too: the same numbers as Slurm's mean
// srun; different ones mean mpiexec inside a Slurm allocation.
bool pmiIsSrun(const EnvLookup& get) {
  const char* sr = value(get, "SLURM_PROCID");
  const char* ss = value(get, slurmSizeVar(get));
  const char* pr = value(get, "PMI_RANK");
  const char* ps = value(get, "PMI_SIZE");
  return sr && ss && pr && ps && std::string_view(sr) == pr && std::string_view(ss) == ps;
}

std::string readRanks(const EnvLookup& get, Launcher* which, LaunchEnv* env) {
  std::string err;
  if (value(get, "ATTN_RANK")) {
    *which = Launcher::kAttn;
    return readRankPair(get, "ATTN_RANK", "ATTN_NRANKS", env);
  }
  if (value(get, "RANK")) {
    *which = Launcher::kTorch;
    err = readRankPair(get, "RANK", "WORLD_SIZE", env);
    if (err.empty()) err = readOptional(get, "LOCAL_RANK", 0, ATTN_MAX_NRANKS - 1, &env->localRank);
    if (err.empty()) err = readOptional(get, "LOCAL_WORLD_SIZE", 1, ATTN_MAX_NRANKS, &env->localSize);
    return err;
  }
  if (value(get, "OMPI_COMM_WORLD_RANK")) {
    *which = Launcher::kOpenMpi;
    err = readRankPair(get, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", env);
    if (err.empty())
      err = readOptional(get, "OMPI_COMM_WORLD_LOCAL_RANK", 0, ATTN_MAX_NRANKS - 1, &env->localRank);
    if (err.empty())
      err = readOptional(get, "OMPI_COMM_WORLD_LOCAL_SIZE", 1, ATTN_MAX_NRANKS, &env->localSize);
    return err;
  }
  if (value(get, "PMI_RANK") && !pmiIsSrun(get)) {
    *which = Launcher::kPmi;
    err = readRankPair(get, "PMI_RANK", "PMI_SIZE", env);
    if (err.empty()) err = readOptional(get, "MPI_LOCALRANKID", 0, ATTN_MAX_NRANKS - 1, &env->localRank);
    if (err.empty()) err = readOptional(get, "MPI_LOCALNRANKS", 1, ATTN_MAX_NRANKS, &env->localSize);
    return err;
  }
  if (value(get, "SLURM_PROCID")) {
    *which = Launcher::kSlurm;
    // srun sets a step id for its tasks; a batch or salloc shell has
    // SLURM_PROCID and SLURM_NTASKS too, but its peers will never come.
    if (!value(get, "SLURM_STEP_ID") && !value(get, "SLURM_STEPID"))
      return "SLURM_PROCID without SLURM_STEP_ID: not a task of srun (an sbatch or salloc shell?): "
             "start the ranks with srun";
    err = readRankPair(get, "SLURM_PROCID", slurmSizeVar(get), env);
    if (err.empty()) err = readOptional(get, "SLURM_LOCALID", 0, ATTN_MAX_NRANKS - 1, &env->localRank);
    return err;
  }
  return "no rank in the environment: set ATTN_RANK and ATTN_NRANKS, or torchrun's RANK and "
         "WORLD_SIZE, or start the ranks with mpirun, mpiexec or srun";
}

const char* launcherName(Launcher l) {
  switch (l) {
    case Launcher::kOpenMpi: return "Open MPI";
    case Launcher::kPmi: return "MPICH/PMI";
    case Launcher::kSlurm: return "srun";
    default: return "torchrun-style";
  }
}

// Every rank on this host, by the launcher's own count? Else why not.
std::string allLocal(Launcher l, const LaunchEnv& env) {
  const char* localVar = l == Launcher::kOpenMpi ? "OMPI_COMM_WORLD_LOCAL_SIZE" : "MPI_LOCALNRANKS";
  const char* sizeVar = l == Launcher::kOpenMpi ? "OMPI_COMM_WORLD_SIZE" : "PMI_SIZE";
  const std::string fix = ": set MASTER_ADDR (and MASTER_PORT) or ATTN_ROOT, or build the perf tools with MPI";
  if (env.localSize < 0)
    return std::string(launcherName(l)) + " ranks without " + localVar + " (ranks on this host)" + fix;
  if (env.localSize != env.nranks)
    return std::string(launcherName(l)) + " ranks on several hosts (" + localVar + "=" +
           std::to_string(env.localSize) + " of " + sizeVar + "=" + std::to_string(env.nranks) + ")" + fix;
  return "";
}

// The root's host when MASTER_ADDR is unset.
std::string launcherHost(const EnvLookup& get, Launcher l, const LaunchEnv& env, std::string* host,
                         std::string* from) {
  if (l == Launcher::kOpenMpi || l == Launcher::kPmi) {
    std::string err = allLocal(l, env);
    if (!err.empty()) return err;
    *host = "127.0.0.1";
    *from = "all ranks on this host";
    return "";
  }
  for (const char* var : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    const char* list = value(get, var);
    if (!list) continue;
    std::vector<std::string> hosts;
    std::string err = expandHostlist(list, 1, &hosts);
    if (!err.empty()) return shown(var, list) + ": " + err;
    *host = hosts[0];
    *from = std::string("first host of ") + var;
    return "";
  }
  return "srun ranks without SLURM_STEP_NODELIST or SLURM_JOB_NODELIST: set MASTER_ADDR (and "
         "MASTER_PORT) or ATTN_ROOT";
}

// The root's port when MASTER_PORT is unset: from the launcher's job id.
std::string launcherPort(const EnvLookup& get, Launcher l, const LaunchEnv& env, uint64_t launcherPid,
                         int* port) {
  if (l == Launcher::kSlurm) {
    const char* job = value(get, "SLURM_JOB_ID");
    if (!job) job = value(get, "SLURM_JOBID");
    if (!job) return "srun ranks without SLURM_JOB_ID: set MASTER_PORT or ATTN_ROOT";
    int64_t jobId = 0, stepId = 0;
    std::string err = parseNum("SLURM_JOB_ID", job, 0, UINT32_MAX, &jobId);
    const char* stepVar = value(get, "SLURM_STEP_ID") ? "SLURM_STEP_ID" : "SLURM_STEPID";
    if (err.empty() && value(get, stepVar))
      err = parseNum(stepVar, value(get, stepVar), 0, UINT32_MAX, &stepId);
    if (!err.empty()) return err;
    // Slurm numbers its batch, extern and interactive steps from the top:
    // their tasks were not started by srun as this job's ranks.
    if (stepId >= kSlurmSpecialSteps)
      return shown(stepVar, value(get, stepVar)) + " is Slurm's batch or extern step: start the ranks with srun";
    *port = slurmJobPort(uint64_t(jobId), uint64_t(stepId));
    return "";
  }
  std::vector<const char*> ids = {"OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid", "PMIX_NAMESPACE"};
  if (l == Launcher::kPmi) ids = {"PMI_JOBID", "PMIX_NAMESPACE"};
  for (const char* var : ids) {
    const char* id = value(get, var);
    if (!id) continue;
    if (std::string_view(id).size() > kMaxRootChars) return shown(var, id) + " is too long";
    *port = namedJobPort(id);
    return "";
  }
  // Hydra sets no job id, but one host's ranks share their hydra_pmi_proxy.
  if (l == Launcher::kPmi && launcherPid > 1 && allLocal(l, env).empty()) {
    *port = namedJobPort("ppid:" + std::to_string(launcherPid));
    return "";
  }
  std::string names;
  for (const char* var : ids) names += (names.empty() ? "" : ", ") + std::string(var);
  return std::string(launcherName(l)) + " set no job id (" + names + "): set MASTER_PORT or ATTN_ROOT";
}

std::string readRoot(const EnvLookup& get, Launcher l, LaunchEnv* env, uint64_t launcherPid) {
  if (const char* root = value(get, "ATTN_ROOT")) {
    if (std::string_view(root).size() > kMaxRootChars) return shown("ATTN_ROOT", root) + " is too long";
    env->root = root;
    env->rootFrom = "ATTN_ROOT";
    return "";
  }
  const char* addr = value(get, "MASTER_ADDR");
  const char* portVar = value(get, "MASTER_PORT");
  if ((l == Launcher::kAttn || l == Launcher::kTorch) && (!addr || !portVar))
    return "no root address: set ATTN_ROOT=host:port (or MASTER_ADDR and MASTER_PORT)";
  std::string host, from;
  if (addr) {
    if (std::string_view(addr).size() > kHostlistMaxName) return shown("MASTER_ADDR", addr) + " is too long";
    host = addr;
    from = "MASTER_ADDR";
  } else {
    std::string err = launcherHost(get, l, *env, &host, &from);
    if (!err.empty()) return err;
  }
  int port = 0;
  if (portVar) {
    // torchrun's own store listens on MASTER_PORT: meet one port above it.
    int64_t p = 0;
    std::string err = parseNum("MASTER_PORT", portVar, 1, 65534, &p);
    if (!err.empty()) return err;
    port = int(p) + 1;
    from += ", MASTER_PORT+1";
  } else {
    std::string err = launcherPort(get, l, *env, launcherPid, &port);
    if (!err.empty()) return err;
    from += ", port from the job id";
  }
  const bool v6 = host.find(':') != std::string::npos && host.front() != '[';
  env->root = (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
  env->rootFrom = from;
  return "";
}

}  // namespace

int slurmJobPort(uint64_t jobId, uint64_t stepId) {
  return kJobPortBase + int((jobId * 31 + stepId) % kJobPortSpan);
}

int namedJobPort(std::string_view jobId) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : jobId) h = (h ^ c) * 0x100000001b3ull;
  return kJobPortBase + int(h % kJobPortSpan);
}

std::string readLaunchEnv(const EnvLookup& get, LaunchEnv* env, uint64_t launcherPid) {
  *env = LaunchEnv{};
  Launcher which = Launcher::kAttn;
  std::string err = readRanks(get, &which, env);
  if (err.empty()) err = readRoot(get, which, env, launcherPid);
  if (!err.empty()) *env = LaunchEnv{};
  return err;
}

}  // namespace attn
