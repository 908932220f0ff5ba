// attnCommInitFromEnv: rank, size and root from the launcher's environment.
#include <cstring>
#include <mutex>
#include <string>

#include "src/core/api_call.h"
#include "src/core/bootstrap.h"
#include "src/core/env.h"
#include "src/core/env_secret.h"
#include "topology/host_identity.h"
#include "src/core/log.h"

namespace attn {
attnResult_t newCommInternal(attnComm** out, int nranks, const attnUniqueId& id, int rank,
                             const attnConfig_t* config, const CommConfig* inherit);
}

using namespace attn;

namespace {

struct LaunchEnv {
  int rank = -1, nranks = -1;
  std::string root;    // host:port
  std::string source;  // which convention was found
};

bool readInt(const char* name, int* out) {
  auto v = envString(name);
  if (!v) return false;
  char* end = nullptr;
  long x = strtol(v->c_str(), &end, 10);
  if (*end != '\0') return false;
  *out = static_cast<int>(x);
  return true;
}

attnResult_t readLaunchEnv(LaunchEnv* env) {
  if (readInt("ATTN_RANK", &env->rank) && readInt("ATTN_NRANKS", &env->nranks)) {
    env->source = "ATTN_RANK/ATTN_NRANKS";
  } else if (readInt("RANK", &env->rank) && readInt("WORLD_SIZE", &env->nranks)) {
    env->source = "RANK/WORLD_SIZE";
  } else if (readInt("OMPI_COMM_WORLD_RANK", &env->rank) &&
             readInt("OMPI_COMM_WORLD_SIZE", &env->nranks)) {
    env->source = "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE";
  } else {
    return setError(attnInvalidArgument,
                    "no rank in the environment: set ATTN_RANK and ATTN_NRANKS, or torchrun's "
                    "RANK and WORLD_SIZE, or run under Open MPI");
  }
  if (auto root = envString("ATTN_ROOT")) {
    env->root = *root;
  } else {
    auto addr = envString("MASTER_ADDR");
    auto port = envString("MASTER_PORT");
    if (!addr || !port)
      return setError(attnInvalidArgument,
                      "no root address: set ATTN_ROOT=host:port (or MASTER_ADDR and MASTER_PORT)");
    // torchrun's own store listens on MASTER_PORT: meet one port above it.
    int p = atoi(port->c_str());
    if (p <= 0 || p >= 65535)
      return setError(attnInvalidArgument, "MASTER_PORT=\"%s\" is not a port", port->c_str());
    bool v6 = addr->find(':') != std::string::npos && addr->front() != '[';
    env->root = (v6 ? "[" + *addr + "]" : *addr) + ":" + std::to_string(p + 1);
  }
  return attnSuccess;
}

attnResult_t readSecret(const LaunchEnv& env, uint8_t secret[16]) {
  bool found = false;
  ATTN_CHECK(readConfiguredSecret(secret, &found));
  if (found) return attnSuccess;
  // Without a shared secret, derive one from what every rank of this job
  // sees: it keeps jobs apart but is no protection against a hostile peer.
  std::string job = env.root + "/" + std::to_string(env.nranks);
  for (const char* v : {"TORCHELASTIC_RUN_ID", "OMPI_MCA_orte_ess_jobid", "PMIX_NAMESPACE",
                        "SLURM_JOB_ID"})
    if (auto s = envString(v)) job += "/" + *s;
  uint64_t a = hash64(job.data(), job.size()), b = hash64(job.data(), job.size(), a ^ 0x9e3779b97f4a7c15ull);
  std::memcpy(secret, &a, 8);
  std::memcpy(secret + 8, &b, 8);
  static std::once_flag warned;
  std::call_once(warned, [&] {
    ATTN_WARN(kLogInit, "attnCommInitFromEnv (%s) without ATTN_SECRET or ATTN_SECRET_FILE: "
              "the secret is derived from the root address, the size and the job id, which "
              "anyone can guess, so any process that reaches the root's or a rank's port can "
              "join or impersonate ranks. Set ATTN_SECRET_FILE (a 0600 file of 32 hex digits) "
              "on every rank to authenticate them", env.source.c_str());
  });
  return attnSuccess;
}

}  // namespace

extern "C" attnResult_t attnCommInitFromEnv(attnComm_t* comm, attnConfig_t* config) {
  return guardedEntry([&]() -> attnResult_t {
    ErrorContext ctx("-");
    clearThreadLastError();
    ATTN_REQUIRE(comm != nullptr, "comm output pointer is NULL");
    *comm = nullptr;
    LaunchEnv env;
    ATTN_CHECK(readLaunchEnv(&env));
    ATTN_REQUIRE(env.nranks >= 1 && env.rank >= 0 && env.rank < env.nranks,
                 "%s gives rank %d of %d", env.source.c_str(), env.rank, env.nranks);
    uint8_t secret[16];
    ATTN_CHECK(readSecret(env, secret));
    attnUniqueId id;
    if (env.rank == 0)
      ATTN_CHECK(bootstrapCreateRootAt(env.root, secret, &id));
    else
      ATTN_CHECK(bootstrapIdFor(env.root, secret, &id));
    ATTN_INFO(kLogInit, "init from %s: rank %d of %d, root %s", env.source.c_str(), env.rank,
              env.nranks, env.root.c_str());
    return newCommInternal(comm, env.nranks, id, env.rank, config, nullptr);
  });
}
