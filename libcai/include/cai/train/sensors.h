// A GPU's sensors (NVML: energy counter, SM clock, power) read on a thread of their own. One NVML
// read takes milliseconds (3.3 ms median, 25 ms at worst on the H200 hosts), and where a layout
// keeps the host in step with the device (pipeline stages and tensor groups wait for their peers
// at each step's end) the trainer thread's read left the GPU idle for as long: 3-7 ms a step on
// 4 H200 for pipeline 4 and tensor 2 × pipeline 2. The trainer asks for a reading and carries on;
// each step's record takes the newest reading done, tagged with the step it was asked at.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace cai::train {

// A GPU's energy counter (millijoules since the driver loaded), SM clock (MHz) and power draw
// (milliwatts), as kernels::cuda::read_sensors gives them.
struct SensorValues {
  double energy_mj = 0;
  unsigned sm_mhz = 0, power_mw = 0;
};

struct SensorReading {
  int64_t step = -1;   // the global step the reading was asked at (-1: none yet)
  double seconds = 0;  // when it was read, in seconds since the reader began
  SensorValues sensors;
};

class SensorThread {
 public:
  // `read` is called on the reader's thread (kernels::cuda::read_sensors of a device in the
  // trainer; a fake in tests); it returns false when the sensors did not answer.
  explicit SensorThread(std::function<bool(SensorValues*)> read);
  ~SensorThread();
  SensorThread(const SensorThread&) = delete;
  SensorThread& operator=(const SensorThread&) = delete;

  // Asks for a reading tagged `step`; returns at once. While the previous reading is still being
  // taken the request is dropped (the newest reading then stays the older one): false.
  bool request(int64_t step);
  // The newest reading done (step -1 when none has finished); never waits for the reader.
  SensorReading latest() const;
  // Waits until no reading is in progress (tests; the destructor waits for a read under way).
  void drain();

 private:
  void run();
  std::function<bool(SensorValues*)> read_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, busy_ = false, pending_ = false;
  int64_t asked_ = -1;
  SensorReading latest_;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace cai::train
