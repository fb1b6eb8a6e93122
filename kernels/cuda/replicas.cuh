// The multi-tensor kernels' reads of gradients as their sum over the ranks (kernels/optim.h,
// GradReplicas; passed to the kernels by value): element i of tensor x read as
// x[i + delta[0]] + x[i + delta[1]] + ..., in that order, in fp32.
#pragma once
#include "kernels/cuda/check.h"
#include "kernels/optim.h"

namespace cai::kernels::cuda {

// The kernel argument for `r` (null: none), checked.
inline GradReplicas replicas_arg(const GradReplicas* r, const char* who) {
  if (!r) return GradReplicas{};
  CAI_CHECK(r->n >= 0 && r->n <= kMaxGradReplicas, "[{}] {} gradient replicas (0 to {})", who, r->n,
            kMaxGradReplicas);
  for (int k = 0; k < r->n; ++k)
    CAI_CHECK(r->delta[k] % 4 == 0,
              "[{}] gradient replica {} lies {} elements away: expected a multiple of 4", who, k,
              r->delta[k]);
  return *r;
}

__device__ __forceinline__ float replica_sum(const float* x, int64_t i, const GradReplicas& r) {
  if (r.n == 0) return x[i];
  float acc = x[i + r.delta[0]];
  for (int k = 1; k < r.n; ++k) acc += x[i + r.delta[k]];
  return acc;
}

// Elements 4k .. 4k + 3 (x 16-byte aligned, so every copy is).
__device__ __forceinline__ float4 replica_sum4(const float* x, int64_t k, const GradReplicas& r) {
  if (r.n == 0) return reinterpret_cast<const float4*>(x)[k];
  float4 acc = reinterpret_cast<const float4*>(x + r.delta[0])[k];
  for (int j = 1; j < r.n; ++j) {
    const float4 v = reinterpret_cast<const float4*>(x + r.delta[j])[k];
    acc.x += v.x;
    acc.y += v.y;
    acc.z += v.z;
    acc.w += v.w;
  }
  return acc;
}

}  // namespace cai::kernels::cuda
