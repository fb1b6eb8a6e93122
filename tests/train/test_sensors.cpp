// SensorThread (cai/train/sensors.h): the trainer asks for a GPU sensor reading and carries on; the
// reading is done on the reader's thread and tagged with the step it was asked at.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <mutex>

#include "cai/train/sensors.h"

namespace {

using cai::train::SensorReading;
using cai::train::SensorThread;
using cai::train::SensorValues;

// A reader that blocks until the test lets it go, then answers `energy` (or fails).
struct GatedReader {
  std::mutex mu;
  std::promise<void> go;
  std::shared_future<void> gate = go.get_future().share();
  std::promise<void> entered;
  double energy = 0;
  bool ok = true;
  int calls = 0;
  bool read(SensorValues* out) {
    std::shared_future<void> g;
    {
      std::lock_guard<std::mutex> lock(mu);
      ++calls;
      g = gate;
      if (calls == 1) entered.set_value();
    }
    g.wait();
    std::lock_guard<std::mutex> lock(mu);
    out->energy_mj = energy;
    out->sm_mhz = 1700;
    out->power_mw = 650000;
    return ok;
  }
};

TEST(SensorThread, RequestReturnsWhileTheReadIsInProgress) {
  GatedReader reader;
  reader.energy = 1234;
  SensorThread t([&](SensorValues* s) { return reader.read(s); });
  EXPECT_EQ(t.latest().step, -1);  // nothing read yet
  // request() must come back while the read it started is blocked on the gate.
  auto asked = std::async(std::launch::async, [&] { return t.request(7); });
  if (asked.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    reader.go.set_value();  // let the read end, so that the threads can be joined
    FAIL() << "request() waited for the read it asked for";
  }
  EXPECT_TRUE(asked.get());
  reader.entered.get_future().wait();
  // The reader is busy: a second request is dropped, and the newest reading is still none.
  EXPECT_FALSE(t.request(8));
  EXPECT_EQ(t.latest().step, -1);
  reader.go.set_value();
  t.drain();
  const SensorReading r = t.latest();
  EXPECT_EQ(r.step, 7);
  EXPECT_DOUBLE_EQ(r.sensors.energy_mj, 1234);
  EXPECT_EQ(r.sensors.sm_mhz, 1700u);
  EXPECT_EQ(r.sensors.power_mw, 650000u);
  EXPECT_GE(r.seconds, 0);
  EXPECT_EQ(reader.calls, 1);  // the dropped request read nothing
}

TEST(SensorThread, NewerReadingsReplaceOlderOnesAndFailuresKeepThem) {
  GatedReader reader;
  reader.go.set_value();  // never blocks
  SensorThread t([&](SensorValues* s) { return reader.read(s); });
  reader.energy = 10;
  ASSERT_TRUE(t.request(0));  // step 0 is a step like any other
  t.drain();
  EXPECT_EQ(t.latest().step, 0);
  const double first = t.latest().seconds;
  {
    std::lock_guard<std::mutex> lock(reader.mu);
    reader.energy = 25;
  }
  ASSERT_TRUE(t.request(3));
  t.drain();
  EXPECT_EQ(t.latest().step, 3);
  EXPECT_DOUBLE_EQ(t.latest().sensors.energy_mj, 25);
  EXPECT_GE(t.latest().seconds, first);
  {
    std::lock_guard<std::mutex> lock(reader.mu);
    reader.ok = false;  // NVML did not answer: the reading of step 3 stays the newest
    reader.energy = 99;
  }
  ASSERT_TRUE(t.request(5));
  t.drain();
  EXPECT_EQ(t.latest().step, 3);
  EXPECT_DOUBLE_EQ(t.latest().sensors.energy_mj, 25);
  EXPECT_EQ(reader.calls, 3);
}

}  // namespace
