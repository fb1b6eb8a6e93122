// Optimizer updates, one thread per element, with the formulas of kernels/cpu/optim.cpp. The bias
// corrections are computed on the host in float exactly as the CPU does and passed in.
// The multi-tensor updates (as apex's multi_tensor_apply) cut every tensor into chunks of kChunk
// elements, one block per chunk, with the (tensor, chunk) table uploaded once per call.
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/replicas.cuh"
#include "kernels/cuda/typed.cuh"
#include "kernels/device.h"
#include "kernels/optim.h"

namespace cai::kernels::cuda {

namespace {

__global__ void sgd_kernel(float* p, const float* grad, float* buf, int64_t n, float lr,
                           float momentum, float dampening, float weight_decay, bool nesterov,
                           bool first) {
  CAI_GRID_STRIDE(i, n) {
    float g = grad[i];
    if (weight_decay != 0.0f) g += weight_decay * p[i];
    if (momentum != 0.0f) {
      const float b = first ? g : momentum * buf[i] + (1.0f - dampening) * g;
      buf[i] = b;
      g = nesterov ? g + momentum * b : b;
    }
    p[i] -= lr * g;
  }
}

// decay = 1 − lr·wd (decoupled), step_size = lr / (1 − β1^t), bc2_sqrt = √(1 − β2^t).
__global__ void adam_kernel(float* p, const float* grad, float* m, float* v, int64_t n, float beta1,
                            float beta2, float eps, float weight_decay, float decay,
                            float step_size, float bc2_sqrt, bool decoupled) {
  CAI_GRID_STRIDE(i, n) {
    float g = grad[i];
    float pi = p[i];
    if (decoupled)
      pi *= decay;
    else if (weight_decay != 0.0f)
      g += weight_decay * pi;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) / bc2_sqrt + eps;
    p[i] = pi - step_size * (mi / denom);
  }
}

// bc1 = 1 − β1^t, bc2_sqrt = √(1 − β2^t).
__global__ void lamb_kernel(const float* p, const float* grad, float* m, float* v, float* update,
                            int64_t n, float beta1, float beta2, float eps, float weight_decay,
                            float bc1, float bc2_sqrt) {
  CAI_GRID_STRIDE(i, n) {
    const float g = grad[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) / bc2_sqrt + eps;
    update[i] = (mi / bc1) / denom + weight_decay * p[i];
  }
}

// --- multi-tensor
// ---------------------------------------------------------------------------------
constexpr int kChunk = 32768;  // elements per block
constexpr int kOptBlock = 256;

struct TensorMeta {
  float* p;
  const float* g;
  float* m;
  float* v;
  int64_t n;
  float wd;
  float decay;      // 1 − lr·wd (AdamW's decoupled decay)
  int first_chunk;  // this tensor's chunks are [first_chunk, first_chunk + chunks)
  int chunks;
  int vec;  // the four pointers are 16-byte aligned: float4 accesses
  int pad;
};
struct ChunkMeta {
  int tensor;
  int pad;
  int64_t start;
};

// The table on the device: tensors, then chunks, then (LAMB) one double2 per chunk for the
// partial sums of squares of p and u. One allocation, one asynchronous copy.
class MultiTensorTable {
 public:
  MultiTensorTable(int count, float* const* p, const float* const* g, float* const* m,
                   float* const* v, const int64_t* n, const float* wd, float lr, bool partials,
                   cudaStream_t s) {
    CAI_CHECK(count >= 0, "[multi_tensor] tensor count {} is negative", count);
    std::vector<TensorMeta> tensors;
    std::vector<ChunkMeta> chunks;
    for (int i = 0; i < count; ++i) {
      CAI_CHECK(n[i] >= 0, "[multi_tensor] tensor {} has {} elements", i, n[i]);
      if (n[i] == 0) continue;
      const auto a16 = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
      const int64_t nc = (n[i] + kChunk - 1) / kChunk;
      CAI_CHECK(static_cast<int64_t>(chunks.size()) + nc < (int64_t{1} << 31),
                "[multi_tensor] {} chunks of {} elements is more than one launch holds",
                chunks.size() + nc, kChunk);
      const int t = static_cast<int>(tensors.size());
      tensors.push_back(TensorMeta{p[i], g[i], m[i], v[i], n[i], wd[i], 1.0f - lr * wd[i],
                                   static_cast<int>(chunks.size()), static_cast<int>(nc),
                                   a16(p[i]) && a16(g[i]) && a16(m[i]) && a16(v[i]), 0});
      for (int64_t c = 0; c < nc; ++c) chunks.push_back(ChunkMeta{t, 0, c * kChunk});
    }
    chunks_ = static_cast<int>(chunks.size());
    if (chunks_ == 0) return;
    const size_t tb = tensors.size() * sizeof(TensorMeta), cb = chunks.size() * sizeof(ChunkMeta);
    const size_t pb = partials ? chunks.size() * sizeof(double2) : 0;
    std::vector<unsigned char> host(tb + cb);
    std::memcpy(host.data(), tensors.data(), tb);
    std::memcpy(host.data() + tb, chunks.data(), cb);
    buf_.emplace(tb + cb + pb);
    unsigned char* d = buf_->as<unsigned char>();
    // Through a page-locked block: no wait for the device, and `host` may go out of scope.
    upload_async(d, host.data(), tb + cb, s);
    tensors_ = reinterpret_cast<const TensorMeta*>(d);
    chunk_table_ = reinterpret_cast<const ChunkMeta*>(d + tb);
    partials_ = partials ? reinterpret_cast<double2*>(d + tb + cb) : nullptr;
  }
  int chunks() const { return chunks_; }
  const TensorMeta* tensors() const { return tensors_; }
  const ChunkMeta* chunk_table() const { return chunk_table_; }
  double2* partials() const { return partials_; }

