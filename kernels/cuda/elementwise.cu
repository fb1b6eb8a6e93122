// Elementwise helpers (fp32) and the sum of squares (accumulated in double, returned to the host),
// then the typed helpers: cast, add_t, axpy_t (4 elements per access when the pointers allow it)
// and count_nonfinite.
#include <algorithm>

#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/typed.cuh"
#include "kernels/elementwise.h"

namespace cai::kernels::cuda {

namespace {

__global__ void add_kernel(const float* a, const float* b, float* y, int64_t n) {
  CAI_GRID_STRIDE(i, n) y[i] = a[i] + b[i];
}
__global__ void axpy_kernel(float alpha, const float* x, float* y, int64_t n) {
  CAI_GRID_STRIDE(i, n) y[i] += alpha * x[i];
}
__global__ void scale_kernel(float alpha, float* x, int64_t n) {
  CAI_GRID_STRIDE(i, n) x[i] *= alpha;
}
__global__ void fill_kernel(float value, float* x, int64_t n) {
  CAI_GRID_STRIDE(i, n) x[i] = value;
}

// Sum of squares: kPartBlocks (or fewer) blocks of kBlock threads each reduce a grid-stride slice
// in double into part[blockIdx.x]; one block then adds the parts in a fixed order. The grid size
// depends only on n, so the result is deterministic.
constexpr int kPartBlocks = 1024;

__device__ double block_sum(double v) {
  __shared__ double scratch[kBlock / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  double r = 0.0;
  if (threadIdx.x == 0)
    for (int w = 0; w < kBlock / 32; ++w) r += scratch[w];
  return r;  // valid in thread 0 only
}

__global__ void __launch_bounds__(kBlock)
    sum_squares_part_kernel(const float* x, int64_t n, double* part) {
  double acc = 0.0;
  CAI_GRID_STRIDE(i, n) {
    const double v = static_cast<double>(x[i]);
    acc += v * v;
  }
  const double r = block_sum(acc);
  if (threadIdx.x == 0) part[blockIdx.x] = r;
}

__global__ void __launch_bounds__(kBlock)
    sum_parts_kernel(const double* part, int parts, double* total) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < parts; i += blockDim.x) acc += part[i];
  const double r = block_sum(acc);
  if (threadIdx.x == 0) *total = r;
}

// --- typed ---------------------------------------------------------------------------------------
constexpr int kVec = 4;

// Grid for n elements moved 4 at a time when vec.
unsigned vec_grid(int64_t n, bool vec) {
  return grid_for(vec ? (n + kVec - 1) / kVec : n);
}

template <typename TS, typename TD>
__global__ void cast_kernel(const TS* __restrict__ src, TD* __restrict__ dst, int64_t n, bool vec) {
  const int64_t nv = vec ? n / kVec : 0;
  CAI_GRID_STRIDE(k, nv) {
    float a[kVec];
    load_vec(src + k * kVec, a);
    store_vec(dst + k * kVec, a);
  }
  for (int64_t i = nv * kVec + first_index(); i < n; i += grid_step())
    dst[i] = from_f32<TD>(to_f32(src[i]));
}

// The entry of a multi-tensor list (CastList, ZeroList) holding flat index k, found by a linear
// search of the exclusive prefix ends l.end, and k's index i inside it.
template <typename List>
__device__ __forceinline__ int entry_of(const List& l, int64_t k, int64_t& i) {
  int t = 0;
  while (k >= l.end[t]) ++t;
  i = k - (t ? l.end[t - 1] : 0);
  return t;
}

// Up to kCastMulti fp32 tensors in one launch: a flat index over all elements, end[i] the
// exclusive prefix end of tensor i (count ≤ 16: a linear search finds the tensor). Tensors whose
// pointers and sizes allow it move 4 elements per access (vec bit i).
struct CastList {
  const float* src[kCastMulti];
  void* dst[kCastMulti];
  int64_t end[kCastMulti];  // in units: vectors of 4 for vec tensors, elements otherwise
  int count;
  unsigned vec;
};

template <typename TD>
__global__ void cast_multi_kernel(const CastList l) {
  const int64_t total = l.end[l.count - 1];
  CAI_GRID_STRIDE(k, total) {
    int64_t i;
    const int t = entry_of(l, k, i);
    TD* dst = static_cast<TD*>(l.dst[t]);
    if ((l.vec >> t) & 1u) {
      float a[kVec];
      load_vec(l.src[t] + i * kVec, a);
      store_vec(dst + i * kVec, a);
    } else {
      dst[i] = from_f32<TD>(l.src[t][i]);
    }
  }
}

// Up to kZeroMulti byte ranges in one launch: a flat index over 16-byte units (ranges whose
// start and length are multiples of 16) and single bytes (the others), end[i] the exclusive
// prefix end of range i in those units (a linear search finds the range).
struct ZeroList {
  void* p[kZeroMulti];
  int64_t end[kZeroMulti];
  unsigned long long vec;  // bit i: range i in 16-byte units
  int count;
};

// A block clears kZeroUnroll·blockDim consecutive units per round, a thread every blockDim-th
// (coalesced stores); a thread searches for its range once per round and then only steps forward
// (units only grow). The grid is a few blocks per SM: one unit per thread and a search from the
// first range each made the kernel instruction- and block-launch bound (1.5 TB/s on an H100).
constexpr int kZeroUnroll = 8;

__global__ void zero_multi_kernel(const ZeroList l) {
  const int64_t total = l.end[l.count - 1];
  const int64_t chunk = static_cast<int64_t>(blockDim.x) * kZeroUnroll;
  for (int64_t base = blockIdx.x * chunk; base < total; base += gridDim.x * chunk) {
    int64_t k = base + threadIdx.x;
    if (k >= total) break;
    int64_t i;
    int t = entry_of(l, k, i);
#pragma unroll
    for (int u = 0; u < kZeroUnroll; ++u, k += blockDim.x) {
      if (k >= total) break;
      while (k >= l.end[t]) ++t;
      i = k - (t ? l.end[t - 1] : 0);
      if ((l.vec >> t) & 1ull)
        static_cast<uint4*>(l.p[t])[i] = make_uint4(0, 0, 0, 0);
      else
        static_cast<unsigned char*>(l.p[t])[i] = 0;
    }
  }
}

template <typename TA, typename TB, typename TY>
__global__ void add_t_kernel(const TA* __restrict__ a, const TB* __restrict__ b, TY* __restrict__ y,
                             int64_t n, bool vec) {
  const int64_t nv = vec ? n / kVec : 0;
  CAI_GRID_STRIDE(k, nv) {
    float va[kVec], vb[kVec];
    load_vec(a + k * kVec, va);
    load_vec(b + k * kVec, vb);
#pragma unroll
    for (int e = 0; e < kVec; ++e) va[e] += vb[e];
    store_vec(y + k * kVec, va);
  }
  for (int64_t i = nv * kVec + first_index(); i < n; i += grid_step())
    y[i] = from_f32<TY>(to_f32(a[i]) + to_f32(b[i]));
}

template <typename TX>
__global__ void axpy_t_kernel(float alpha, const TX* __restrict__ x, float* __restrict__ y,
                              int64_t n, bool vec) {
  const int64_t nv = vec ? n / kVec : 0;
  CAI_GRID_STRIDE(k, nv) {
    float vx[kVec], vy[kVec];
    load_vec(x + k * kVec, vx);
    load_vec(y + k * kVec, vy);
#pragma unroll
    for (int e = 0; e < kVec; ++e) vy[e] += alpha * vx[e];
    store_vec(y + k * kVec, vy);
  }
  for (int64_t i = nv * kVec + first_index(); i < n; i += grid_step()) y[i] += alpha * to_f32(x[i]);
}

// Adds the number of inf/NaN elements to *count: per-thread counts, summed per warp, one atomic
// per warp that saw any (an integer sum: the order does not matter).
__global__ void count_nonfinite_kernel(const float* __restrict__ x, int64_t n, bool vec,
                                       unsigned long long* count) {
  unsigned long long c = 0;
  const int64_t nv = vec ? n / kVec : 0;
  CAI_GRID_STRIDE(k, nv) {
    const float4 v = reinterpret_cast<const float4*>(x)[k];
    c += !isfinite(v.x) + !isfinite(v.y) + !isfinite(v.z) + !isfinite(v.w);
  }
  for (int64_t i = nv * kVec + first_index(); i < n; i += grid_step()) c += !isfinite(x[i]);
  for (int o = 16; o > 0; o >>= 1) c += __shfl_down_sync(0xffffffffu, c, o);
  if ((threadIdx.x & 31) == 0 && c) atomicAdd(count, c);
}

}  // namespace

