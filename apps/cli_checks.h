// Command-line number checks for the apps (CLI11 validators) whose errors name the value and what
// was expected: CLI11's PositiveNumber and NonNegativeNumber print their range up to DBL_MAX
// ("Value 0 not in range 0.000000 to 17976931...").
#pragma once
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <string>

namespace cai::app::cli {

// A number in [lo, hi] (lo excluded when lo_open), else "expected <what>, got <value>".
inline CLI::Validator number_in(double lo, bool lo_open, double hi, std::string what,
                                std::string name) {
  return CLI::Validator(
      [=](std::string& v) {
        char* end = nullptr;
        const double x = std::strtod(v.c_str(), &end);
        const bool ok = end != v.c_str() && *end == 0 && (lo_open ? x > lo : x >= lo) && x <= hi;
        return ok ? std::string() : fmt::format("expected {}, got {}", what, v);
      },
      std::move(name));
}
inline CLI::Validator positive() {
  return number_in(0, true, 1e300, "a number > 0", "POSITIVE");
}
inline CLI::Validator non_negative() {
  return number_in(0, false, 1e300, "a number >= 0", "NONNEGATIVE");
}
inline CLI::Validator seconds_up_to(double most) {
  return number_in(0, false, most, fmt::format("seconds from 0 to {}", most), "SECONDS");
}

}  // namespace cai::app::cli
