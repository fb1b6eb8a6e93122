// The CPU kernels' thread pool. Idle workers sleep (no spinning), so the pool coexists with data
// loader threads and other processes on small machines; OpenBLAS runs single-threaded inside it.
// Threads: CAI_NUM_THREADS, else OMP_NUM_THREADS, else the hardware concurrency.
#pragma once
#include <cstdint>
#include <functional>

namespace cai::kernels::cpu {

int num_threads();
// The CPUs this process may run on (its affinity mask; 1 when it cannot be read).
int usable_cpus();
// The cores a job's processes spread over: usable_cpus(), or the machine's where the process is
// bound to one core (taskset, mpirun --bind-to core: its peers are bound to the others).
int job_cores();
void set_num_threads(int n);  // recreates the pool; n >= 1

// Runs fn(begin, end) over contiguous blocks covering [0, n), in parallel when n ≥ 2·grain
// (grain: the fewest items worth a thread). Calls from inside a block, or while another thread
// is using the pool, run inline (unless a PoolWaits lives on this thread). Exceptions from blocks
// are rethrown to the caller.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

// While one lives, this thread's parallel_for calls wait for a pool in use by another thread
// instead of running inline (a long background job, such as ZeRO-Offload's host step beside the
// next forward, whose blocks would otherwise run on one core whenever another thread's short
// call holds the pool).
class PoolWaits {
 public:
  PoolWaits();
  ~PoolWaits();
  PoolWaits(const PoolWaits&) = delete;
  PoolWaits& operator=(const PoolWaits&) = delete;

 private:
  bool before_;
};

}  // namespace cai::kernels::cpu
