#include "fuzz.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <fstream>

#include "cai/core/error.h"

namespace cai::fuzz {

namespace {

uint64_t splitmix(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

// Values that sit on the edges parsers check: sizes, signs, overflow points.
constexpr uint64_t kInteresting[] = {0,
                                     1,
                                     2,
                                     7,
                                     8,
                                     0x7f,
                                     0x80,
                                     0xff,
                                     0x100,
                                     0x7fff,
                                     0x8000,
                                     0xffff,
                                     0x10000,
                                     0x7fffffff,
                                     0x80000000,
                                     0xffffffff,
                                     0x100000000ull,
                                     0x7fffffffffffffffull,
                                     0x8000000000000000ull,
                                     0xffffffffffffffffull,
                                     0xfffffffffffffff8ull,
                                     100ull << 20,
                                     (100ull << 20) + 1,
                                     1ull << 40,
                                     1ull << 62,
                                     1ull << 63};

// Literals for text formats: numbers at the edges, and structure tokens.
const char* const kNumbers[] = {"0",
                                "-0",
                                "1",
                                "-1",
                                "2147483647",
                                "2147483648",
                                "-2147483649",
                                "4294967295",
                                "4294967296",
                                "9223372036854775807",
                                "-9223372036854775808",
                                "18446744073709551615",
                                "18446744073709551616",
                                "1e308",
                                "-1e308",
                                "1e309",
                                "4.9e-324",
                                "1e-400",
                                "0.5",
                                "inf",
                                "-inf",
                                "nan",
                                "0x7fffffff",
                                "1_000",
                                "4611686018427387904",
                                "1.0e999"};
const char* const kTokens[] = {"[",          "]",
                               "{",          "}",
                               "[[",         "]]",
                               "\"",         "'",
                               ",",          ":",
                               "=",          "\n",
                               "#",          ".",
                               "null",       "true",
                               "false",      "\\u0000",
                               "\\uD800",    "\"\"",
                               "[]",         "{}",
                               "\t",         "\r\n",
                               "\\",         "\"\"\"",
                               "x.y.z",      "\xff",
                               "\xc3\xa9",   "-",
                               "ph",         "\"X\"",
                               "\"M\"",      "\"C\"",
                               "slots=",     "data_offsets",
                               "shape",      "__metadata__",
                               "tid",        "traceEvents",
                               "samples",    "ops",
                               "weight_map", "dtype"};

size_t pick_span(size_t size, Rng& rng) {
  // Mostly short spans, sometimes long ones.
  const size_t cap = rng.one_in(8) ? size : std::min<size_t>(size, 16);
  return cap == 0 ? 0 : 1 + rng.below(cap);
}

void put_int(std::string& s, size_t at, uint64_t v, int width, bool big_endian) {
  for (int i = 0; i < width && at + i < s.size(); ++i) {
    const int shift = big_endian ? 8 * (width - 1 - i) : 8 * i;
    s[at + i] = static_cast<char>((v >> shift) & 0xff);
  }
}

// Byte ranges of digit runs (with a leading '-' and a fraction/exponent): numeric tokens.
std::vector<std::pair<size_t, size_t>> number_tokens(const std::string& s) {
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t i = 0; i < s.size();) {
    if (std::isdigit(static_cast<unsigned char>(s[i]))) {
      size_t b = i;
      if (b > 0 && s[b - 1] == '-') --b;
      while (i < s.size() &&
             (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.' || s[i] == 'e' ||
              s[i] == 'E' || s[i] == '_' ||
              ((s[i] == '+' || s[i] == '-') && i > 0 && (s[i - 1] == 'e' || s[i - 1] == 'E'))))
        ++i;
      out.emplace_back(b, i);
    } else {
      ++i;
    }
  }
  return out;
}

std::vector<std::pair<size_t, size_t>> lines(const std::string& s) {
  std::vector<std::pair<size_t, size_t>> out;
  size_t b = 0;
  for (size_t i = 0; i <= s.size(); ++i)
    if (i == s.size() || s[i] == '\n') {
      out.emplace_back(b, std::min(i + 1, s.size()));
      b = i + 1;
    }
  return out;
}

void mutate_once(std::string& s, const std::string& other, bool text, Rng& rng) {
  const int kinds = text ? 14 : 10;
  switch (rng.below(kinds)) {
    case 0:  // flip a bit
      if (!s.empty()) s[rng.below(s.size())] ^= static_cast<char>(1u << rng.below(8));
      break;
    case 1:  // set a byte
      if (!s.empty()) s[rng.below(s.size())] = static_cast<char>(rng.below(256));
      break;
    case 2: {  // insert random bytes
      const size_t n = 1 + rng.below(rng.one_in(4) ? 64 : 4);
      std::string ins(n, '\0');
      for (char& c : ins) c = static_cast<char>(rng.below(256));
      s.insert(rng.below(s.size() + 1), ins);
      break;
    }
    case 3:  // delete a range
      if (!s.empty()) {
        const size_t at = rng.below(s.size());
        s.erase(at, pick_span(s.size() - at, rng));
      }
      break;
    case 4:  // truncate
      if (!s.empty()) s.resize(rng.below(s.size()));
      break;
    case 5:  // duplicate a range
      if (!s.empty()) {
        const size_t at = rng.below(s.size());
        const std::string part = s.substr(at, pick_span(s.size() - at, rng));
        s.insert(rng.below(s.size() + 1), part);
      }
      break;
    case 6:  // splice: a prefix of this one, a suffix of the other
      if (!other.empty()) {
        const size_t a = rng.below(s.size() + 1), b = rng.below(other.size());
        s = s.substr(0, a) + other.substr(b);
      }
      break;
    case 7:
    case 8: {  // an interesting integer (length fields, dimensions), 1-8 bytes, either endianness
      if (s.empty()) break;
      const int widths[] = {1, 2, 4, 8};
      const int w = widths[rng.below(4)];
      uint64_t v = kInteresting[rng.below(std::size(kInteresting))];
      if (rng.one_in(4)) v += rng.below(5) - 2;
      // Favour the first 32 bytes, where the headers are.
      const size_t at =
          rng.one_in(2) ? rng.below(std::min<size_t>(s.size(), 32)) : rng.below(s.size());
      put_int(s, at, v, w, rng.one_in(2));
      break;
    }
    case 9: {  // swap two bytes
      if (s.size() < 2) break;
      std::swap(s[rng.below(s.size())], s[rng.below(s.size())]);
      break;
    }
    case 10: {  // replace a number token by an edge literal
      const auto toks = number_tokens(s);
      const std::string lit = kNumbers[rng.below(std::size(kNumbers))];
      if (toks.empty()) {
        s.insert(rng.below(s.size() + 1), lit);
      } else {
        const auto [b, e] = toks[rng.below(toks.size())];
        s.replace(b, e - b, lit);
      }
      break;
    }
    case 11:  // insert a structure token
      s.insert(rng.below(s.size() + 1), kTokens[rng.below(std::size(kTokens))]);
      break;
    case 12: {  // delete, duplicate or swap lines
      const auto ls = lines(s);
      if (ls.empty()) break;
      const auto [b, e] = ls[rng.below(ls.size())];
      const int op = static_cast<int>(rng.below(3));
      if (op == 0) {
        s.erase(b, e - b);
      } else if (op == 1) {
        s.insert(b, s.substr(b, e - b));
      } else {
        const auto [b2, e2] = ls[rng.below(ls.size())];
        const std::string l1 = s.substr(b, e - b), l2 = s.substr(b2, e2 - b2);
        if (b < b2) {
          s.replace(b2, e2 - b2, l1);
          s.replace(b, e - b, l2);
        } else if (b2 < b) {
          s.replace(b, e - b, l2);
          s.replace(b2, e2 - b2, l1);
        }
      }
      break;
    }
    case 13: {  // deep nesting: many opening brackets at one place
      const size_t n = 1 + rng.below(rng.one_in(8) ? 5000 : 40);
      s.insert(rng.below(s.size() + 1), std::string(n, rng.one_in(2) ? '[' : '{'));
      break;
    }
  }
}

// What the fatal-signal handler writes out: the input in flight.
const std::string* g_current = nullptr;
std::string g_current_path;

extern "C" void dump_current() {
  if (!g_current || g_current_path.empty()) return;
  const int fd = ::open(g_current_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  const ssize_t n = ::write(fd, g_current->data(), g_current->size());
  (void)n;
  ::close(fd);
}

extern "C" void on_fatal_signal(int sig) {
  dump_current();
  const char msg[] = "\n[fuzz] fatal signal: the input in flight is in the crash directory\n";
  const ssize_t n = ::write(2, msg, sizeof msg - 1);
  (void)n;
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

extern "C" void __sanitizer_set_death_callback(void (*)(void)) __attribute__((weak));

Rng::Rng(uint64_t seed) {
  for (auto& v : s_) v = splitmix(seed);
}

uint64_t Rng::next() {
  const uint64_t r = rotl(s_[1] * 5, 7) * 9, t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return r;
}

uint64_t Rng::below(uint64_t n) {
  return n <= 1 ? 0 : next() % n;
}

std::string mutate(const std::string& in, const std::string& other, bool text, Rng& rng,
                   size_t max_size) {
  std::string s = in;
  const int n = 1 + static_cast<int>(rng.below(4));
  for (int i = 0; i < n; ++i) mutate_once(s, other, text, rng);
  if (s.size() > max_size) s.resize(max_size);
  return s;
}

Result run(const Target& t, uint64_t count, uint64_t seed, const std::string& crash_dir) {
  Result r;
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the name: one stream per target
  for (char c : t.name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  Rng rng(seed ^ h);
  std::vector<std::string> pool = t.seeds;  // seeds, then mutants that were accepted
  const size_t n_seeds = t.seeds.size(), kPool = 256;
  const size_t limit = size_t{256} << 20;

  if (!crash_dir.empty()) {
    g_current_path = crash_dir + "/" + t.name + "-in-flight.bin";
    ::signal(SIGSEGV, on_fatal_signal);
    ::signal(SIGBUS, on_fatal_signal);
    ::signal(SIGFPE, on_fatal_signal);
    ::signal(SIGABRT, on_fatal_signal);
    if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(dump_current);
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::string input;
  for (uint64_t i = 0; i < count && r.failures.size() < 10; ++i) {
    if (i < n_seeds) {
      input = t.seeds[i];
    } else {
      const std::string& base = pool[rng.below(pool.size())];
      const std::string& other = pool[rng.below(pool.size())];
      input = mutate(base, other, t.text, rng);
    }
    g_current = &input;
    std::string error;
    bool accepted = false;
    const auto a = std::chrono::steady_clock::now();
    alloc_guard_arm(t.max_alloc ? t.max_alloc : limit);
    try {
      t.run(input);
      accepted = true;
    } catch (const cai::Error&) {
      // rejected with the library's error: fine
    } catch (const std::exception& e) {
      error = std::string("exception other than cai::Error: ") + e.what();
    } catch (...) {
      error = "unknown exception";
    }
    const size_t huge = alloc_guard_tripped();
    alloc_guard_disarm();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
    r.slowest = std::max(r.slowest, dt);
    if (huge) error = "allocation of " + std::to_string(huge) + " bytes (limit 256 MiB)";
    if (error.empty() && dt > 1.0) error = "slow input: " + std::to_string(dt) + " s";
    ++r.inputs;
    if (accepted) {
      ++r.accepted;
      if (i >= n_seeds) {
        if (pool.size() < n_seeds + kPool)
          pool.push_back(input);
        else
          pool[n_seeds + rng.below(kPool)] = input;
      }
    }
    if (!error.empty()) {
      Failure f{i, error, ""};
      if (!crash_dir.empty()) {
        f.saved = crash_dir + "/" + t.name + "-" + std::to_string(i) + ".bin";
        std::ofstream(f.saved, std::ios::binary) << input;
      }
      r.failures.push_back(f);
    }
  }
  g_current = nullptr;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace cai::fuzz
