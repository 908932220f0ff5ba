// The settings table (src/core/settings.def): typed reads behave as the
// table says, the README's environment table lists exactly the declared
// variables (plus the tools' own), and no library source reads a variable
// by its name outside the table.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "src/core/error.h"
#include "src/core/settings.h"

namespace attn {
namespace {

namespace fs = std::filesystem;

// WARN lines go to stderr, where the tests capture them; set before the
// logger reads its configuration (on its first line).
const bool kLogWarn = [] {
  setenv("ATTN_DEBUG", "WARN", 1);
  unsetenv("ATTN_DEBUG_SUBSYS");
  unsetenv("ATTN_DEBUG_FILE");
  return true;
}();

std::string readFile(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Sets a variable for one scope, restoring what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) setenv(name_.c_str(), old_->c_str(), 1);
    else unsetenv(name_.c_str());
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// Runs `read` with stderr captured; returns what was written.
template <typename F>
std::string stderrOf(F read) {
  testing::internal::CaptureStderr();
  read();
  fflush(stderr);
  return testing::internal::GetCapturedStderr();
}

// ---- The table itself ------------------------------------------------------

TEST(Settings, TableIsWellFormed) {
  ASSERT_TRUE(kLogWarn);
  std::set<std::string> names;
  const std::regex nameRe("[A-Z][A-Za-z0-9_]*");
  for (const SettingInfo& s : kSettings) {
    SCOPED_TRACE(s.name);
    EXPECT_TRUE(names.insert(s.name).second) << "declared twice";
    EXPECT_TRUE(std::regex_match(s.name, nameRe));
    EXPECT_GT(std::string(s.meaning).size(), 5u) << "no meaning";
    const bool attn = std::string(s.name).rfind("ATTN_", 0) == 0;
    // Our variables are ATTN_*; another program's are declared foreign.
    EXPECT_EQ(attn, s.kind != SettingKind::kForeign);
    if (s.kind == SettingKind::kInt) {
      EXPECT_LE(s.lo, s.hi);
      EXPECT_GE(s.intDefault, s.lo);
      EXPECT_LE(s.intDefault, s.hi);
    }
    if (s.kind == SettingKind::kEnum) EXPECT_NE(std::string(s.text).find(','), std::string::npos);
  }
}

TEST(Settings, ChoiceIndex) {
  EXPECT_EQ(settingChoiceIndex(Setting::kAlgo, "auto"), 0);
  EXPECT_EQ(settingChoiceIndex(Setting::kAlgo, "ring"), 1);
  EXPECT_EQ(settingChoiceIndex(Setting::kAlgo, "direct"), 3);
  EXPECT_EQ(settingChoiceIndex(Setting::kAlgo, "dir"), -1);
  EXPECT_EQ(settingChoiceIndex(Setting::kAlgo, ""), -1);
  static_assert(settingChoiceIndex(Setting::kAllToAll, "stepped") == 2);
}

// ---- Typed reads -----------------------------------------------------------

TEST(Settings, IntDefaultRangeAndMalformed) {
  {
    ScopedEnv e("ATTN_SHM_SPIN_US", nullptr);
    EXPECT_EQ(settingInt<Setting::kShmSpinUs>(), 5);
  }
  {
    ScopedEnv e("ATTN_SHM_SPIN_US", "");  // empty is unset
    EXPECT_EQ(settingInt<Setting::kShmSpinUs>(), 5);
  }
  {
    ScopedEnv e("ATTN_SHM_SPIN_US", "17");
    EXPECT_EQ(settingInt<Setting::kShmSpinUs>(), 17);
  }
  {
    ScopedEnv e("ATTN_SHM_SPIN_US", "0x10");  // strtoll base 0, as before
    EXPECT_EQ(settingInt<Setting::kShmSpinUs>(), 16);
  }
  {  // kClamp: into [0, 1000000]
    ScopedEnv e("ATTN_SHM_SPIN_US", "-3");
    EXPECT_EQ(settingInt<Setting::kShmSpinUs>(), 0);
    ScopedEnv e2("ATTN_SHM_SPIN_US", "5000000");
    EXPECT_EQ(settingInt<Setting::kShmSpinUs>(), 1000000);
  }
  {  // malformed: WARN naming it, and the default
    ScopedEnv e("ATTN_SHM_SPIN_US", "12abc");
    int64_t v = -1;
    const std::string err = stderrOf([&] { v = settingInt<Setting::kShmSpinUs>(); });
    EXPECT_EQ(v, 5);
    EXPECT_NE(err.find("WARN"), std::string::npos) << err;
    EXPECT_NE(err.find("ATTN_SHM_SPIN_US=\"12abc\""), std::string::npos) << err;
    EXPECT_NE(err.find("not an integer"), std::string::npos) << err;
  }
  {  // kWarn: out of range warns and takes the default
    ScopedEnv e("ATTN_SHM_SLOTS", "4096");
    int64_t v = -1;
    const std::string err = stderrOf([&] { v = settingInt<Setting::kShmSlots>(); });
    EXPECT_EQ(v, 16);
    EXPECT_NE(err.find("ATTN_SHM_SLOTS=4096"), std::string::npos) << err;
    EXPECT_NE(err.find("[2, 1024]"), std::string::npos) << err;
    ScopedEnv e2("ATTN_SHM_SLOTS", "1024");
    EXPECT_EQ(settingInt<Setting::kShmSlots>(), 1024);
  }
  {  // kClamp with a floor: the ring's chunk is at least 4096 bytes
    ScopedEnv e("ATTN_CHUNK_SIZE", "100");
    EXPECT_EQ(settingInt<Setting::kChunkSize>(), 4096);
  }
  {  // ATTN_HIER_SEGMENTS: <= 0 is auto (0), above 64 is 64
    ScopedEnv e("ATTN_HIER_SEGMENTS", "-2");
    EXPECT_EQ(settingInt<Setting::kHierSegments>(), 0);
    ScopedEnv e2("ATTN_HIER_SEGMENTS", "100");
    EXPECT_EQ(settingInt<Setting::kHierSegments>(), 64);
  }
}

TEST(Settings, IntStrict) {
  int64_t v = -1;
  {
    ScopedEnv e("ATTN_TIMEOUT_MS", nullptr);
    ASSERT_EQ(settingIntStrict<Setting::kTimeoutMs>(&v), attnSuccess);
    EXPECT_EQ(v, 300000);
  }
  {
    ScopedEnv e("ATTN_TIMEOUT_MS", "0");
    ASSERT_EQ(settingIntStrict<Setting::kTimeoutMs>(&v), attnSuccess);
    EXPECT_EQ(v, 0);
  }
  for (const char* bad : {"-1", "2147483648", "1e3", "0x10", "ten"}) {
    SCOPED_TRACE(bad);
    ScopedEnv e("ATTN_TIMEOUT_MS", bad);
    EXPECT_EQ(settingIntStrict<Setting::kTimeoutMs>(&v), attnInvalidArgument);
    EXPECT_NE(std::string(attnGetLastError(nullptr)).find("ATTN_TIMEOUT_MS"), std::string::npos);
  }
}

TEST(Settings, BoolSpellings) {
  for (const char* yes : {"1", "true", "TRUE", "Yes", "on", "ON"}) {
    ScopedEnv e("ATTN_TOPO_PROBE", yes);
    EXPECT_TRUE(settingBool<Setting::kTopoProbe>()) << yes;
  }
  for (const char* no : {"0", "false", "No", "off", "OFF"}) {
    ScopedEnv e("ATTN_SHM_CMA", no);
    EXPECT_FALSE(settingBool<Setting::kShmCma>()) << no;
  }
  {
    ScopedEnv e("ATTN_SHM_CMA", nullptr);
    EXPECT_TRUE(settingBool<Setting::kShmCma>());
    ScopedEnv e2("ATTN_TOPO_PROBE", nullptr);
    EXPECT_FALSE(settingBool<Setting::kTopoProbe>());
  }
  {  // malformed: WARN and the default
    ScopedEnv e("ATTN_SHM_CMA", "2");
    bool v = false;
    const std::string err = stderrOf([&] { v = settingBool<Setting::kShmCma>(); });
    EXPECT_TRUE(v);
    EXPECT_NE(err.find("ATTN_SHM_CMA=\"2\""), std::string::npos) << err;
    EXPECT_NE(err.find("not a boolean"), std::string::npos) << err;
  }
}

TEST(Settings, EnumAndStringAndReal) {
  int i = -1;
  {
    ScopedEnv e("ATTN_ALGO", nullptr);
    ASSERT_EQ(settingEnum<Setting::kAlgo>(&i), attnSuccess);
    EXPECT_EQ(i, 0);
  }
  {
    ScopedEnv e("ATTN_ALGO", "hier");
    ASSERT_EQ(settingEnum<Setting::kAlgo>(&i), attnSuccess);
    EXPECT_EQ(i, 2);
  }
  {
    ScopedEnv e("ATTN_ALGO", "Ring");  // exact spelling only, as before
    EXPECT_EQ(settingEnum<Setting::kAlgo>(&i), attnInvalidArgument);
    EXPECT_STREQ(attnGetLastError(nullptr), "ATTN_ALGO='Ring' is not one of ring, hier, direct, auto");
  }
  {
    ScopedEnv e("ATTN_TOPO_DUMP_FILE", "");
    EXPECT_FALSE(settingString(Setting::kTopoDumpFile).has_value());
    EXPECT_FALSE(settingIsSet(Setting::kTopoDumpFile));
    ASSERT_NE(settingRaw(Setting::kTopoDumpFile), nullptr);  // raw: set, empty
    EXPECT_STREQ(settingRaw(Setting::kTopoDumpFile), "");
  }
  {
    ScopedEnv e("ATTN_MODEL_LAT_US", "2.5");
    EXPECT_DOUBLE_EQ(settingReal<Setting::kModelLatUs>().value_or(0), 2.5);
    ScopedEnv e2("ATTN_MODEL_TFLOPS", nullptr);
    EXPECT_FALSE(settingReal<Setting::kModelTflops>().has_value());
  }
  {  // the launchers' lookup: declared names only
    ScopedEnv e("SLURM_PROCID", "3");
    ASSERT_NE(settingRawByName("SLURM_PROCID"), nullptr);
    EXPECT_STREQ(settingRawByName("SLURM_PROCID"), "3");
    ScopedEnv e2("ATTN_NOT_DECLARED_ANYWHERE", "1");
    EXPECT_EQ(settingRawByName("ATTN_NOT_DECLARED_ANYWHERE"), nullptr);
  }
}

// ---- The README's table ----------------------------------------------------

// Variables in the README's table that the library does not read, each with
// what reads it. Nothing else may be missing from the declaration.
const std::map<std::string, std::string> kToolVariables = {
    {"ATTN_PERF_NO_MPI", "perf/ (perf binaries built with MPI)"},
    {"ATTN_PERF_PLOT_SCRIPT", "perf/ (--plot)"},
    {"ATTN_LIBRARY", "python/attncomm, python/setup.py"},
    {"ATTN_CUDA_EMU_DEVICES", "tests/cuda_emu"},
    {"ATTN_CUDA_EMU_VERBOSE", "tests/cuda_emu"},
    {"ATTN_CUDA_EMU_STREAM_DELAY_US", "tests/cuda_emu"},
    {"ATTN_CUDA_EMU_DEVICE_MB", "tests/cuda_emu"},
    {"ATTN_FUZZ_SEEDS", "tests/python/test_*_fuzz.py, tests/test_device_fuzz.cc"},
    {"ATTN_FUZZ_ITERS", "tests/python/test_*_fuzz.py, tests/test_device_fuzz.cc"},
    {"ATTN_FUZZ_TRACE", "tests/python/test_coll_fuzz.py"},
    {"ATTN_TEST_CUDA_EMU", "scripts/test.sh"},
    {"ATTN_TEST_SANITIZE", "scripts/test.sh"},
    {"ATTN_FUZZ_SECONDS", "scripts/test.sh"},
};

// Every backticked name in the first column of the README's "Environment
// variables" table, with the row's default column.
std::map<std::string, std::string> readmeRows() {
  const std::string text = readFile(fs::path(ATTN_SOURCE_DIR) / "README.md");
  std::istringstream in(text);
  std::string line;
  bool inSection = false, inTable = false;
  std::map<std::string, std::string> names;
  const std::regex tick("`([A-Za-z][A-Za-z0-9_]*)`");
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) {
      if (inSection) break;
      inSection = line == "## Environment variables";
      continue;
    }
    if (!inSection) continue;
    if (line.rfind("|", 0) != 0) {
      if (inTable) break;  // the table's end
      continue;
    }
    inTable = true;
    const size_t end = line.find('|', 1);
    const std::string first = line.substr(1, end == std::string::npos ? std::string::npos : end - 1);
    std::string def;
    if (end != std::string::npos) {
      const size_t end2 = line.find('|', end + 1);
      def = line.substr(end + 1, end2 == std::string::npos ? std::string::npos : end2 - end - 1);
      def.erase(0, def.find_first_not_of(' '));
      def.erase(def.find_last_not_of(' ') + 1);
    }
    for (std::sregex_iterator it(first.begin(), first.end(), tick), e; it != e; ++it)
      names.emplace((*it)[1].str(), def);
  }
  return names;
}

