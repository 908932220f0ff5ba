// The main() of a fuzz harness built without libFuzzer (gcc, or a build
// without ATTN_FUZZ): runs LLVMFuzzerTestOneInput once on every file named,
// and on every file inside every directory named, so ctest replays the seed
// corpus and the regression inputs in every build, sanitized or not.
// Arguments starting with '-' are libFuzzer flags and are ignored here.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

bool isDirectory(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::vector<std::string> filesIn(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name == "." || name == ".." || name[0] == '.') continue;  // .gitkeep and the like
      out.push_back(dir + "/" + name);
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> inputs;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (!a.empty() && a[0] == '-') continue;
    if (isDirectory(a)) {
      auto f = filesIn(a);
      inputs.insert(inputs.end(), f.begin(), f.end());
    } else {
      inputs.push_back(a);
    }
  }
  size_t ran = 0;
  for (const std::string& path : inputs) {
    std::ifstream f(path, std::ios::binary);
    if (!f) {
      std::fprintf(stderr, "replay: cannot read %s\n", path.c_str());
      return 1;
    }
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
    ++ran;
  }
  std::printf("replay: %zu inputs ran\n", ran);
  return ran > 0 ? 0 : 1;  // an empty corpus means a wrong path, not a pass
}
