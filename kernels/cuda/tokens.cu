// kernels/tokens.h on the GPU: one grid-stride pass over the destination in the widest unit
// (16, 8, 4, 2 or 1 bytes) that divides a row (F elements) and both base addresses, so any
// element type moves as raw bytes. Each unit finds its rank's block by the token split's closed
// form (rank of token t: ⌈(t+1)·T/N⌉ - 1 for the split at ⌊N·r/T⌋).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/base/error.h"
#include "kernels/cuda/launch.h"
#include "kernels/tokens.h"

namespace cai::kernels::cuda {

namespace {

struct Split {
  int64_t B, N, T, most, row_units;  // row_units: a row's size in units
  bool padded;
  __device__ int64_t t0(int64_t r) const { return N * r / T; }
  __device__ int64_t block(int64_t r) const { return padded ? r * B * most : B * t0(r); }
  __device__ int64_t rank_of_token(int64_t t) const { return ((t + 1) * T + N - 1) / N - 1; }
};

// full row (b·N + t) <- its staged row.
template <typename U>
__global__ void from_ranks_kernel(const U* __restrict__ staged, U* __restrict__ full, Split s) {
  const int64_t total = s.B * s.N * s.row_units;
  CAI_GRID_STRIDE(k, total) {
    const int64_t row = k / s.row_units, c = k - row * s.row_units;
    const int64_t b = row / s.N, t = row - b * s.N;
    const int64_t r = s.rank_of_token(t), t0 = s.t0(r), n = s.t0(r + 1) - t0;
    const int64_t src = s.block(r) + b * n + (t - t0);
    full[k] = staged[src * s.row_units + c];
  }
}

// staged row -> from its full row, or 0 in a block's padding.
template <typename U>
__global__ void to_ranks_kernel(const U* __restrict__ full, U* __restrict__ staged, Split s) {
  const int64_t rows = s.padded ? s.T * s.B * s.most : s.B * s.N;
  const int64_t total = rows * s.row_units;
  CAI_GRID_STRIDE(k, total) {
    const int64_t row = k / s.row_units, c = k - row * s.row_units;
    // The block holding this row: padded, row / (B·most); packed, the rank of token ⌊row/B⌋.
    const int64_t r = s.padded ? row / (s.B * s.most) : s.rank_of_token(row / s.B);
    const int64_t t0 = s.t0(r), n = s.t0(r + 1) - t0, j = row - s.block(r);
    if (j >= s.B * n) {
      staged[k] = U{};
      continue;
    }
    const int64_t b = j / n, t = t0 + (j - b * n);
    staged[k] = full[(b * s.N + t) * s.row_units + c];
  }
}

struct alignas(16) U16 {
  uint4 v;
};

template <bool To>
void launch(const void* src, void* dst, size_t es, int64_t B, int64_t N, int64_t F, int T,
            bool padded, void* stream) {
  CAI_CHECK(B >= 0 && F >= 0 && T >= 1 && N >= T && es > 0,
            "[tokens_ranks] batch {}, tokens {}, features {} over {} ranks ({}-byte elements): "
            "expected at least as many tokens as ranks",
            B, N, F, T, es);
  const size_t row = static_cast<size_t>(F) * es;
  if (B == 0 || row == 0) return;
  const auto a = reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | row;
  size_t unit = 16;
  while (unit > 1 && a % unit != 0) unit /= 2;
  Split s{B, N, T, (N + T - 1) / T, static_cast<int64_t>(row / unit), padded};
  const int64_t rows = To && padded ? T * B * s.most : B * N;
  const unsigned grid = grid_for(rows * s.row_units);
  cudaStream_t st = as_stream(stream);
  auto go = [&](auto u) {
    using U = decltype(u);
    if constexpr (To)
      to_ranks_kernel<U>
          <<<grid, kBlock, 0, st>>>(static_cast<const U*>(src), static_cast<U*>(dst), s);
    else
      from_ranks_kernel<U>
          <<<grid, kBlock, 0, st>>>(static_cast<const U*>(src), static_cast<U*>(dst), s);
  };
  switch (unit) {
    case 16:
      go(U16{});
      break;
    case 8:
      go(uint2{});
      break;
    case 4:
      go(uint32_t{});
      break;
    case 2:
      go(uint16_t{});
      break;
    default:
      go(uint8_t{});
  }
  CAI_CUDA_CHECK_LAUNCH();
}

}  // namespace

void tokens_from_ranks(const void* staged, void* full, size_t es, int64_t B, int64_t N, int64_t F,
                       int T, bool padded, void* stream) {
  launch<false>(staged, full, es, B, N, F, T, padded, stream);
}

void tokens_to_ranks(const void* full, void* staged, size_t es, int64_t B, int64_t N, int64_t F,
                     int T, bool padded, void* stream) {
  launch<true>(full, staged, es, B, N, F, T, padded, stream);
}

}  // namespace cai::kernels::cuda
