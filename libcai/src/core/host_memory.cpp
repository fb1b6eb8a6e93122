#include "cai/core/host_memory.h"

#include <cstdlib>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace cai {

bool keep_freed_host_memory() {
#if defined(__GLIBC__)
  if (std::getenv("GLIBC_TUNABLES")) return false;
  return mallopt(M_MMAP_THRESHOLD, 256 << 20) == 1 && mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
#else
  return false;
#endif
}

}  // namespace cai
