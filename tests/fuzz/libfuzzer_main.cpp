// libFuzzer entry point for one target (CAI_FUZZ=ON, clang): built once per target with
// -DCAI_FUZZ_TARGET="<name>". Run e.g. build-fuzz/tests/fuzz_safetensors corpus/ -max_len=65536.
// With CAI_FUZZ_SEEDS_DIR=DIR in the environment the target's seeds (the deterministic harness's,
// fuzz.h) are written there as seed-<n> before fuzzing starts; scripts/fuzz passes DIR to libFuzzer
// as a second corpus directory, so coverage-guided runs start from valid inputs.
#include <unistd.h>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
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

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  const char* dir = std::getenv("CAI_FUZZ_SEEDS_DIR");
  if (dir == nullptr || *dir == '\0') return 0;
  std::filesystem::create_directories(dir);
  const auto& seeds = target().seeds;
  for (size_t i = 0; i < seeds.size(); ++i) {
    std::ofstream f(std::filesystem::path(dir) / ("seed-" + std::to_string(i)), std::ios::binary);
    f.write(seeds[i].data(), static_cast<std::streamsize>(seeds[i].size()));
    if (!f) std::abort();
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    target().run(std::string(reinterpret_cast<const char*>(data), size));
  } catch (const cai::Error&) {
    // rejected: fine. Anything else escapes and libFuzzer reports it.
  }
  return 0;
}