TEST(Settings, ReadmeTableMatchesDeclaration) {
  const std::map<std::string, std::string> readme = readmeRows();
  ASSERT_GT(readme.size(), 50u) << "README's \"## Environment variables\" table not found";
  std::set<std::string> declared;
  for (const SettingInfo& s : kSettings) {
    declared.insert(s.name);
    EXPECT_TRUE(readme.count(s.name))
        << s.name << " is declared in src/core/settings.def but not in README.md's environment table";
  }
  for (const auto& [n, def] : readme) {
    if (n.rfind("ATTN_", 0) != 0) continue;
    EXPECT_TRUE(declared.count(n) || kToolVariables.count(n))
        << n << " is in README.md's environment table but neither declared in src/core/settings.def "
        << "nor listed in test_settings.cc's kToolVariables";
  }
  // Where the README gives a number as the default, it is the table's.
  for (const SettingInfo& s : kSettings) {
    if (s.kind != SettingKind::kInt && s.kind != SettingKind::kBool) continue;
    const auto row = readme.find(s.name);
    if (row == readme.end() || !std::regex_match(row->second, std::regex("[0-9]+"))) continue;
    EXPECT_EQ(row->second, std::to_string(s.intDefault)) << s.name << ": README.md's default differs";
  }
  for (const auto& [n, tool] : kToolVariables) {
    EXPECT_FALSE(declared.count(n)) << n << " is declared: drop it from kToolVariables";
    EXPECT_TRUE(readme.count(n)) << n << " (" << tool << ") is not in README.md's table";
  }
}

