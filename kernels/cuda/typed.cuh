// Device side of the typed (fp32/bf16/fp16) kernels: element conversions through fp32, small
// vector loads/stores, and the dispatch from a runtime DT to a C++ element type.
// bf16 rounding equals the host's (cai::float_to_bf16: round to nearest even, NaN keeps its sign
// and top payload bits) bit for bit: the hardware conversion, and the host's bit arithmetic for
// NaN.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/base/dtype.h"
#include "kernels/base/error.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/device.h"

namespace cai::kernels::cuda {

using bf16 = __nv_bfloat16;
using fp16 = __half;

__device__ __forceinline__ float to_f32(float v) {
  return v;
}
__device__ __forceinline__ float to_f32(bf16 v) {
  return __uint_as_float(static_cast<uint32_t>(__bfloat16_as_ushort(v)) << 16);
}
__device__ __forceinline__ float to_f32(fp16 v) {
  return __half2float(v);
}

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) {
  return v;
}
// NaN as the host rounds it: the sign and top payload bits kept, quiet.
__device__ __forceinline__ bf16 bf16_nan(float v) {
  return __ushort_as_bfloat16(static_cast<unsigned short>((__float_as_uint(v) >> 16) | 0x40u));
}
// The hardware's round-to-nearest-even conversion (one instruction; subnormals kept, overflow to
// inf, as the host does) for everything but NaN, whose payload the host keeps.
template <>
__device__ __forceinline__ bf16 from_f32<bf16>(float v) {
  return v != v ? bf16_nan(v) : __float2bfloat16_rn(v);
}
// Two values in one conversion instruction (a in the low half).
__device__ __forceinline__ __nv_bfloat162 bf16x2_from_f32(float a, float b) {
  if (a != a || b != b) return __nv_bfloat162(from_f32<bf16>(a), from_f32<bf16>(b));
  return __floats2bfloat162_rn(a, b);
}
template <>
__device__ __forceinline__ fp16 from_f32<fp16>(float v) {
  return __float2half_rn(v);
}

// V consecutive elements moved as one aligned access (16 bytes for 4 fp32, 8 for 4 halves).
template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

template <int V, typename T>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[V]) {
  const Vec<T, V> r = *reinterpret_cast<const Vec<T, V>*>(p);
#pragma unroll
  for (int e = 0; e < V; ++e) out[e] = to_f32(r.v[e]);
}
template <int V, typename T>
__device__ __forceinline__ void store_vec(T* p, const float (&in)[V]) {
  Vec<T, V> r;
  if constexpr (std::is_same_v<T, bf16> && V % 2 == 0) {
#pragma unroll
    for (int e = 0; e < V; e += 2) {
      const __nv_bfloat162 h = bf16x2_from_f32(in[e], in[e + 1]);
      r.v[e] = h.x;
      r.v[e + 1] = h.y;
    }
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) r.v[e] = from_f32<T>(in[e]);
  }
  *reinterpret_cast<Vec<T, V>*>(p) = r;
}

// True when p may be accessed as Vec<T, V> (null counts as aligned: unused operands).
template <typename T, int V>
inline bool vec_aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % (sizeof(T) * V) == 0;
}

// Calls f(T{}) with T = float, bf16 or fp16 for t.
template <typename F>
void dispatch_dt(DT t, const char* op, F&& f) {
  switch (t) {
    case DT::F32:
      f(float{});
      return;
    case DT::BF16:
      f(bf16{});
      return;
    case DT::F16:
      f(fp16{});
      return;
  }
  fail("[{}] element type code {} is not fp32, bf16 or fp16", op, static_cast<int>(t));
}

// Scratch device memory from the caching allocator (kernels/device.h) on the current device,
// returned to the pool when the scope ends. Like a Tensor's storage, it may be handed out again
// at once: later work on the same stream is ordered after the kernels that use it.
class Scratch {
 public:
  explicit Scratch(size_t bytes) {
    CAI_CUDA_CHECK(cudaGetDevice(&device_));
    p_ = alloc(bytes, device_);
  }
  ~Scratch() { free(p_, device_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  int device_ = 0;
};

}  // namespace cai::kernels::cuda
