// libFuzzer entry point for one target (CAI_FUZZ=ON, clang): built once per target with
// -DCAI_FUZZ_TARGET="<name>". Run e.g. build-fuzz/tests/fuzz_safetensors corpus/ -max_len=65536.
#include <unistd.h>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "cai/core/error.h"
#include "fuzz.h"

namespace {
const cai::fuzz::Target& target() {
  static const cai::fuzz::Target* t = [] {
    static std::vector<cai::fuzz::Target> ts = cai::fuzz::all_targets(
        (std::filesystem::temp_directory_path() / ("cai-libfuzzer-" + std::to_string(::getpid())))
            .string());
    for (const auto& x : ts)
      if (x.name == CAI_FUZZ_TARGET) return &x;
    std::abort();
  }();
  return *t;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    target().run(std::string(reinterpret_cast<const char*>(data), size));
  } catch (const cai::Error&) {
    // rejected: fine. Anything else escapes and libFuzzer reports it.
  }
  return 0;
}
