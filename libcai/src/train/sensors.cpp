#include "cai/train/sensors.h"

#include <chrono>
#include <utility>

namespace cai::train {

SensorThread::SensorThread(std::function<bool(SensorValues*)> read)
    : read_(std::move(read)), thread_([this] { run(); }) {}

SensorThread::~SensorThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool SensorThread::request(int64_t step) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (busy_) return false;
    busy_ = pending_ = true;
    asked_ = step;
  }
  cv_.notify_all();
  return true;
}

SensorReading SensorThread::latest() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_;
}

void SensorThread::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !busy_; });
}

void SensorThread::run() {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || pending_; });
    if (stop_) return;
    pending_ = false;
    const int64_t step = asked_;
    lock.unlock();
    SensorValues s;
    const bool ok = read_(&s);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    lock.lock();
    if (ok) latest_ = SensorReading{step, seconds, s};
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace cai::train