// ---- No reads by name outside the table ------------------------------------

// The library's sources (the leaves included).
std::vector<fs::path> librarySources() {
  std::vector<fs::path> out;
  for (const char* dir : {"src", "transports", "kernels", "topology"}) {
    const fs::path root = fs::path(ATTN_SOURCE_DIR) / dir;
    if (!fs::exists(root)) continue;
    for (const auto& e : fs::recursive_directory_iterator(root)) {
      const std::string ext = e.path().extension().string();
      if (e.is_regular_file() && (ext == ".cc" || ext == ".h" || ext == ".cu" || ext == ".cuh" || ext == ".cpp"))
        out.push_back(e.path());
    }
  }
  return out;
}

std::string repoPath(const fs::path& p) { return fs::relative(p, ATTN_SOURCE_DIR).generic_string(); }

// A line without its // comment (not inside a string literal).
std::string code(const std::string& line) {
  bool inString = false;
  for (size_t i = 0; i + 1 < line.size(); ++i) {
    if (line[i] == '\\' && inString) {
      ++i;
      continue;
    }
    if (line[i] == '"') inString = !inString;
    if (!inString && line[i] == '/' && line[i + 1] == '/') return line.substr(0, i);
  }
  return line;
}

// Reads by a literal name allowed outside the table, file by file: none.
// The leaves (kernels/, topology/) get their values from their callers
// (src/core/kernel_setup.cc, src/core/topo_settings.cc); a file listed here
// would be a debt to pay.
const std::map<std::string, std::set<std::string>> kLeafReads = {};

