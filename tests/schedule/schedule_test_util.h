// Helpers shared by the schedule tests (test_schedule.cpp, test_zero_bubble.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cai/core/error.h"
#include "cai/schedule/schedule.h"

namespace cai::schedule::testutil {

// p stages, m micro-batches, v chunks per stage, 4096 activation bytes a micro-batch.
inline ScheduleOptions opts(int p, int m, int v = 1, bool split = false) {
  ScheduleOptions o;
  o.stages = p;
  o.micro_batches = m;
  o.chunks = v;
  o.activation_bytes = 4096;
  o.split_backward = split;
  return o;
}

// The first n instructions of a program as strings ("F(mb=0,c=0)", ...).
inline std::vector<std::string> strs(const Program& prog, size_t n = SIZE_MAX) {
  std::vector<std::string> out;
  for (size_t i = 0; i < prog.size() && i < n; ++i) out.push_back(prog[i].str());
  return out;
}

// Expects `f` to throw cai::Error whose message contains every piece of `needles`.
inline void expect_error(const std::function<void()>& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one mentioning " << needles[0];
  } catch (const cai::Error& e) {
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "message: " << e.what() << "\nmissing: " << n;
  }
}

inline void expect_contains(const std::string& msg, const std::vector<std::string>& needles) {
  for (const auto& n : needles)
    EXPECT_NE(msg.find(n), std::string::npos) << "message: " << msg << "\nmissing: " << n;
}

}  // namespace cai::schedule::testutil
