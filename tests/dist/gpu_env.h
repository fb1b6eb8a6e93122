// For the mpirun tests that run on GPUs: whether this host can run them, and the GPU of this rank.
// Every rank of a node sees the same environment, so all ranks take the same decision.
#pragma once
#include <string>

#include "cai/dist/launch.h"
#include "cai/dist/nccl.h"
#include "kernels/device.h"

namespace cai::test {

// ctest's SKIP_RETURN_CODE for these tests.
constexpr int kSkip = 77;

// Empty when the test can run; otherwise why it is skipped.
inline std::string gpu_skip_reason() {
  if (!dist::nccl_compiled()) return "this build has no CUDA (configure with -DCAI_WITH_CUDA=ON)";
  const int n = kernels::cuda::device_count();
  if (n == 0) {
    const std::string why = kernels::cuda::runtime_info().device_error;
    return "no GPU is visible" + (why.empty() ? std::string() : " (" + why + ")");
  }
  const dist::LaunchInfo li = dist::launch_from_env();
  if (li.local_world_size > n)
    return std::to_string(li.local_world_size) + " ranks on this node but only " +
           std::to_string(n) + " GPU(s): NCCL needs one GPU per rank";
  return {};
}

// Selects and returns this rank's GPU (local rank mod GPUs).
inline int select_gpu() {
  const dist::LaunchInfo li = dist::launch_from_env();
  return dist::select_cuda_device(li.local_rank, li.local_world_size);
}

}  // namespace cai::test