// The table's own implementation: it reads the environment by the names the
// table holds. launch_env.cc names the launchers' variables itself and reads
// them through the lookup api_env.cc gives it (settingRawByName).
const std::set<std::string> kTableFiles = {"src/core/settings.cc", "src/core/settings.h", "src/core/settings.def",
                                           "src/core/env.cc", "src/core/env.h"};

TEST(Settings, NoReadByNameOutsideTheTable) {
  std::set<std::string> declared;
  for (const SettingInfo& s : kSettings) declared.insert(s.name);
  for (const auto& [file, names] : kLeafReads)
    for (const std::string& n : names) EXPECT_TRUE(declared.count(n)) << file << ": " << n << " is not declared";

  const std::regex call(R"(\b(secure_getenv|getenv|envString|envInt|envBool)\s*\()");
  const std::regex literalCall(R"(\b(?:secure_getenv|getenv|envString|envInt|envBool)\s*\(\s*"([^"]*)\")");
  const std::regex literal(R"re("([A-Z][A-Za-z0-9_]*)")re");
  size_t scanned = 0;
  for (const fs::path& p : librarySources()) {
    const std::string rel = repoPath(p);
    if (kTableFiles.count(rel)) continue;
    ++scanned;
    const auto leaf = kLeafReads.find(rel);
    std::istringstream in(readFile(p));
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      const std::string c = code(line);
      // (1) the environment read directly: only by a leaf, of its names.
      if (std::regex_search(c, call)) {
        std::smatch m;
        const bool allowed = leaf != kLeafReads.end() && std::regex_search(c, m, literalCall) &&
                             leaf->second.count(m[1].str());
        EXPECT_TRUE(allowed) << rel << ":" << n << " reads the environment outside src/core/settings: " << line;
      }
      // (2) a declared variable's name as a whole string literal (a list of
      // names to read, a lookup by name): use the Setting and settingName().
      if (rel == "src/core/launch_env.cc") {
        // The launchers' variables: each must be declared, or the lookup
        // (settingRawByName) never sees it.
        for (std::sregex_iterator it(c.begin(), c.end(), literal), e; it != e; ++it) {
          const std::string name = (*it)[1].str();
          if (name.find('_') != std::string::npos || name == "RANK")
            EXPECT_TRUE(declared.count(name)) << rel << ":" << n << ": " << name
                                              << " is read from the launcher but not declared in settings.def";
        }
        continue;
      }
      for (std::sregex_iterator it(c.begin(), c.end(), literal), e; it != e; ++it) {
        const std::string name = (*it)[1].str();
        if (!declared.count(name)) continue;
        const bool allowed = leaf != kLeafReads.end() && leaf->second.count(name);
        EXPECT_TRUE(allowed) << rel << ":" << n << " names " << name
                             << " by a literal: use Setting and settingName() (src/core/settings.h)";
      }
    }
  }
  EXPECT_GT(scanned, 100u);
}

}  // namespace
}  // namespace attn
