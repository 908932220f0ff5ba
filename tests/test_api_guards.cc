// Nothing but a result code crosses the C API: every function that
// include/attncomm.h declares is defined (in src/) as one guarded body,
//
//     attnResult_t attnX(...) {
//       return guardedEntry([&] { ... });      // or guardedText for strings
//     }
//
// which turns any C++ exception into a code (src/core/api_call.h). This
// reads the sources, so a new entry point without the guard fails here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> DeclaredEntryPoints() {
  const std::string header = ReadFile(fs::path(ATTN_SOURCE_DIR) / "include" / "attncomm.h");
  std::vector<std::string> names;
  const std::regex decl(R"(ATTN_API\s+(?:const\s+)?\w+\s*\*?\s*(attn\w+)\s*\()");
  for (auto it = std::sregex_iterator(header.begin(), header.end(), decl); it != std::sregex_iterator(); ++it)
    names.push_back((*it)[1]);
  return names;
}

// Where a definition of `name` in `text` starts its body: the text after
// the parameter list's closing ')' and the '{' that follows; npos for a
// declaration or a call.
struct Definition {
  size_t line;
  std::string body;  // from the '{' on (a few hundred characters)
};

std::vector<Definition> DefinitionsIn(const std::string& text, const std::string& name) {
  std::vector<Definition> out;
  // At the start of a line: [extern "C"] [const] type[*] name(
  const std::regex def("(^|\\n)(?:extern \"C\"\\s+)?(?:const\\s+)?\\w+\\s*\\*?\\s*" + name + "\\s*\\(");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), def); it != std::sregex_iterator(); ++it) {
    size_t i = size_t(it->position(0) + it->length(0));
    int depth = 1;
    while (i < text.size() && depth > 0) {
      if (text[i] == '(') ++depth;
      if (text[i] == ')') --depth;
      ++i;
    }
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    if (i >= text.size() || text[i] != '{') continue;  // a declaration
    const size_t line = size_t(std::count(text.begin(), text.begin() + long(i), '\n')) + 1;
    out.push_back({line, text.substr(i, 300)});
  }
  return out;
}

bool Guarded(const std::string& body) {
  static const std::regex guard(R"(^\{\s*return\s+guarded(Entry|Text)\s*\()");
  return std::regex_search(body, guard);
}

TEST(ApiGuards, EveryEntryPointOfTheHeaderIsGuarded) {
  const std::vector<std::string> names = DeclaredEntryPoints();
  ASSERT_GE(names.size(), 57u) << "the header's ATTN_API declarations were not found";
  std::map<std::string, int> definitions;
  std::vector<std::string> unguarded;
  for (const auto& entry : fs::recursive_directory_iterator(fs::path(ATTN_SOURCE_DIR) / "src")) {
    if (!entry.is_regular_file() || entry.path().extension() != ".cc") continue;
    const std::string text = ReadFile(entry.path());
    for (const std::string& name : names) {
      if (text.find(name) == std::string::npos) continue;
      for (const Definition& d : DefinitionsIn(text, name)) {
        ++definitions[name];
        if (!Guarded(d.body))
          unguarded.push_back(name + " at " + fs::relative(entry.path(), ATTN_SOURCE_DIR).string() + ":" +
                              std::to_string(d.line));
      }
    }
  }
  for (const std::string& name : names) EXPECT_GT(definitions[name], 0) << name << ": no definition found in src/";
  std::string list;
  for (const std::string& u : unguarded) list += "\n  " + u;
  EXPECT_TRUE(unguarded.empty()) << unguarded.size()
                                 << " entry point(s) whose body is not `return guardedEntry(...)` / "
                                    "`return guardedText(...)`:"
                                 << list;
}

// The entries of the LSE conventions and of the native kernel hook are
// declared, defined once and guarded (the test above checks every entry;
// this one fails if these were dropped from the header).
TEST(ApiGuards, LseAndKernelHookEntriesAreDeclaredAndGuarded) {
  const std::vector<std::string> names = DeclaredEntryPoints();
  for (const char* want : {"attnMergeAttnStatesLse", "attnCommSetAttnKernelEx", "attnMergeAttnStates",
                           "attnCommSetAttnKernel"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want << " is not declared";
    int defs = 0;
    for (const auto& entry : fs::recursive_directory_iterator(fs::path(ATTN_SOURCE_DIR) / "src")) {
      if (!entry.is_regular_file() || entry.path().extension() != ".cc") continue;
      for (const Definition& d : DefinitionsIn(ReadFile(entry.path()), want)) {
        ++defs;
        EXPECT_TRUE(Guarded(d.body)) << want << " in " << entry.path();
      }
    }
    EXPECT_EQ(defs, 1) << want;
  }
}

}  // namespace