void add(const float* a, const float* b, float* y, int64_t n, void* stream) {
  if (n <= 0) return;
  add_kernel<<<grid_for(n), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(a, b, y, n);
  CAI_CUDA_CHECK_LAUNCH();
}
void axpy(float alpha, const float* x, float* y, int64_t n, void* stream) {
  if (n <= 0) return;
  axpy_kernel<<<grid_for(n), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(alpha, x, y, n);
  CAI_CUDA_CHECK_LAUNCH();
}
void scale(float alpha, float* x, int64_t n, void* stream) {
  if (n <= 0) return;
  scale_kernel<<<grid_for(n), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(alpha, x, n);
  CAI_CUDA_CHECK_LAUNCH();
}
void fill(float value, float* x, int64_t n, void* stream) {
  if (n <= 0) return;
  fill_kernel<<<grid_for(n), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(value, x, n);
  CAI_CUDA_CHECK_LAUNCH();
}

double sum_squares(const float* x, int64_t n, void* stream) {
  if (n <= 0) return 0.0;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const unsigned parts = std::min<unsigned>(grid_for(n), kPartBlocks);
  // part[0, parts) then the total at part[parts], from the caching allocator.
  const Scratch buf((parts + 1) * sizeof(double));
  double* part = buf.as<double>();
  sum_squares_part_kernel<<<parts, kBlock, 0, s>>>(x, n, part);
  CAI_CUDA_CHECK_LAUNCH();
  sum_parts_kernel<<<1, kBlock, 0, s>>>(part, static_cast<int>(parts), part + parts);
  CAI_CUDA_CHECK_LAUNCH();
  double total = 0.0;
  CAI_CUDA_CHECK(cudaMemcpyAsync(&total, part + parts, sizeof(double), cudaMemcpyDeviceToHost, s));
  CAI_CUDA_CHECK(cudaStreamSynchronize(s));  // the value goes to the host
  return total;
}

