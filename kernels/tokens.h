// The rank-major staging of sequence parallelism's token collectives: a [B, N, F] tensor (`full`,
// es-byte elements of any type) and the buffer an all-gather fills / a reduce-scatter reads, where
// rank r's tokens [N·r/T, N·(r+1)/T) of every sample lie together as a [B, n_r, F] block.
// Block r starts at element B·(N·r/T)·F (packed: what an uneven-count collective moves) or at
// r·B·⌈N/T⌉·F (padded: every block as long as the largest, what an even-count NCCL collective
// moves; the padding follows each block's rows). One pass over the whole buffer either way: one
// kernel per collective instead of a copy per rank.
#pragma once
#include <cstddef>
#include <cstdint>

namespace cai::kernels {

// Elements of the staging buffer: B·N·F packed, T·B·⌈N/T⌉·F padded.
inline int64_t staged_numel(int64_t B, int64_t N, int64_t F, int T, bool padded) {
  return padded ? static_cast<int64_t>(T) * B * ((N + T - 1) / T) * F : B * N * F;
}

namespace cpu {
// staged -> full [B, N, F].
void tokens_from_ranks(const void* staged, void* full, size_t es, int64_t B, int64_t N, int64_t F,
                       int T, bool padded);
// full [B, N, F] -> staged; the padding (padded) is zeroed.
void tokens_to_ranks(const void* full, void* staged, size_t es, int64_t B, int64_t N, int64_t F,
                     int T, bool padded);
}  // namespace cpu

namespace cuda {
void tokens_from_ranks(const void* staged, void* full, size_t es, int64_t B, int64_t N, int64_t F,
                       int T, bool padded, void* stream = nullptr);
void tokens_to_ranks(const void* full, void* staged, size_t es, int64_t B, int64_t N, int64_t F,
                     int T, bool padded, void* stream = nullptr);
}  // namespace cuda

}  // namespace cai::kernels