 private:
  std::optional<Scratch> buf_;
  int chunks_ = 0;
  const TensorMeta* tensors_ = nullptr;
  const ChunkMeta* chunk_table_ = nullptr;
  double2* partials_ = nullptr;
};

// Calls f(i) for the elements of this block's chunk (f(i) for i in [0, len), 4 at a time through
// f4(k) for k < len/4 when the tensor's pointers are aligned).
template <typename F, typename F4>
__device__ __forceinline__ void for_chunk(const TensorMeta& t, int64_t len, F&& f, F4&& f4) {
  int64_t done = 0;
  if (t.vec) {
    const int64_t nv = len / 4;
    for (int64_t k = threadIdx.x; k < nv; k += blockDim.x) f4(k);
    done = nv * 4;
  }
  for (int64_t i = done + threadIdx.x; i < len; i += blockDim.x) f(i);
}

__global__ void __launch_bounds__(kOptBlock)
    multi_adam_kernel(const TensorMeta* __restrict__ tensors, const ChunkMeta* __restrict__ chunks,
                      float grad_scale, float beta1, float beta2, float eps, float step_size,
                      float bc2_sqrt, bool decoupled, const float* __restrict__ clip_sq,
                      float clip_max, GradReplicas reps) {
  // The deferred clip: clip_kernel's factor, applied (as there) only when it is < 1.
  float clip = 1.0f;
  bool clipping = false;
  if (clip_sq) {
    clip = clip_max / (sqrtf(*clip_sq) + 1e-6f);
    clipping = clip < 1.0f;
  }
  const ChunkMeta c = chunks[blockIdx.x];
  const TensorMeta t = tensors[c.tensor];
  const int64_t len = min(static_cast<int64_t>(kChunk), t.n - c.start);
  float* p = t.p + c.start;
  const float* g = t.g + c.start;
  float* m = t.m + c.start;
  float* v = t.v + c.start;
  // adam_kernel's arithmetic on the scaled gradient.
  const auto upd = [&](float& pi, float gi, float& mi, float& vi) {
    if (clipping) gi *= clip;
    gi *= grad_scale;
    if (decoupled)
      pi *= t.decay;
    else if (t.wd != 0.0f)
      gi += t.wd * pi;
    mi = beta1 * mi + (1.0f - beta1) * gi;
    vi = beta2 * vi + (1.0f - beta2) * gi * gi;
    const float denom = sqrtf(vi) / bc2_sqrt + eps;
    pi = pi - step_size * (mi / denom);
  };
  for_chunk(
      t, len, [&](int64_t i) { upd(p[i], replica_sum(g, i, reps), m[i], v[i]); },
      [&](int64_t k) {
        float4 P = reinterpret_cast<float4*>(p)[k], M = reinterpret_cast<float4*>(m)[k];
        float4 V = reinterpret_cast<float4*>(v)[k];
        const float4 G = replica_sum4(g, k, reps);
        upd(P.x, G.x, M.x, V.x);
        upd(P.y, G.y, M.y, V.y);
        upd(P.z, G.z, M.z, V.z);
        upd(P.w, G.w, M.w, V.w);
        reinterpret_cast<float4*>(p)[k] = P;
        reinterpret_cast<float4*>(m)[k] = M;
        reinterpret_cast<float4*>(v)[k] = V;
      });
}

// LAMB's raw update from the new moments, with explicitly rounded operations so that both passes
// get the same bits: u = (m/bc1) / (√v/√bc2 + eps) + wd·p (lamb_kernel's formula).
__device__ __forceinline__ float lamb_u(float mi, float vi, float pi, float wd, float bc1,
                                        float bc2_sqrt, float eps) {
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
  return __fmaf_rn(wd, pi, __fdiv_rn(__fdiv_rn(mi, bc1), denom));
}

// Sum over the block in a fixed order; the result is valid in thread 0.
__device__ double block_sum_d(double v, double* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  __syncthreads();  // scratch is free (an earlier call's reader is done)
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  double r = 0.0;
  if (threadIdx.x == 0)
    for (int w = 0; w < kOptBlock / 32; ++w) r += scratch[w];
  return r;
}

// Pass 1: moments, and the chunk's Σp² and Σu² into partials[chunk].
__global__ void __launch_bounds__(kOptBlock)
    multi_lamb_moments_kernel(const TensorMeta* __restrict__ tensors,
                              const ChunkMeta* __restrict__ chunks, double2* __restrict__ partials,
                              float grad_scale, float beta1, float beta2, float eps, float bc1,
                              float bc2_sqrt) {
  __shared__ double scratch[kOptBlock / 32];
  const ChunkMeta c = chunks[blockIdx.x];
  const TensorMeta t = tensors[c.tensor];
  const int64_t len = min(static_cast<int64_t>(kChunk), t.n - c.start);
  const float* p = t.p + c.start;
  const float* g = t.g + c.start;
  float* m = t.m + c.start;
  float* v = t.v + c.start;
  double sp = 0.0, su = 0.0;
  const auto upd = [&](float pi, float gi, float& mi, float& vi) {
    gi *= grad_scale;
    mi = beta1 * mi + (1.0f - beta1) * gi;
    vi = beta2 * vi + (1.0f - beta2) * gi * gi;
    const float u = lamb_u(mi, vi, pi, t.wd, bc1, bc2_sqrt, eps);
    sp += static_cast<double>(pi) * pi;
    su += static_cast<double>(u) * u;
  };
  for_chunk(
      t, len, [&](int64_t i) { upd(p[i], g[i], m[i], v[i]); },
      [&](int64_t k) {
        const float4 P = reinterpret_cast<const float4*>(p)[k];
        const float4 G = reinterpret_cast<const float4*>(g)[k];
        float4 M = reinterpret_cast<float4*>(m)[k], V = reinterpret_cast<float4*>(v)[k];
        upd(P.x, G.x, M.x, V.x);
        upd(P.y, G.y, M.y, V.y);
        upd(P.z, G.z, M.z, V.z);
        upd(P.w, G.w, M.w, V.w);
        reinterpret_cast<float4*>(m)[k] = M;
        reinterpret_cast<float4*>(v)[k] = V;
      });
  sp = block_sum_d(sp, scratch);
  su = block_sum_d(su, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = make_double2(sp, su);
}

// Pass 2: trust = ‖p‖/‖u‖ from the tensor's partials (first warp, fixed order), then
// p += α·u with α = −lr·trust rounded to float as Lamb::update's axpy, u recomputed from m, v.
__global__ void __launch_bounds__(kOptBlock)
    multi_lamb_apply_kernel(const TensorMeta* __restrict__ tensors,
                            const ChunkMeta* __restrict__ chunks,
                            const double2* __restrict__ partials, float lr, float eps, float bc1,
                            float bc2_sqrt) {
  __shared__ float alpha_shared;
  const ChunkMeta c = chunks[blockIdx.x];
  const TensorMeta t = tensors[c.tensor];
  if (threadIdx.x < 32) {
    double sp = 0.0, su = 0.0;
    for (int k = threadIdx.x; k < t.chunks; k += 32) {
      const double2 q = partials[t.first_chunk + k];
      sp += q.x;
      su += q.y;
    }
    for (int o = 16; o > 0; o >>= 1) {
      sp += __shfl_down_sync(0xffffffffu, sp, o);
      su += __shfl_down_sync(0xffffffffu, su, o);
    }
    if (threadIdx.x == 0) {
      double trust = 1.0;
      if (t.wd != 0.0f) {
        const double w_norm = sqrt(sp), u_norm = sqrt(su);
        if (w_norm > 0 && u_norm > 0) trust = w_norm / u_norm;
      }
      alpha_shared = static_cast<float>(-static_cast<double>(lr) * trust);
    }
  }
  __syncthreads();
  const float alpha = alpha_shared;
  const int64_t len = min(static_cast<int64_t>(kChunk), t.n - c.start);
  float* p = t.p + c.start;
  const float* m = t.m + c.start;
  const float* v = t.v + c.start;
  const auto upd = [&](float& pi, float mi, float vi) {
    pi = __fmaf_rn(alpha, lamb_u(mi, vi, pi, t.wd, bc1, bc2_sqrt, eps), pi);
  };
  for_chunk(
      t, len, [&](int64_t i) { upd(p[i], m[i], v[i]); },
      [&](int64_t k) {
        float4 P = reinterpret_cast<float4*>(p)[k];
        const float4 M = reinterpret_cast<const float4*>(m)[k];
        const float4 V = reinterpret_cast<const float4*>(v)[k];
        upd(P.x, M.x, V.x);
        upd(P.y, M.y, V.y);
        upd(P.z, M.z, V.z);
        upd(P.w, M.w, V.w);
        reinterpret_cast<float4*>(p)[k] = P;
      });
}

}  // namespace

void sgd_step(float* p, const float* grad, float* buf, int64_t n, float lr, float momentum,
              float dampening, float weight_decay, bool nesterov, bool first, void* stream) {
  if (n <= 0) return;
  sgd_kernel<<<grid_for(n), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
      p, grad, buf, n, lr, momentum, dampening, weight_decay, nesterov, first);
  CAI_CUDA_CHECK_LAUNCH();
}

