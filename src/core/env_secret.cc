#include "src/core/env_secret.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "src/core/auth.h"
#include "src/core/settings.h"
#include "src/core/error.h"

namespace attn {
namespace {

bool isSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

int hexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

bool parseSecretHex(const char* text, size_t len, uint8_t secret[16]) {
  if (text == nullptr) return false;
  size_t b = 0, e = len;
  while (b < e && isSpace(text[b])) ++b;
  while (e > b && isSpace(text[e - 1])) --e;
  if (e - b != 32) return false;
  uint8_t out[16];
  for (size_t i = 0; i < 16; ++i) {
    const int hi = hexValue(text[b + 2 * i]), lo = hexValue(text[b + 2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = uint8_t(hi << 4 | lo);
  }
  std::memcpy(secret, out, 16);
  return true;
}

attnResult_t readSecretFile(const std::string& path, uint8_t secret[16]) {
  const char* p = path.c_str();
  const int fd = ::open(p, O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0)
    return setError(attnInvalidArgument, "ATTN_SECRET_FILE=\"%s\": cannot open: %s", p,
                    strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (fstat(fd, &st) != 0)
    return setError(attnInvalidArgument, "ATTN_SECRET_FILE=\"%s\": cannot stat: %s", p,
                    strerror(errno));
  if (!S_ISREG(st.st_mode))
    return setError(attnInvalidArgument, "ATTN_SECRET_FILE=\"%s\" is not a regular file", p);
  if (st.st_uid != geteuid())
    return setError(attnInvalidArgument, "ATTN_SECRET_FILE=\"%s\" is owned by uid %u, not by "
                    "this user (uid %u)", p, unsigned(st.st_uid), unsigned(geteuid()));
  if ((st.st_mode & 077) != 0)
    return setError(attnInvalidArgument, "ATTN_SECRET_FILE=\"%s\" has mode %04o: others than its "
                    "owner may read it; make it 0600 or stricter (chmod 600)", p,
                    unsigned(st.st_mode & 07777));
  if (st.st_size > off_t(kMaxSecretFileBytes))
    return setError(attnInvalidArgument, "ATTN_SECRET_FILE=\"%s\" has %lld bytes; a secret file "
                    "holds 32 hex digits (at most %zu bytes)", p, (long long)st.st_size,
                    kMaxSecretFileBytes);
  char buf[kMaxSecretFileBytes + 1];
  size_t got = 0;
  while (got < sizeof(buf)) {  // one byte more than allowed: a file that grew is refused
    const ssize_t n = ::read(fd, buf + got, sizeof(buf) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      return setError(attnInvalidArgument, "ATTN_SECRET_FILE=\"%s\": read: %s", p, strerror(errno));
    if (n == 0) break;
    got += size_t(n);
  }
  const bool ok = got <= kMaxSecretFileBytes && parseSecretHex(buf, got, secret);
  auth::wipe(buf, sizeof(buf));  // no copy of the secret's text left on the stack
  if (!ok)
    return setError(attnInvalidArgument, "ATTN_SECRET_FILE=\"%s\" must hold 32 hex digits "
                    "(whitespace around them allowed) and nothing else", p);
  return attnSuccess;
}

attnResult_t readConfiguredSecret(uint8_t secret[16], bool* found) {
  *found = false;
  const auto hex = settingString(Setting::kSecret);
  const auto file = settingString(Setting::kSecretFile);
  uint8_t fromEnv[16] = {}, fromFile[16] = {};
  if (hex && !parseSecretHex(hex->data(), hex->size(), fromEnv))
    return setError(attnInvalidArgument, "ATTN_SECRET must be 32 hex digits (got %zu characters "
                    "that are not)", hex->size());
  if (file) ATTN_CHECK(readSecretFile(*file, fromFile));
  if (hex && file && !auth::equal(fromEnv, fromFile, 16))
    return setError(attnInvalidArgument, "ATTN_SECRET and ATTN_SECRET_FILE=\"%s\" are both set "
                    "and differ: set one", file->c_str());
  if (!hex && !file) return attnSuccess;
  std::memcpy(secret, file ? fromFile : fromEnv, 16);
  auth::wipe(fromEnv, sizeof(fromEnv));
  auth::wipe(fromFile, sizeof(fromFile));
  *found = true;
  return attnSuccess;
}

}  // namespace attn
