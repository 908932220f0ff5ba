// The launcher-variable readers (src/core/launch_env) and Slurm's hostlist
// expansion (src/core/hostlist), over a fake environment: each launcher's
// variables, missing, conflicting and garbage values, and the one-line
// messages that name them.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "attncomm.h"
#include "src/core/hostlist.h"
#include "src/core/launch_env.h"

namespace attn {
namespace {

using Vars = std::map<std::string, std::string>;

struct Read {
  std::string err;
  LaunchEnv env;
};

Read read(const Vars& vars, uint64_t ppid = 0) {
  Read r;
  r.err = readLaunchEnv(
      [&](const char* name) -> const char* {
        auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
      },
      &r.env, ppid);
  return r;
}

std::vector<std::string> expand(std::string_view list, std::string* err = nullptr, size_t keep = 100) {
  std::vector<std::string> out;
  std::string e = expandHostlist(list, keep, &out);
  if (err) *err = e;
  else EXPECT_EQ(e, "") << list;
  return out;
}

// ---------------------------------------------------------------------------
// Hostlists

TEST(Hostlist, PlainNamesAndRanges) {
  using V = std::vector<std::string>;
  EXPECT_EQ(expand("localhost"), V{"localhost"});
  EXPECT_EQ(expand("a,b.example.com"), (V{"a", "b.example.com"}));
  EXPECT_EQ(expand("node[01-04,07],gpu-a[1-2]"),
            (V{"node01", "node02", "node03", "node04", "node07", "gpu-a1", "gpu-a2"}));
  EXPECT_EQ(expand("n[8-11]"), (V{"n8", "n9", "n10", "n11"}));
  EXPECT_EQ(expand("n[098-101]x"), (V{"n098x", "n099x", "n100x", "n101x"}));
  EXPECT_EQ(expand("[1-2]"), (V{"1", "2"}));
  // Several brackets: the first varies slowest.
  EXPECT_EQ(expand("r[1-2]n[0-1]"), (V{"r1n0", "r1n1", "r2n0", "r2n1"}));
  EXPECT_EQ(expand("r[1,3]-n[5]"), (V{"r1-n5", "r3-n5"}));
}

TEST(Hostlist, KeepsOnlyWhatIsAskedButChecksEverything) {
  std::string err;
  size_t count = 0;
  std::vector<std::string> out;
  EXPECT_EQ(expandHostlist("node[1-1000],x[5-6]", 1, &out, &count), "");
  EXPECT_EQ(out, std::vector<std::string>{"node1"});
  EXPECT_EQ(count, 1002u);
  // The first host is fine, a later item is not: refused all the same.
  EXPECT_NE(expandHostlist("node1,bad[", 1, &out), "");
  EXPECT_TRUE(out.empty());
}

TEST(Hostlist, MalformedListsAreRefusedWithWhere) {
  for (const char* bad : {"", ",", "a,", ",a", "a,,b", "n[", "n[1", "n[1-", "n[1-2", "n]", "n[]",
                          "n[a]", "n[2-1]", "n[1-2-3]", "n[[1]]", "n[1]]", "a b", "n[-1]", "n[1,]",
                          "n[,1]", "n\xff", "n[1:2]", "n\n"}) {
    std::string err;
    EXPECT_TRUE(expand(bad, &err).empty()) << bad;
    EXPECT_NE(err, "") << "accepted \"" << bad << "\"";
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  }
  std::string err;
  expand("node[1-2", &err);
  EXPECT_EQ(err, "unclosed '[' at offset 4");
  expand("node[3-1]", &err);
  EXPECT_EQ(err, "range runs backwards at offset 8");
}

TEST(Hostlist, HugeListsAreRefused) {
  std::string err;
  expand("node[1-1000000000]", &err);
  EXPECT_NE(err.find("more than 1048576 hosts"), std::string::npos) << err;
  // Many brackets multiply: 1000^3.
  expand("a[1-1000]b[1-1000]c[1-1000]", &err);
  EXPECT_NE(err.find("more than 1048576 hosts"), std::string::npos) << err;
  expand("n[999999999999999999999]", &err);
  EXPECT_NE(err.find("longer than 18 digits"), std::string::npos) << err;
  expand("n[0-18446744073709551615]", &err);
  EXPECT_NE(err, "");
  expand(std::string(300, 'a'), &err);
  EXPECT_NE(err.find("longer than 255"), std::string::npos) << err;
  expand(std::string(kHostlistMaxChars + 1, 'a'), &err);
  EXPECT_NE(err.find("hostlist longer than"), std::string::npos) << err;
  // Many items each within bounds, but too many in all.
  std::string many;
  for (int i = 0; i < 2000; i++) many += "h" + std::to_string(i) + "x[1-1000],";
  many.pop_back();
  expand(many, &err);
  EXPECT_NE(err.find("more than 1048576 hosts"), std::string::npos) << err;
  // Exactly at the limit: fine, and only `keep` names are made.
  std::vector<std::string> out;
  size_t count = 0;
  EXPECT_EQ(expandHostlist("n[1-1048576]", 3, &out, &count), "");
  EXPECT_EQ(count, kHostlistMaxHosts);
  EXPECT_EQ(out, (std::vector<std::string>{"n1", "n2", "n3"}));
}

// ---------------------------------------------------------------------------
// Launchers

TEST(LaunchEnv, AttnAndTorchrunAsBefore) {
  Read r = read({{"ATTN_RANK", "1"}, {"ATTN_NRANKS", "3"}, {"ATTN_ROOT", "h:5"}});
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.env.rank, 1);
  EXPECT_EQ(r.env.nranks, 3);
  EXPECT_EQ(r.env.root, "h:5");
  EXPECT_EQ(r.env.source, "ATTN_RANK/ATTN_NRANKS");
  r = read({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"},
            {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}});
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.env.root, "10.0.0.1:29501");
  EXPECT_EQ(r.env.localSize, 2);
  r = read({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "fd00::1"}, {"MASTER_PORT", "7"}});
  EXPECT_EQ(r.env.root, "[fd00::1]:8");
  // ATTN_* wins over everything else.
  r = read({{"ATTN_RANK", "0"}, {"ATTN_NRANKS", "1"}, {"ATTN_ROOT", "h:5"}, {"RANK", "3"},
            {"SLURM_PROCID", "2"}, {"OMPI_COMM_WORLD_RANK", "1"}});
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.env.rank, 0);
  // torchrun without a root: the old message.
  r = read({{"RANK", "0"}, {"WORLD_SIZE", "2"}});
  EXPECT_EQ(r.err, "no root address: set ATTN_ROOT=host:port (or MASTER_ADDR and MASTER_PORT)");
  EXPECT_EQ(r.env.rank, -1);  // nothing half-filled on failure
}