void cast(DT src_t, const void* src, DT dst_t, void* dst, int64_t n, void* stream) {
  if (n <= 0) return;
  if (src_t == dst_t) {
    CAI_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * dt_size(src_t),
                                   cudaMemcpyDeviceToDevice, as_stream(stream)));
    return;
  }
  dispatch_dt(src_t, "cast", [&](auto ts) {
    using TS = decltype(ts);
    dispatch_dt(dst_t, "cast", [&](auto td) {
      using TD = decltype(td);
      const bool vec = vec_aligned<TS, kVec>(src) && vec_aligned<TD, kVec>(dst);
      cast_kernel<TS, TD><<<vec_grid(n, vec), kBlock, 0, as_stream(stream)>>>(
          static_cast<const TS*>(src), static_cast<TD*>(dst), n, vec);
      CAI_CUDA_CHECK_LAUNCH();
    });
  });
}

void cast_multi(int count, const float* const* src, DT dst_t, void* const* dst, const int64_t* n,
                void* stream) {
  CAI_CHECK(count >= 0 && count <= kCastMulti, "[cast_multi] {} tensors: expected 0 to {}", count,
            kCastMulti);
  CAI_CHECK(dst_t == DT::BF16 || dst_t == DT::F16,
            "[cast_multi] destination type {}: expected bf16 or fp16", dt_name(dst_t));
  CastList l{};
  int64_t total = 0;
  for (int i = 0; i < count; ++i) {
    CAI_CHECK(n[i] >= 0, "[cast_multi] tensor {} has {} elements", i, n[i]);
    if (n[i] == 0) continue;
    const bool vec = n[i] % kVec == 0 && vec_aligned<float, kVec>(src[i]) &&
                     reinterpret_cast<uintptr_t>(dst[i]) % (kVec * dt_size(dst_t)) == 0;
    l.src[l.count] = src[i];
    l.dst[l.count] = dst[i];
    total += vec ? n[i] / kVec : n[i];
    l.end[l.count] = total;
    if (vec) l.vec |= 1u << l.count;
    ++l.count;
  }
  if (l.count == 0) return;
  dispatch_dt(dst_t, "cast_multi", [&](auto td) {
    using TD = decltype(td);
    if constexpr (!std::is_same_v<TD, float>) {
      cast_multi_kernel<TD><<<grid_for(total), kBlock, 0, as_stream(stream)>>>(l);
      CAI_CUDA_CHECK_LAUNCH();
    }
  });
}

