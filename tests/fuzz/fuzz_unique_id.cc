// The unique id arrives from outside (a file, an environment variable, an
// MPI broadcast): decoding must refuse anything encode did not write, and
// never read or trust more than the id holds.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "src/core/bootstrap.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  attnUniqueId id;
  std::memset(&id, 0, sizeof(id));
  std::memcpy(id.internal, data, size < sizeof(id.internal) ? size : sizeof(id.internal));
  attn::UniqueIdData d;
  if (attn::decodeUniqueId(id, &d) != attnSuccess) return 0;
  // Whatever decodes must be exactly what encoding it again writes.
  attnUniqueId again;
  if (attn::encodeUniqueId(d, &again) != attnSuccess) std::abort();
  if (std::memcmp(&again, &id, sizeof(id)) != 0) std::abort();
  return 0;
}
