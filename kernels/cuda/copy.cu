// copy_spans (kernels/copy.h): up to kCopyMulti spans per launch over one flat index of all their
// elements; a thread finds its span by binary search of the prefix ends once per round, then
// steps forward (its indices only grow), as zero_multi does.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/copy.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/typed.cuh"

namespace cai::kernels::cuda {

namespace {

struct CopyList {
  const void* src[kCopyMulti];
  void* dst[kCopyMulti];
  int64_t end[kCopyMulti];  // exclusive prefix ends, in elements
  int count;
};

constexpr int kCopyUnroll = 4;

__device__ __forceinline__ int span_of(const CopyList& l, int64_t k) {
  int lo = 0, hi = l.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (k < l.end[mid])
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

// W elements a load and a store (W = 4: every span of the launch starts on a 4-element boundary
// of both types, 16 bytes for fp32, and holds a multiple of 4 elements; `l`'s ends count groups
// of four). ZeRO's packs and unpacks are such spans (even parameter sizes cut in halves or
// quarters): one element at a time moved ViT-H/14's gathered parameters at about a quarter of
// the bandwidth.
template <typename T, int W>
struct alignas(W * sizeof(T)) Group {
  T v[W];
};

template <typename TS, typename TD, bool Acc, int W>
__global__ void copy_spans_kernel(const CopyList l) {
  const int64_t total = l.end[l.count - 1];
  const int64_t chunk = static_cast<int64_t>(blockDim.x) * kCopyUnroll;
  for (int64_t base = blockIdx.x * chunk; base < total; base += gridDim.x * chunk) {
    int64_t k = base + threadIdx.x;
    if (k >= total) break;
    int t = span_of(l, k);
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u, k += blockDim.x) {
      if (k >= total) break;
      while (k >= l.end[t]) ++t;
      const int64_t i = k - (t ? l.end[t - 1] : 0);
      const Group<TS, W> v = static_cast<const Group<TS, W>*>(l.src[t])[i];
      Group<TD, W>* d = static_cast<Group<TD, W>*>(l.dst[t]) + i;
      Group<TD, W> o;
      if constexpr (Acc) {
        o = *d;
#pragma unroll
        for (int j = 0; j < W; ++j) o.v[j] = from_f32<TD>(to_f32(o.v[j]) + to_f32(v.v[j]));
      } else if constexpr (std::is_same_v<TS, TD>) {
        o = v;
      } else {
#pragma unroll
        for (int j = 0; j < W; ++j) o.v[j] = from_f32<TD>(to_f32(v.v[j]));
      }
      *d = o;
    }
  }
}

}  // namespace

void copy_spans(DT src_t, DT dst_t, int count, const SpanDesc* spans, void* stream,
                bool accumulate) {
  CAI_CHECK(count >= 0, "[copy_spans] {} spans: expected at least 0", count);
  int i = 0;
  while (i < count) {
    CopyList l{};
    int64_t total = 0;
    for (; i < count && l.count < kCopyMulti; ++i) {
      CAI_CHECK(spans[i].n >= 0, "[copy_spans] span {} has {} elements: expected at least 0", i,
                spans[i].n);
      if (spans[i].n == 0) continue;
      l.src[l.count] = spans[i].src;
      l.dst[l.count] = spans[i].dst;
      total += spans[i].n;
      l.end[l.count] = total;
      ++l.count;
    }
    if (l.count == 0) continue;
    // Every span on 4-element boundaries of both types: four elements at a time.
    bool four = true;
    for (int k = 0; k < l.count && four; ++k) {
      const int64_t n = l.end[k] - (k ? l.end[k - 1] : 0);
      four = n % 4 == 0 && reinterpret_cast<uintptr_t>(l.src[k]) % (4 * dt_size(src_t)) == 0 &&
             reinterpret_cast<uintptr_t>(l.dst[k]) % (4 * dt_size(dst_t)) == 0;
    }
    if (four) {
      for (int k = 0; k < l.count; ++k) l.end[k] /= 4;
      total /= 4;
    }
    const int64_t rounds = (total + kBlock * kCopyUnroll - 1) / (kBlock * kCopyUnroll);
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(rounds, 8 * multiprocessors()));
    dispatch_dt(src_t, "copy_spans", [&](auto ts) {
      using TS = decltype(ts);
      dispatch_dt(dst_t, "copy_spans", [&](auto td) {
        using TD = decltype(td);
        const cudaStream_t s = as_stream(stream);
        if (four && accumulate)
          copy_spans_kernel<TS, TD, true, 4><<<grid, kBlock, 0, s>>>(l);
        else if (four)
          copy_spans_kernel<TS, TD, false, 4><<<grid, kBlock, 0, s>>>(l);
        else if (accumulate)
          copy_spans_kernel<TS, TD, true, 1><<<grid, kBlock, 0, s>>>(l);
        else
          copy_spans_kernel<TS, TD, false, 1><<<grid, kBlock, 0, s>>>(l);
        CAI_CUDA_CHECK_LAUNCH();
      });
    });
  }
}

}  // namespace cai::kernels::cuda
