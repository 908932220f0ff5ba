#include "perf/plot.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <vector>

#ifndef ATTN_PERF_PLOT_SCRIPT
#define ATTN_PERF_PLOT_SCRIPT "perf/plot_perf.py"
#endif

namespace attnperf {
namespace {

// plot_perf.py's exit status when matplotlib cannot be imported.
constexpr int kNoMatplotlib = 3;
// The child's status when exec itself failed (the shell's convention).
constexpr int kExecFailed = 127;

// The last non-empty line of s.
std::string lastLine(const std::string& s) {
  size_t end = s.find_last_not_of("\n\r ");
  if (end == std::string::npos) return "";
  size_t begin = s.rfind('\n', end);
  return s.substr(begin == std::string::npos ? 0 : begin + 1, end - (begin == std::string::npos ? 0 : begin + 1) + 1);
}

}  // namespace

bool writePlot(const std::string& jsonPath, const std::string& pngPath, std::string* why) {
  const char* env = getenv("ATTN_PERF_PLOT_SCRIPT");
  const std::string script = env && *env ? env : ATTN_PERF_PLOT_SCRIPT;
  // Everything the child needs is built before fork: only exec-safe calls after it.
  std::vector<std::string> args = {"python3", script, jsonPath, "-o", pngPath};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int err[2];
  if (pipe2(err, O_CLOEXEC) != 0) {
    *why = "pipe failed";
    return false;
  }
  const pid_t pid = fork();
  if (pid < 0) {
    close(err[0]);
    close(err[1]);
    *why = "fork failed";
    return false;
  }
  if (pid == 0) {
    dup2(err[1], STDERR_FILENO);  // dup2 clears close-on-exec on the copy
    int null = open("/dev/null", O_WRONLY);
    if (null >= 0) dup2(null, STDOUT_FILENO);  // the script's "wrote ..." is ours to say
    execvp("python3", argv.data());
    _exit(kExecFailed);
  }
  close(err[1]);
  std::string text;
  char buf[4096];
  for (;;) {
    const ssize_t got = read(err[0], buf, sizeof(buf));
    if (got > 0) text.append(buf, size_t(got));
    else if (got < 0 && errno == EINTR) continue;
    else break;
  }
  close(err[0]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return true;
  const std::string line = lastLine(text);
  if (WIFEXITED(st) && WEXITSTATUS(st) == kExecFailed && line.empty())
    *why = "python3 not found on PATH";
  else if (WIFEXITED(st) && WEXITSTATUS(st) == kNoMatplotlib)
    *why = line.empty() ? "matplotlib not installed: pip install matplotlib (or apt install python3-matplotlib)" : line;
  else
    *why = script + " failed" + (line.empty() ? std::string() : ": " + line);
  return false;
}

}  // namespace attnperf