void adam_step(float* p, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
               float beta2, float eps, float weight_decay, int64_t step, bool decoupled,
               void* stream) {
  if (n <= 0) return;
  // As the CPU: float pow of float step.
  const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(step));
  const float bc2_sqrt = std::sqrt(1.0f - std::pow(beta2, static_cast<float>(step)));
  const float step_size = lr / bc1;
  const float decay = 1.0f - lr * weight_decay;
  adam_kernel<<<grid_for(n), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
      p, grad, m, v, n, beta1, beta2, eps, weight_decay, decay, step_size, bc2_sqrt, decoupled);
  CAI_CUDA_CHECK_LAUNCH();
}

void lamb_update(const float* p, const float* grad, float* m, float* v, float* update, int64_t n,
                 float beta1, float beta2, float eps, float weight_decay, int64_t step,
                 void* stream) {
  if (n <= 0) return;
  const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(step));
  const float bc2 = 1.0f - std::pow(beta2, static_cast<float>(step));
  const float bc2_sqrt = std::sqrt(bc2);
  lamb_kernel<<<grid_for(n), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
      p, grad, m, v, update, n, beta1, beta2, eps, weight_decay, bc1, bc2_sqrt);
  CAI_CUDA_CHECK_LAUNCH();
}

void multi_tensor_adam(int count, float* const* p, const float* const* g, float* const* m,
                       float* const* v, const int64_t* n, const float* wd, float lr, float beta1,
                       float beta2, float eps, int64_t step, bool decoupled, float grad_scale,
                       void* stream, const float* clip_sq, float clip_max,
                       const GradReplicas* replicas) {
  CAI_CHECK(step >= 1, "[multi_tensor_adam] step {} must be at least 1", step);
  const GradReplicas reps = replicas_arg(replicas, "multi_tensor_adam");
  const cudaStream_t s = as_stream(stream);
  const MultiTensorTable table(count, p, g, m, v, n, wd, lr, false, s);
  if (table.chunks() == 0) return;
  // As adam_step.
  const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(step));
  const float bc2_sqrt = std::sqrt(1.0f - std::pow(beta2, static_cast<float>(step)));
  const float step_size = lr / bc1;
  multi_adam_kernel<<<table.chunks(), kOptBlock, 0, s>>>(
      table.tensors(), table.chunk_table(), grad_scale, beta1, beta2, eps, step_size, bc2_sqrt,
      decoupled, clip_sq, clip_max, reps);
  CAI_CUDA_CHECK_LAUNCH();
}