void zero_multi(int count, void* const* p, const int64_t* bytes, void* stream) {
  CAI_CHECK(count >= 0 && count <= kZeroMulti, "[zero_multi] {} ranges: expected 0 to {}", count,
            kZeroMulti);
  ZeroList l{};
  int64_t total = 0;
  for (int i = 0; i < count; ++i) {
    CAI_CHECK(bytes[i] >= 0, "[zero_multi] range {} has {} bytes", i, bytes[i]);
    if (bytes[i] == 0) continue;
    const bool vec = bytes[i] % 16 == 0 && reinterpret_cast<uintptr_t>(p[i]) % 16 == 0;
    l.p[l.count] = p[i];
    total += vec ? bytes[i] / 16 : bytes[i];
    l.end[l.count] = total;
    if (vec) l.vec |= 1ull << l.count;
    ++l.count;
  }
  if (l.count == 0) return;
  const int64_t rounds =
      (total + int64_t{kBlock} * kZeroUnroll - 1) / (int64_t{kBlock} * kZeroUnroll);
  const int64_t grid = std::min<int64_t>(rounds, int64_t{8} * multiprocessors());
  zero_multi_kernel<<<static_cast<unsigned>(grid), kBlock, 0, as_stream(stream)>>>(l);
  CAI_CUDA_CHECK_LAUNCH();
}

void add_t(DT at, const void* a, DT bt, const void* b, DT yt, void* y, int64_t n, void* stream) {
  if (n <= 0) return;
  dispatch_dt(at, "add", [&](auto ta) {
    using TA = decltype(ta);
    dispatch_dt(bt, "add", [&](auto tb) {
      using TB = decltype(tb);
      dispatch_dt(yt, "add", [&](auto ty) {
        using TY = decltype(ty);
        const bool vec =
            vec_aligned<TA, kVec>(a) && vec_aligned<TB, kVec>(b) && vec_aligned<TY, kVec>(y);
        add_t_kernel<TA, TB, TY><<<vec_grid(n, vec), kBlock, 0, as_stream(stream)>>>(
            static_cast<const TA*>(a), static_cast<const TB*>(b), static_cast<TY*>(y), n, vec);
        CAI_CUDA_CHECK_LAUNCH();
      });
    });
  });
}

void axpy_t(float alpha, DT xt, const void* x, float* y, int64_t n, void* stream) {
  if (n <= 0) return;
  dispatch_dt(xt, "axpy", [&](auto tx) {
    using TX = decltype(tx);
    const bool vec = vec_aligned<TX, kVec>(x) && vec_aligned<float, kVec>(y);
    axpy_t_kernel<TX><<<vec_grid(n, vec), kBlock, 0, as_stream(stream)>>>(
        alpha, static_cast<const TX*>(x), y, n, vec);
    CAI_CUDA_CHECK_LAUNCH();
  });
}

int64_t count_nonfinite(const float* x, int64_t n, void* stream) {
  if (n <= 0) return 0;
  const cudaStream_t s = as_stream(stream);
  Scratch count(sizeof(unsigned long long));
  CAI_CUDA_CHECK(cudaMemsetAsync(count.as<void>(), 0, sizeof(unsigned long long), s));
  const bool vec = vec_aligned<float, kVec>(x);
  const unsigned grid = std::min(vec_grid(n, vec), 4096u);
  count_nonfinite_kernel<<<grid, kBlock, 0, s>>>(x, n, vec, count.as<unsigned long long>());
  CAI_CUDA_CHECK_LAUNCH();
  unsigned long long host = 0;
  CAI_CUDA_CHECK(cudaMemcpyAsync(&host, count.as<void>(), sizeof host, cudaMemcpyDeviceToHost, s));
  CAI_CUDA_CHECK(cudaStreamSynchronize(s));  // the count goes to the host
  return static_cast<int64_t>(host);
}

}  // namespace cai::kernels::cuda
