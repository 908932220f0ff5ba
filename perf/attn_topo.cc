// attn_topo: prints the fabric model a communicator builds — ranks with
// their rack, host, NUMA node, GPU and NIC, the tiers with bandwidth and
// latency, the proximity order, and this machine's hardware view — as text,
// and on request as JSON, Graphviz DOT, and PNG (where `dot` is installed).
//
//   attn_topo                      one rank (a thread)
//   attn_topo -t 4 | -p 4          four ranks as threads / processes
//   mpirun -np 8 attn_topo         ranks from a launcher (ATTN_RANK, RANK, ...)
//   attn_topo --dot topo.dot --png topo.png --json topo.json
//   attn_topo --nccl-topo ndv5-topo.xml   a cloud's NCCL topology file: GPU-NIC
//                                         pairs and NUMA nodes from it
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "attncomm.h"
#include "perf/launch.h"
#include "topology/nccl_topo_xml.h"

extern char** environ;

namespace {

struct Args {
  int threads = 0, procs = 0;
  bool probe = false;
  std::string dot, png, json, ncclTopo;
};

void usage(FILE* f) {
  std::fprintf(f,
               "usage: attn_topo [-t N | -p N] [--probe] [--nccl-topo FILE] [--dot FILE] [--png FILE] [--json FILE]\n"
               "  -t N        N ranks as threads (default 1)\n"
               "  -p N        N ranks as forked processes (set ATTN_HOSTID/ATTN_RACKID per rank\n"
               "              through a launcher to emulate hosts and racks)\n"
               "  --probe     measure the tiers at init (same as ATTN_TOPO_PROBE=1)\n"
               "  --nccl-topo FILE  read the machine's PCI tree from an NCCL topology XML file\n"
               "              (same as ATTN_NCCL_TOPO_FILE; NCCL_TOPO_FILE is read when neither is set)\n"
               "  --dot FILE  write the model as Graphviz DOT\n"
               "  --png FILE  render it with `dot -Tpng` (needs Graphviz)\n"
               "  --json FILE write the model as JSON (the ATTN_TOPO_FILE schema)\n");
}

bool parse(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    std::string v;
    if (s == "-h" || s == "--help") {
      usage(stdout);
      std::exit(0);
    } else if (s == "-t" && value(&v)) {
      a->threads = std::atoi(v.c_str());
    } else if (s == "-p" && value(&v)) {
      a->procs = std::atoi(v.c_str());
    } else if (s == "--probe") {
      a->probe = true;
    } else if (s == "--nccl-topo" && value(&a->ncclTopo)) {
    } else if (s == "--dot" && value(&a->dot)) {
    } else if (s == "--png" && value(&a->png)) {
    } else if (s == "--json" && value(&a->json)) {
    } else {
      std::fprintf(stderr, "attn_topo: bad argument '%s'\n", s.c_str());
      return false;
    }
  }
  if (a->threads < 0 || a->procs < 0 || a->threads > 4096 || a->procs > 1024 || (a->threads && a->procs)) {
    std::fprintf(stderr, "attn_topo: -t and -p take a positive count, and only one of them\n");
    return false;
  }
  return true;
}

bool dump(attnComm_t comm, int format, std::string* out) {
  size_t size = 0;
  if (attnCommTopoDump(comm, format, nullptr, &size) != attnSuccess) return false;
  out->assign(size, '\0');
  if (attnCommTopoDump(comm, format, out->data(), &size) != attnSuccess) return false;
  out->resize(size - 1);
  return true;
}

bool writeFile(const std::string& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return std::perror(path.c_str()), false;
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = std::fclose(f) == 0 && ok;
  if (!ok) std::fprintf(stderr, "attn_topo: cannot write %s\n", path.c_str());
  return ok;
}

bool haveDot() {
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    std::string dir = p.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (!dir.empty() && access((dir + "/dot").c_str(), X_OK) == 0) return true;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return false;
}

// dot -Tpng -o png dotFile, without a shell.
bool renderPng(const std::string& dotFile, const std::string& png) {
  std::string a0 = "dot", a1 = "-Tpng", a2 = "-o";
  char* argv[] = {a0.data(), a1.data(), a2.data(), const_cast<char*>(png.c_str()),
                  const_cast<char*>(dotFile.c_str()), nullptr};
  pid_t pid;
  if (posix_spawnp(&pid, "dot", nullptr, nullptr, argv, environ) != 0) return false;
  int st = 0;
  while (waitpid(pid, &st, 0) < 0) {
  }
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int report(attnComm_t comm, const Args& a) {
  int rank = 0;
  attnCommUserRank(comm, &rank);
  int rc = 0;
  if (rank == 0) {
    std::string text, dotText, json;
    if (!dump(comm, attnTopoFormatText, &text)) {
      std::fprintf(stderr, "attn_topo: %s\n", attnGetLastError(comm));
      rc = 2;
    } else {
      std::fputs(text.c_str(), stdout);
    }
    if (rc == 0 && !a.json.empty() && !(dump(comm, attnTopoFormatJson, &json) && writeFile(a.json, json))) rc = 2;
    if (rc == 0 && (!a.dot.empty() || !a.png.empty())) {
      std::string dotFile = a.dot.empty() ? a.png + ".dot" : a.dot;
      if (!dump(comm, attnTopoFormatDot, &dotText) || !writeFile(dotFile, dotText)) rc = 2;
      else if (!a.dot.empty()) std::printf("DOT written to %s\n", dotFile.c_str());
      if (rc == 0 && !a.png.empty()) {
        if (!haveDot()) {
          std::printf("PNG not rendered: Graphviz `dot` is not installed (DOT in %s)\n", dotFile.c_str());
        } else if (!renderPng(dotFile, a.png)) {
          std::fprintf(stderr, "attn_topo: dot -Tpng failed for %s\n", dotFile.c_str());
          rc = 2;
        } else {
          std::printf("PNG written to %s\n", a.png.c_str());
        }
        if (a.dot.empty()) unlink(dotFile.c_str());
      }
    }
    std::fflush(stdout);
  }
  attnCommDestroy(comm);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!parse(argc, argv, &a)) {
    usage(stderr);
    return 2;
  }
  if (a.probe) setenv("ATTN_TOPO_PROBE", "1", 1);
  if (!a.ncclTopo.empty()) {
    // Checked here so a bad file stops the tool with its line; the library
    // itself warns and goes on without it.
    attn::MachineView m;
    std::string err;
    if (!attn::loadNcclTopoFile(a.ncclTopo, &m, &err)) {
      std::fprintf(stderr, "attn_topo: %s\n", err.c_str());
      return 2;
    }
    setenv("ATTN_NCCL_TOPO_FILE", a.ncclTopo.c_str(), 1);
  }
  auto body = [&a](attnComm_t comm) { return report(comm, a); };
  if (a.procs) return attnperf::launchProcesses(a.procs, body);
  if (a.threads || !attnperf::launchedExternally()) return attnperf::launchThreads(a.threads ? a.threads : 1, body);
  return attnperf::launchExternal(body);
}