void multi_tensor_lamb(int count, float* const* p, const float* const* g, float* const* m,
                       float* const* v, const int64_t* n, const float* wd, float lr, float beta1,
                       float beta2, float eps, int64_t step, float grad_scale, void* stream) {
  CAI_CHECK(step >= 1, "[multi_tensor_lamb] step {} must be at least 1", step);
  const cudaStream_t s = as_stream(stream);
  const MultiTensorTable table(count, p, g, m, v, n, wd, lr, true, s);
  if (table.chunks() == 0) return;
  // As lamb_update.
  const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(step));
  const float bc2 = 1.0f - std::pow(beta2, static_cast<float>(step));
  const float bc2_sqrt = std::sqrt(bc2);
  multi_lamb_moments_kernel<<<table.chunks(), kOptBlock, 0, s>>>(
      table.tensors(), table.chunk_table(), table.partials(), grad_scale, beta1, beta2, eps, bc1,
      bc2_sqrt);
  CAI_CUDA_CHECK_LAUNCH();
  multi_lamb_apply_kernel<<<table.chunks(), kOptBlock, 0, s>>>(
      table.tensors(), table.chunk_table(), table.partials(), lr, eps, bc1, bc2_sqrt);
  CAI_CUDA_CHECK_LAUNCH();
}

}  // namespace cai::kernels::cuda
