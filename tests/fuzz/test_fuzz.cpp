// The parsers under the deterministic mutation fuzzer: a few thousand inputs per parser in CI
// (seconds), as many as CAI_FUZZ_COUNT asks for in scripts/fuzz. Environment:
//   CAI_FUZZ_COUNT  inputs per parser (default 2000)
//   CAI_FUZZ_SEED   RNG seed (default 16)
//   CAI_FUZZ_DIR    scratch directory (default a fresh one in /dev/shm or the temp dir, removed
//                   at exit)
//   CAI_FUZZ_CRASH_DIR  where failing inputs go (default ./fuzz-crashes)
#include <gtest/gtest.h>

#include <unistd.h>
#include <cstdlib>
#include <filesystem>

#include "fuzz.h"

namespace {

namespace fs = std::filesystem;

uint64_t env_u64(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

// The scratch directory for the file-based readers; a default one is removed at exit.
struct Scratch {
  std::string path;
  bool owned = false;
  Scratch() {
    if (const char* d = std::getenv("CAI_FUZZ_DIR"); d && *d) {
      path = d;
      return;
    }
    std::error_code ec;
    const fs::path base = fs::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0
                              ? fs::path("/dev/shm")
                              : fs::temp_directory_path();
    path = (base / ("cai-fuzz-" + std::to_string(::getpid()))).string();
    owned = true;
  }
  ~Scratch() {
    std::error_code ec;
    if (owned) fs::remove_all(path, ec);
  }
};

const std::string& scratch_dir() {
  static Scratch s;
  return s.path;
}

class Fuzz : public ::testing::TestWithParam<std::string> {};

const std::vector<cai::fuzz::Target>& targets() {
  static const std::vector<cai::fuzz::Target> ts = cai::fuzz::all_targets(scratch_dir());
  return ts;
}

std::vector<std::string> target_names() {
  std::vector<std::string> out;
  for (const auto& t : targets()) out.push_back(t.name);
  return out;
}

TEST_P(Fuzz, ParsesOrThrowsCaiError) {
  const cai::fuzz::Target* t = nullptr;
  for (const auto& x : targets())
    if (x.name == GetParam()) t = &x;
  ASSERT_NE(t, nullptr);
  const uint64_t count = env_u64("CAI_FUZZ_COUNT", 2000);
  const uint64_t seed = env_u64("CAI_FUZZ_SEED", 16);
  const char* cd = std::getenv("CAI_FUZZ_CRASH_DIR");
  const std::string crash_dir = cd && *cd ? cd : "fuzz-crashes";
  fs::create_directories(crash_dir);
  const cai::fuzz::Result r = cai::fuzz::run(*t, count, seed, crash_dir);
  std::printf(
      "[fuzz] %-22s %10llu inputs %9.2f s %10.0f inputs/s  accepted %llu  slowest %.3f s"
      "  failures %zu\n",
      t->name.c_str(), static_cast<unsigned long long>(r.inputs), r.seconds,
      r.inputs / std::max(r.seconds, 1e-9), static_cast<unsigned long long>(r.accepted), r.slowest,
      r.failures.size());
  for (const auto& f : r.failures)
    ADD_FAILURE() << t->name << " input " << f.index << ": " << f.what << " (saved to " << f.saved
                  << ")";
  EXPECT_GT(r.accepted, 0u) << "no seed of " << t->name << " parses";
}

INSTANTIATE_TEST_SUITE_P(Parsers, Fuzz, ::testing::ValuesIn(target_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