TEST(LaunchEnv, NothingSet) {
  Read r = read({});
  EXPECT_NE(r.err.find("no rank in the environment"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("srun"), std::string::npos) << r.err;
}

TEST(LaunchEnv, OpenMpiOneHostNeedsNoRoot) {
  Vars v = {{"OMPI_COMM_WORLD_RANK", "2"},       {"OMPI_COMM_WORLD_SIZE", "4"},
            {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
            {"OMPI_MCA_ess_base_jobid", "34799617"}, {"PMIX_NAMESPACE", "34799617"}};
  Read r = read(v);
  ASSERT_EQ(r.err, "");
  EXPECT_EQ(r.env.rank, 2);
  EXPECT_EQ(r.env.nranks, 4);
  EXPECT_EQ(r.env.localRank, 2);
  EXPECT_EQ(r.env.root, "127.0.0.1:" + std::to_string(namedJobPort("34799617")));
  // Older Open MPI's variable, and PMIx's namespace alone.
  v.erase("OMPI_MCA_ess_base_jobid");
  EXPECT_EQ(read(v).env.root, "127.0.0.1:" + std::to_string(namedJobPort("34799617")));
  v.erase("PMIX_NAMESPACE");
  v["OMPI_MCA_orte_ess_jobid"] = "77";
  EXPECT_EQ(read(v).env.root, "127.0.0.1:" + std::to_string(namedJobPort("77")));
  // MASTER_PORT and ATTN_ROOT still override.
  v["MASTER_PORT"] = "4000";
  EXPECT_EQ(read(v).env.root, "127.0.0.1:4001");
  v["ATTN_ROOT"] = "other:9";
  EXPECT_EQ(read(v).env.root, "other:9");
  // No job id at all: one line saying which variables were looked for.
  v.erase("ATTN_ROOT");
  v.erase("MASTER_PORT");
  v.erase("OMPI_MCA_orte_ess_jobid");
  r = read(v);
  EXPECT_EQ(r.err, "Open MPI set no job id (OMPI_MCA_ess_base_jobid, OMPI_MCA_orte_ess_jobid, "
                   "PMIX_NAMESPACE): set MASTER_PORT or ATTN_ROOT");
}

TEST(LaunchEnv, OpenMpiAcrossHostsNamesWhatIsMissing) {
  Vars v = {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"},
            {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"OMPI_MCA_ess_base_jobid", "5"}};
  Read r = read(v);
  EXPECT_EQ(r.err, "Open MPI ranks on several hosts (OMPI_COMM_WORLD_LOCAL_SIZE=2 of "
                   "OMPI_COMM_WORLD_SIZE=4): set MASTER_ADDR (and MASTER_PORT) or ATTN_ROOT, or "
                   "build the perf tools with MPI");
  // MASTER_ADDR alone is enough: the port comes from the job id, the same on every host.
  v["MASTER_ADDR"] = "node1";
  r = read(v);
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.env.root, "node1:" + std::to_string(namedJobPort("5")));
  v.erase("MASTER_ADDR");
  v.erase("OMPI_COMM_WORLD_LOCAL_SIZE");
  EXPECT_NE(read(v).err.find("without OMPI_COMM_WORLD_LOCAL_SIZE"), std::string::npos);
}

TEST(LaunchEnv, MpichHydra) {
  Vars v = {{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}};
  // Hydra sets no job id: one host's ranks share their proxy (the parent).
  Read r = read(v, 4242);
  ASSERT_EQ(r.err, "");
  EXPECT_EQ(r.env.source, "PMI_RANK/PMI_SIZE");
  EXPECT_EQ(r.env.root, "127.0.0.1:" + std::to_string(namedJobPort("ppid:4242")));
  r = read(v, 0);
  EXPECT_EQ(r.err, "MPICH/PMI set no job id (PMI_JOBID, PMIX_NAMESPACE): set MASTER_PORT or ATTN_ROOT");
  v["PMI_JOBID"] = "job7";
  EXPECT_EQ(read(v, 4242).env.root, "127.0.0.1:" + std::to_string(namedJobPort("job7")));
  v["MPI_LOCALNRANKS"] = "1";
  r = read(v, 4242);
  EXPECT_EQ(r.err, "MPICH/PMI ranks on several hosts (MPI_LOCALNRANKS=1 of PMI_SIZE=2): set "
                   "MASTER_ADDR (and MASTER_PORT) or ATTN_ROOT, or build the perf tools with MPI");
  // Across hosts without a job id the parent pid would differ per host: refused.
  v.erase("PMI_JOBID");
  v["MASTER_ADDR"] = "n1";
  EXPECT_NE(read(v, 4242).err.find("set no job id"), std::string::npos);
  v["MASTER_PORT"] = "100";
  EXPECT_EQ(read(v, 4242).env.root, "n1:101");
}

TEST(LaunchEnv, SlurmSrun) {
  Vars v = {{"SLURM_PROCID", "3"},      {"SLURM_NTASKS", "4"},   {"SLURM_LOCALID", "1"},
            {"SLURM_JOB_ID", "123456"}, {"SLURM_STEP_ID", "2"},
            {"SLURM_STEP_NODELIST", "gpu-a[07-08],gpu-b1"}, {"SLURM_JOB_NODELIST", "other[1-9]"}};
  Read r = read(v);
  ASSERT_EQ(r.err, "");
  EXPECT_EQ(r.env.rank, 3);
  EXPECT_EQ(r.env.nranks, 4);
  EXPECT_EQ(r.env.localRank, 1);
  EXPECT_EQ(r.env.source, "SLURM_PROCID/SLURM_NTASKS");
  EXPECT_EQ(slurmJobPort(123456, 2), kJobPortBase + int((123456ull * 31 + 2) % kJobPortSpan));
  EXPECT_EQ(r.env.root, "gpu-a07:" + std::to_string(slurmJobPort(123456, 2)));
  // The step's task count wins over the job's.
  v["SLURM_STEP_NUM_TASKS"] = "5";
  EXPECT_EQ(read(v).env.nranks, 5);
  v.erase("SLURM_STEP_NUM_TASKS");
  // The job's node list when the step's is absent; steps differ in port.
  v.erase("SLURM_STEP_NODELIST");
  v["SLURM_STEP_ID"] = "3";
  EXPECT_EQ(read(v).env.root, "other1:" + std::to_string(slurmJobPort(123456, 3)));
  // Overrides.
  v["MASTER_ADDR"] = "head";
  EXPECT_EQ(read(v).env.root, "head:" + std::to_string(slurmJobPort(123456, 3)));
  v["MASTER_PORT"] = "6000";
  EXPECT_EQ(read(v).env.root, "head:6001");
  v["ATTN_ROOT"] = "x:1";
  EXPECT_EQ(read(v).env.root, "x:1");
}

TEST(LaunchEnv, SlurmMissingAndGarbage) {
  const Vars ok = {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_ID", "9"},
                   {"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NODELIST", "localhost"}};
  ASSERT_EQ(read(ok).err, "");
  auto with = [&](const char* k, const char* val) {
    Vars v = ok;
    if (val) v[k] = val;
    else v.erase(k);
    return read(v).err;
  };
  EXPECT_EQ(with("SLURM_NTASKS", nullptr), "SLURM_PROCID is set but SLURM_NTASKS is not");
  EXPECT_EQ(with("SLURM_NTASKS", "two"), "SLURM_NTASKS=\"two\" is not a number");
  EXPECT_EQ(with("SLURM_NTASKS", "2147483648"), "SLURM_NTASKS=\"2147483648\" is outside [1, 65536]");
  EXPECT_EQ(with("SLURM_NTASKS", "99999999999999999999999"),
            "SLURM_NTASKS=\"99999999999999999999999\" is out of range");
  EXPECT_EQ(with("SLURM_NTASKS", "0"), "SLURM_NTASKS=\"0\" is outside [1, 65536]");
  EXPECT_EQ(with("SLURM_NTASKS", "-2"), "SLURM_NTASKS=\"-2\" is not a number");
  EXPECT_EQ(with("SLURM_PROCID", "2"), "SLURM_PROCID=\"2\" is not below SLURM_NTASKS=\"2\"");
  EXPECT_EQ(with("SLURM_PROCID", " 0"), "SLURM_PROCID=\" 0\" is not a number");
  EXPECT_EQ(with("SLURM_LOCALID", "x"), "SLURM_LOCALID=\"x\" is not a number");
  EXPECT_EQ(with("SLURM_JOB_ID", nullptr), "srun ranks without SLURM_JOB_ID: set MASTER_PORT or ATTN_ROOT");
  EXPECT_EQ(with("SLURM_JOB_ID", "4294967296"), "SLURM_JOB_ID=\"4294967296\" is outside [0, 4294967295]");
  EXPECT_EQ(with("SLURM_STEP_ID", nullptr),
            "SLURM_PROCID without SLURM_STEP_ID: not a task of srun (an sbatch or salloc shell?): "
            "start the ranks with srun");
  EXPECT_EQ(with("SLURM_STEP_ID", "batch"), "SLURM_STEP_ID=\"batch\" is not a number");
  EXPECT_EQ(with("SLURM_STEP_ID", "4294967294"),
            "SLURM_STEP_ID=\"4294967294\" is Slurm's batch or extern step: start the ranks with srun");
  EXPECT_EQ(with("SLURM_STEP_NODELIST", nullptr),
            "srun ranks without SLURM_STEP_NODELIST or SLURM_JOB_NODELIST: set MASTER_ADDR (and "
            "MASTER_PORT) or ATTN_ROOT");
  EXPECT_EQ(with("SLURM_STEP_NODELIST", "n[1-"), "SLURM_STEP_NODELIST=\"n[1-\": unclosed '[' at offset 1");
  EXPECT_NE(with("SLURM_STEP_NODELIST", "n[1-1000000000]").find("more than 1048576 hosts"), std::string::npos);
  // Long garbage is cut short and made printable in the message.
  std::string junk(5000, 'x');
  junk[3] = '\x01';
  const std::string err = with("SLURM_NTASKS", junk.c_str());
  EXPECT_LT(err.size(), 120u) << err;
  EXPECT_NE(err.find("xxx?xx"), std::string::npos) << err;
  EXPECT_NE(err.find("...\""), std::string::npos) << err;
  EXPECT_EQ(with("MASTER_PORT", "65535"), "MASTER_PORT=\"65535\" is outside [1, 65534]");
  EXPECT_EQ(with("MASTER_ADDR", std::string(300, 'h').c_str()).find("MASTER_ADDR="), 0u);
}

// srun's PMI plugins set PMI_RANK with Slurm's numbers: that is srun, with
// its node list. mpiexec inside an allocation has different PMI numbers.
TEST(LaunchEnv, PmiAndSlurmTogether) {
  Vars v = {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_ID", "9"}, {"SLURM_STEP_ID", "0"},
            {"SLURM_STEP_NODELIST", "n[3-4]"}, {"PMI_RANK", "1"}, {"PMI_SIZE", "2"}};
  Read r = read(v);
  ASSERT_EQ(r.err, "");
  EXPECT_EQ(r.env.source, "SLURM_PROCID/SLURM_NTASKS");
  EXPECT_EQ(r.env.root.substr(0, 3), "n3:");
  v["SLURM_PROCID"] = "0";  // the batch step's, inherited by mpiexec's ranks
  v["MPI_LOCALNRANKS"] = "2";
  r = read(v, 99);
  ASSERT_EQ(r.err, "");
  EXPECT_EQ(r.env.source, "PMI_RANK/PMI_SIZE");
  EXPECT_EQ(r.env.rank, 1);
  EXPECT_EQ(r.env.root.substr(0, 10), "127.0.0.1:");
}

TEST(LaunchEnv, OtherConventionsHalfSetOrBad) {
  EXPECT_EQ(read({{"ATTN_RANK", "0"}}).err, "ATTN_RANK is set but ATTN_NRANKS is not");
  EXPECT_EQ(read({{"RANK", "0"}, {"WORLD_SIZE", "1x"}}).err, "WORLD_SIZE=\"1x\" is not a number");
  EXPECT_EQ(read({{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "65537"}}).err,
            "OMPI_COMM_WORLD_SIZE=\"65537\" is outside [1, 65536]");
  EXPECT_EQ(read({{"PMI_RANK", "0"}, {"PMI_SIZE", "1"}, {"MPI_LOCALNRANKS", "0"}}).err,
            "MPI_LOCALNRANKS=\"0\" is outside [1, 65536]");
  EXPECT_EQ(read({{"ATTN_RANK", "0"}, {"ATTN_NRANKS", "1"}, {"ATTN_ROOT", std::string(2000, 'r')}})
                .err.substr(0, 11),
            "ATTN_ROOT=\"");
  // Empty counts as unset, as everywhere else.
  EXPECT_NE(read({{"ATTN_RANK", ""}, {"SLURM_PROCID", ""}}).err.find("no rank"), std::string::npos);
}

TEST(LaunchEnv, JobPortsStayInTheirRange) {
  for (uint64_t j : {0ull, 1ull, 4294967295ull, 123456789ull})
    for (uint64_t s : {0ull, 1ull, 4294967295ull}) {
      const int p = slurmJobPort(j, s);
      EXPECT_GE(p, kJobPortBase);
      EXPECT_LT(p, kJobPortBase + kJobPortSpan);
    }
  EXPECT_NE(slurmJobPort(100, 0), slurmJobPort(100, 1));
  EXPECT_NE(slurmJobPort(100, 0), slurmJobPort(101, 0));
  for (const char* id : {"", "1", "34799617", "a-long-pmix-namespace"}) {
    const int p = namedJobPort(id);
    EXPECT_GE(p, kJobPortBase);
    EXPECT_LT(p, kJobPortBase + kJobPortSpan);
  }
}

}  // namespace
}  // namespace attn
