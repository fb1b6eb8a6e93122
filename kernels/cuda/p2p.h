// Peer-to-peer pieces for the copy-engine all-reduce of the NCCL communicator (libcai/src/dist):
// stream memory operations (a stream waits for, or writes, a 32-bit flag in device memory without
// a kernel: the stream's front end polls, no SM is held) and the sum of a chunk's contributions.
// CUDA builds only.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace cai::kernels::cuda {

// Later work on `s` waits until (int32_t)(*flag - value) >= 0 (cuStreamWaitValue32, GEQ).
void stream_wait_flag(cudaStream_t s, uint32_t* flag, uint32_t value);
// Writes `value` to *flag once the work before it on `s` has completed, after a memory fence
// (cuStreamWriteValue32): `flag` may be a peer's memory mapped here (CUDA IPC).
void stream_write_flag(cudaStream_t s, uint32_t* flag, uint32_t value);

constexpr int kMaxSumSources = 8;
// dst0[i] (and dst1[i] when not null) = srcs[0][i] + srcs[1][i] + ... + srcs[n-1][i], summed in
// that order in fp32, for i < count; 1 <= n <= kMaxSumSources. Every rank that sums the same
// sources in the same order gets the same bits.
void sum_sources_f32(const float* const* srcs, int n, float* dst0, float* dst1, int64_t count,
                     cudaStream_t s);

}  // namespace cai::kernels::cuda
