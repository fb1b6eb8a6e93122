// A last resort for a thread that is stuck where nothing can throw: a thread of its own, with no
// CUDA or NCCL in it, that calls a handler once when the watched loop has not beaten for longer
// than its limit.
//
// Why: the NCCL backend's watchdog (nccl_internal.h) polls completion events and aborts a
// communicator whose operation is late; but when the device is wedged (a kernel waiting for a
// peer that waits for this process), the driver can hold the watchdog inside cudaEventQuery or
// ncclCommAbort as well, and the job then hangs with no message (seen on 4 H100: a pipeline
// whose receives were posted too early ran 100 s past a 25 s collective timeout without a word).
// The watchdog beats after every round; its StallMonitor's handler names the process and what it
// was doing and ends the process (a stuck thread cannot be unwound), so that the launcher ends
// the job, as PyTorch's NCCL watchdog does. Tested on the CPU (tests/dist/test_stall_monitor.cpp).
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include <fmt/format.h>

namespace cai::dist {

class StallMonitor {
 public:
  // handler(message) runs once, on the monitor's thread, when beat() has not been called for
  // more than limit_s seconds (checked every poll_s).
  StallMonitor(double limit_s, std::string what, std::function<void(const std::string&)> handler,
               double poll_s = 1.0)
      : limit_s_(limit_s),
        poll_s_(poll_s),
        what_(std::move(what)),
        handler_(std::move(handler)),
        last_(now_ns()),
        thread_([this] { loop(); }) {}
  ~StallMonitor() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  StallMonitor(const StallMonitor&) = delete;
  StallMonitor& operator=(const StallMonitor&) = delete;

  void beat() { last_.store(now_ns(), std::memory_order_relaxed); }
  bool fired() const { return fired_.load(); }
  double limit_s() const { return limit_s_; }

 private:
  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void loop() {
    std::unique_lock<std::mutex> l(mu_);
    while (!stop_) {
      cv_.wait_for(l, std::chrono::duration<double>(poll_s_));
      if (stop_ || fired_) continue;
      const double idle = (now_ns() - last_.load(std::memory_order_relaxed)) * 1e-9;
      if (idle <= limit_s_) continue;
      fired_ = true;
      l.unlock();
      handler_(
          fmt::format("{} made no progress for {:.0f} s (limit {:.0f} s)", what_, idle, limit_s_));
      l.lock();
    }
  }

  const double limit_s_, poll_s_;
  const std::string what_;
  const std::function<void(const std::string&)> handler_;
  std::atomic<int64_t> last_;
  std::atomic<bool> fired_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it reads
};

}  // namespace cai::dist
