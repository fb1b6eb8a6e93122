#include "cai/core/version.h"

namespace cai {
const char* version() {
  return CAI_VERSION;
}
const char* git_hash() {
  return CAI_GIT_HASH;
}
}  // namespace cai
