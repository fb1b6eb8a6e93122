// A deterministic mutation fuzzer for the parsers (issue 16). No coverage feedback: valid seeds
// built by the targets, stacked mutations (bit flips, byte insert/delete, truncation, splicing,
// interesting integers in length fields, JSON/TOML token edits) drawn from a fixed-seed RNG, and a
// small pool of mutated inputs that parsed (so mutations stack past the first checks).
//
// Contract checked for every input: the target returns (the parser accepted it) or throws
// cai::Error. Any other exception, a crash, an input slower than a second, or an allocation above
// the limit (see fuzz_alloc.cpp) is a failure. The same targets serve libFuzzer
// (libfuzzer_main.cpp, CAI_FUZZ=ON with clang).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace cai::fuzz {

struct Target {
  std::string name;
  std::vector<std::string> seeds;
  // Parses one input: returns when accepted, throws cai::Error when rejected.
  std::function<void(const std::string&)> run;
  bool text = true;      // token edits (numbers, brackets, lines) besides the byte-level mutations
  size_t max_alloc = 0;  // the largest allocation allowed for one input (0: the run's limit)
};

// xoshiro256** seeded through splitmix64: the same stream on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next();
  uint64_t below(uint64_t n);  // uniform in [0, n), n > 0
  bool one_in(uint64_t n) { return below(n) == 0; }

 private:
  uint64_t s_[4];
};

// One to four stacked mutations of `in`; `other` is spliced from. Output capped at max_size.
std::string mutate(const std::string& in, const std::string& other, bool text, Rng& rng,
                   size_t max_size = 1 << 16);

struct Failure {
  uint64_t index = 0;  // input number
  std::string what;    // exception text, "huge allocation ...", "slow ..."
  std::string saved;   // where the input was written
};

struct Result {
  uint64_t inputs = 0, accepted = 0;
  double seconds = 0, slowest = 0;
  std::vector<Failure> failures;
};

// Runs `count` inputs (the seeds first). Failing inputs are written to `crash_dir` (when not
// empty) as <target>-<index>.bin; the run stops after 10 failures.
Result run(const Target& t, uint64_t count, uint64_t seed, const std::string& crash_dir);

// Allocation guard (fuzz_alloc.cpp): while armed, an allocation above the limit fails (returns
// null / throws std::bad_alloc) and is remembered. Without the guard compiled in (sanitizer
// builds: ASan's max_allocation_size_mb does it) these do nothing.
void alloc_guard_arm(size_t limit_bytes);
void alloc_guard_disarm();
size_t alloc_guard_tripped();  // the largest refused size since arming, 0 if none

// Every target of this build (the trace reader only where the explorer's model is built).
std::vector<Target> all_targets(const std::string& tmp_dir);

}  // namespace cai::fuzz
