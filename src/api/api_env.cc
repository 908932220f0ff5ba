// attnCommInitFromEnv: rank, size and root from the launcher's environment.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "src/core/api_call.h"
#include "src/core/bootstrap.h"
#include "src/core/env_secret.h"
#include "src/core/launch_env.h"
#include "src/core/settings.h"
#include "topology/host_identity.h"
#include "src/core/log.h"

namespace attn {
attnResult_t newCommInternal(attnComm** out, int nranks, const attnUniqueId& id, int rank,
                             const attnConfig_t* config, const CommConfig* inherit);
}

using namespace attn;

namespace {

attnResult_t launchEnvOrError(LaunchEnv* env) {
  // The launchers' variables, each declared in src/core/settings.def
  // (tests/test_settings.cc checks launch_env.cc names only those).
  const std::string err = attn::readLaunchEnv([](const char* name) { return settingRawByName(name); }, env,
                                              uint64_t(getppid()));
  if (!err.empty()) return setError(attnInvalidArgument, "%s", err.c_str());
  return attnSuccess;
}

attnResult_t readSecret(const LaunchEnv& env, uint8_t secret[16]) {
  bool found = false;
  ATTN_CHECK(readConfiguredSecret(secret, &found));
  if (found) return attnSuccess;
  // Without a shared secret, derive one from what every rank of this job
  // sees: it keeps jobs apart but is no protection against a hostile peer.
  std::string job = env.root + "/" + std::to_string(env.nranks);
  for (Setting v : {Setting::kTorchelasticRunId, Setting::kOmpiOrteEssJobid, Setting::kOmpiEssBaseJobid,
                    Setting::kPmixNamespace, Setting::kPmiJobid, Setting::kSlurmJobId, Setting::kSlurmStepId})
    if (auto s = settingString(v)) job += "/" + *s;
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
    ATTN_CHECK(launchEnvOrError(&env));
    uint8_t secret[16];
    ATTN_CHECK(readSecret(env, secret));
    attnUniqueId id;
    if (env.rank == 0)
      ATTN_CHECK(bootstrapCreateRootAt(env.root, secret, &id));
    else
      ATTN_CHECK(bootstrapIdFor(env.root, secret, &id));
    ATTN_INFO(kLogInit, "init from %s: rank %d of %d, root %s (%s)", env.source.c_str(), env.rank,
              env.nranks, env.root.c_str(), env.rootFrom.c_str());
    return newCommInternal(comm, env.nranks, id, env.rank, config, nullptr);
  });
}
