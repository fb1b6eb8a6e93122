#include "kernels/cpu/parallel.h"

#include <cblas.h>
#include <sched.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace cai::kernels::cpu {

namespace {

thread_local bool in_pool_block = false;
thread_local bool waits_for_pool = false;  // PoolWaits

int default_threads() {
  for (const char* v : {"CAI_NUM_THREADS", "OMP_NUM_THREADS"})
    if (const char* s = std::getenv(v)) {
      const int n = std::atoi(s);
      if (n >= 1) return n;
    }
  return std::max(1u, std::thread::hardware_concurrency());
}

class Pool {
 public:
  explicit Pool(int threads) : threads_(threads) {
    openblas_set_num_threads(1);  // GEMMs are split across this pool instead
    for (int i = 1; i < threads_; ++i) workers_.emplace_back([this, i] { loop(i); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> l(m_);
      stop_ = true;
    }
    start_cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int threads() const { return threads_; }
  std::mutex& busy() { return busy_; }

  void run(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    const int parts = static_cast<int>(std::min<int64_t>(threads_, n));
    {
      std::lock_guard<std::mutex> l(m_);
      fn_ = &fn;
      n_ = n;
      parts_ = parts;
      pending_ = parts - 1;
      error_ = nullptr;
      ++generation_;
    }
    start_cv_.notify_all();
    block(0);
    std::unique_lock<std::mutex> l(m_);
    done_cv_.wait(l, [&] { return pending_ == 0; });
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void block(int part) {
    const int64_t b = n_ * part / parts_, e = n_ * (part + 1) / parts_;
    if (e <= b) return;
    in_pool_block = true;
    try {
      (*fn_)(b, e);
    } catch (...) {
      std::lock_guard<std::mutex> l(m_);
      if (!error_) error_ = std::current_exception();
    }
    in_pool_block = false;
  }

  void loop(int index) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> l(m_);
        start_cv_.wait(l, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (index >= parts_) continue;
      }
      block(index);
      std::lock_guard<std::mutex> l(m_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }

  int threads_;
  std::vector<std::thread> workers_;
  std::mutex m_, busy_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int parts_ = 1, pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

// The pool is a process-wide compute resource (like OpenBLAS's), not distributed state.
std::unique_ptr<Pool>& pool() {
  static std::unique_ptr<Pool> p = std::make_unique<Pool>(default_threads());
  return p;
}

}  // namespace

int usable_cpus() {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  return sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? std::max(1, CPU_COUNT(&cpus)) : 1;
}

int job_cores() {
  const int allowed = usable_cpus();
  return allowed > 1 ? allowed
                     : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int num_threads() {
  return pool()->threads();
}

void set_num_threads(int n) {
  pool() = std::make_unique<Pool>(std::max(1, n));
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  Pool& p = *pool();
  if (p.threads() <= 1 || n < 2 * std::max<int64_t>(grain, 1) || in_pool_block) {
    fn(0, n);
    return;
  }
  std::unique_lock<std::mutex> busy(p.busy(), std::try_to_lock);
  if (!busy.owns_lock() && waits_for_pool) busy.lock();
  if (!busy.owns_lock()) {
    fn(0, n);
    return;
  }
  p.run(n, fn);
}

PoolWaits::PoolWaits() : before_(waits_for_pool) {
  waits_for_pool = true;
}
PoolWaits::~PoolWaits() {
  waits_for_pool = before_;
}

}  // namespace cai::kernels::cpu
