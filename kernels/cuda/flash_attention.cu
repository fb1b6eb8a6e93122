// Fused (FlashAttention-2 style) bf16/fp16 attention from qkv[b, n, 3, h, hd] to out[b, n, h, hd]:
// no n×n matrix ever reaches global memory. Tensor cores through mma.sync m16n8k16 (fp32
// accumulators), operands from shared memory through ldmatrix, tiles loaded with cp.async
// (zero-filled past the last token and past hd, so tails need no special path).
//
// Forward, one CTA of 4 warps per (batch·head, block of 64 queries), each warp 16 query rows:
//   for each block of 64 keys: S = Q·Kᵀ (registers), online softmax in fp32 (base 2, running max
//   m and sum l), O = diag(α)·O + P·V with P reused from the S accumulators as the A operand.
//   out = O / l, lse = (m + log2 l)·ln 2 (natural log-sum-exp of the scaled scores).
// Backward, one CTA per (batch·head, block of 64 keys), each warp 16 keys, looping over blocks of
// 64 queries, with D = rowsum(dO ⊙ O) from a small kernel first:
//   Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ (per 16-query chunk), Pᵀ = exp(scale·Sᵀ − lse), dSᵀ = Pᵀ ⊙ (dPᵀ − D),
//   dV += Pᵀ·dO, dK += dSᵀ·Q (registers, fp32), dSᵀ to shared memory (t), then each warp takes 16
//   queries: dQ += dS·K, added with fp32 atomics into a scratch [b, n, h, hd] that a last kernel
//   scales and writes into dqkv. The softmax scale multiplies dK and dQ at the end.
// Measured (H200, bf16, b 256, n 197, h 12, hd 64): forward 0.31 ms (99 TFLOP/s), backward
// 1.05 ms (73 TFLOP/s at 2.5× the forward FLOPs); the cuBLAS path was 1.15 ms / 1.65 ms.
// hd is padded in shared memory to HDP ∈ {32, 64, 128} (zeros), so any multiple of 8 up to 128
// runs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/attention.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/device.h"

namespace cai::kernels::cuda {

namespace {

constexpr int kTile = 64;      // queries per forward CTA, keys per backward CTA, and inner blocks
constexpr int kThreads = 128;  // 4 warps of 16 rows
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global → shared; zero-filled (nothing read) when !valid.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// c += a·b for one 16×8×16 tile: a row-major 16×16, b col-major 16×8, c fp32.
template <typename T>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats as one 32-bit pair of t (the first in the low half).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t u) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&u));
  } else {
    return __half22float2(*reinterpret_cast<__half2*>(&u));
  }
}

// Rows [r0, r0 + 64) of a [rows, hd] matrix with row stride `stride` (elements) into a shared
// tile [64, HDP + 8]; rows ≥ rows and columns ≥ hd become zeros. Asynchronous (cp.async).
template <typename T, int HDP>
__device__ __forceinline__ void load_tile(T* s, const T* g, int64_t stride, int r0, int rows,
                                          int hd) {
  constexpr int kS = HDP + 8, kChunks = HDP / 8;
  for (int c = threadIdx.x; c < kTile * kChunks; c += kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool valid = r0 + r < rows && col < hd;
    cp_async16(s + r * kS + col, valid ? g + static_cast<int64_t>(r0 + r) * stride + col : g,
               valid);
  }
}

template <typename T, int HDP>
__global__ void __launch_bounds__(kThreads)
    flash_fwd_kernel(const T* __restrict__ qkv, T* __restrict__ out, float* __restrict__ lse, int n,
                     int h, int hd, int q_blocks, float scale_log2) {
  constexpr int kS = HDP + 8, kK = HDP / 16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + kTile * kS;
  T* sV = sK + kTile * kS;

  const int64_t bh = blockIdx.x / q_blocks;
  const int q0 = static_cast<int>(blockIdx.x % q_blocks) * kTile;
  const int64_t bi = bh / h, hi = bh % h;
  const int64_t stride = 3LL * h * hd;  // between tokens in qkv
  const T* Qg = qkv + bi * n * stride + hi * hd;
  const T* Kg = Qg + static_cast<int64_t>(h) * hd;
  const T* Vg = Kg + static_cast<int64_t>(h) * hd;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int wq0 = q0 + warp * 16;
  const bool active = wq0 < n;

  load_tile<T, HDP>(sQ, Qg, stride, q0, n, hd);

  uint32_t qf[kK][4];
  float o[HDP / 8][4];
#pragma unroll
  for (int i = 0; i < HDP / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

  for (int kb = 0; kb < n; kb += kTile) {
    load_tile<T, HDP>(sK, Kg, stride, kb, n, hd);
    load_tile<T, HDP>(sV, Vg, stride, kb, n, hd);
    cp_async_wait_all();
    __syncthreads();
    if (active) {
      if (kb == 0) {
#pragma unroll
        for (int kk = 0; kk < kK; ++kk)
          ldsm_x4(qf[kk], sQ + (warp * 16 + (lane & 15)) * kS + kk * 16 + (lane >> 4) * 8);
      }
      const int kvalid = min(kTile, n - kb);
      float s[8][4];
#pragma unroll
      for (int i = 0; i < 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
        // S = Q·Kᵀ: B[d][key] = K[key][d], K rows as ldmatrix rows (no transpose).
#pragma unroll
      for (int kc = 0; kc < 4; ++kc) {
        if (kc * 16 < kvalid) {
#pragma unroll
          for (int kk = 0; kk < kK; ++kk) {
            uint32_t b[4];
            ldsm_x4(b, sK + (kc * 16 + (lane & 7) + ((lane >> 4) << 3)) * kS + kk * 16 +
                           ((lane >> 3) & 1) * 8);
            mma<T>(s[2 * kc], qf[kk], b[0], b[1]);
            mma<T>(s[2 * kc + 1], qf[kk], b[2], b[3]);
          }
        }
      }
      // Online softmax (base 2) over this block; rows g and g + 8 of the warp.
      float mx[2] = {m_run[0], m_run[1]};
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = kb + nt * 8 + 2 * t4 + (e & 1);
          s[nt][e] = key < n ? s[nt][e] * scale_log2 : -INFINITY;
        }
        mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]));
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      }
      float alpha[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        alpha[r] = exp2f(m_run[r] - mx[r]);  // 0 on the first block (m_run = −∞)
        m_run[r] = mx[r];
        l_run[r] *= alpha[r];
      }
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        s[nt][0] = exp2f(s[nt][0] - mx[0]);
        s[nt][1] = exp2f(s[nt][1] - mx[0]);
        s[nt][2] = exp2f(s[nt][2] - mx[1]);
        s[nt][3] = exp2f(s[nt][3] - mx[1]);
        l_run[0] += s[nt][0] + s[nt][1];
        l_run[1] += s[nt][2] + s[nt][3];
      }
#pragma unroll
      for (int dt = 0; dt < HDP / 8; ++dt) {
        o[dt][0] *= alpha[0], o[dt][1] *= alpha[0];
        o[dt][2] *= alpha[1], o[dt][3] *= alpha[1];
      }
      // O += P·V: P from the S accumulators (C layout of two 8-key tiles = A layout of 16 keys);
      // B[key][d] = V[key][d] through a transposing ldmatrix.
#pragma unroll
      for (int kc = 0; kc < 4; ++kc) {
        if (kc * 16 < kvalid) {
          const uint32_t a[4] = {pack2<T>(s[2 * kc][0], s[2 * kc][1]),
                                 pack2<T>(s[2 * kc][2], s[2 * kc][3]),
                                 pack2<T>(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                                 pack2<T>(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
          for (int dp = 0; dp < HDP / 16; ++dp) {
            uint32_t b[4];
            ldsm_x4_t(b, sV + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kS + dp * 16 +
                             (lane >> 4) * 8);
            mma<T>(o[2 * dp], a, b[0], b[1]);
            mma<T>(o[2 * dp + 1], a, b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();  // before the next block overwrites sK / sV
  }
  if (!active) return;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  const float inv[2] = {1.0f / l_run[0], 1.0f / l_run[1]};
  const int row[2] = {wq0 + g, wq0 + g + 8};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= n) continue;
    T* orow = out + ((bi * n + row[r]) * h + hi) * hd;
#pragma unroll
    for (int dt = 0; dt < HDP / 8; ++dt) {
      const int d = dt * 8 + 2 * t4;
      if (d < hd)
        *reinterpret_cast<uint32_t*>(orow + d) =
            pack2<T>(o[dt][2 * r] * inv[r], o[dt][2 * r + 1] * inv[r]);
    }
    if (t4 == 0) lse[bh * n + row[r]] = (m_run[r] + log2f(l_run[r])) * kLn2;
  }
}

// D[b, h, i] = Σ_d dout·out over the row (b, i, h) of [b, n, h, hd]; one thread per row.
template <typename T>
__global__ void flash_bwd_dot_kernel(const T* __restrict__ out, const T* __restrict__ dout,
                                     float* __restrict__ D, int64_t rows, int n, int h, int hd) {
  CAI_GRID_STRIDE(r, rows) {
    const uint4* o = reinterpret_cast<const uint4*>(out + r * hd);
    const uint4* go = reinterpret_cast<const uint4*>(dout + r * hd);
    float s = 0.0f;
    for (int c = 0; c < hd / 8; ++c) {
      const uint4 a = o[c], b = go[c];
      const uint32_t av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 x = unpack2<T>(av[e]), y = unpack2<T>(bv[e]);
        s += x.x * y.x + x.y * y.y;
      }
    }
    const int64_t hi = r % h, tok = r / h, i = tok % n, bi = tok / n;
    D[(bi * h + hi) * n + i] = s;
  }
}

template <typename T, int HDP>
__global__ void __launch_bounds__(kThreads)
    flash_bwd_kernel(const T* __restrict__ qkv, const T* __restrict__ dout,
                     const float* __restrict__ lse, const float* __restrict__ Dsum,
                     float* __restrict__ dq_acc, T* __restrict__ dqkv, int n, int h, int hd,
                     int k_blocks, float scale, float scale_log2) {
  constexpr int kS = HDP + 8, kK = HDP / 16, kSD = kTile + 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);
  T* sV = sK + kTile * kS;
  T* sQ = sV + kTile * kS;
  T* sdO = sQ + kTile * kS;
  T* sdS = sdO + kTile * kS;  // dSᵀ [64 keys][64 queries + 8]
  float* sLse = reinterpret_cast<float*>(sdS + kTile * kSD);
  float* sD = sLse + kTile;

  const int64_t bh = blockIdx.x / k_blocks;
  const int kb = static_cast<int>(blockIdx.x % k_blocks) * kTile;
  const int64_t bi = bh / h, hi = bh % h;
  const int64_t stride = 3LL * h * hd, ostride = static_cast<int64_t>(h) * hd;
  const T* Qg = qkv + bi * n * stride + hi * hd;
  const T* Kg = Qg + static_cast<int64_t>(h) * hd;
  const T* Vg = Kg + static_cast<int64_t>(h) * hd;
  const T* dOg = dout + bi * n * ostride + hi * hd;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int kw0 = kb + warp * 16;
  const bool active_k = kw0 < n;

  load_tile<T, HDP>(sK, Kg, stride, kb, n, hd);
  load_tile<T, HDP>(sV, Vg, stride, kb, n, hd);

  uint32_t kf[kK][4], vf[kK][4];
  float dk[HDP / 8][4], dv[HDP / 8][4];
#pragma unroll
  for (int i = 0; i < HDP / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.0f;

  for (int q0 = 0; q0 < n; q0 += kTile) {
    load_tile<T, HDP>(sQ, Qg, stride, q0, n, hd);
    load_tile<T, HDP>(sdO, dOg, ostride, q0, n, hd);
    if (threadIdx.x < kTile) {
      const int i = q0 + threadIdx.x;
      sLse[threadIdx.x] = i < n ? lse[bh * n + i] * kLog2e : INFINITY;  // P = 0 past the end
      sD[threadIdx.x] = i < n ? Dsum[bh * n + i] : 0.0f;
    }
    cp_async_wait_all();
    __syncthreads();
    const int qvalid = min(kTile, n - q0);
    if (active_k) {
      if (q0 == 0) {
#pragma unroll
        for (int kk = 0; kk < kK; ++kk) {
          ldsm_x4(kf[kk], sK + (warp * 16 + (lane & 15)) * kS + kk * 16 + (lane >> 4) * 8);
          ldsm_x4(vf[kk], sV + (warp * 16 + (lane & 15)) * kS + kk * 16 + (lane >> 4) * 8);
        }
      }
#pragma unroll
      for (int qc = 0; qc < 4; ++qc) {
        if (qc * 16 >= qvalid) continue;
        float st[2][4] = {}, dpt[2][4] = {};
        // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ for 16 keys × 16 queries.
#pragma unroll
        for (int kk = 0; kk < kK; ++kk) {
          uint32_t b[4];
          const int off =
              (qc * 16 + (lane & 7) + ((lane >> 4) << 3)) * kS + kk * 16 + ((lane >> 3) & 1) * 8;
          ldsm_x4(b, sQ + off);
          mma<T>(st[0], kf[kk], b[0], b[1]);
          mma<T>(st[1], kf[kk], b[2], b[3]);
          ldsm_x4(b, sdO + off);
          mma<T>(dpt[0], vf[kk], b[0], b[1]);
          mma<T>(dpt[1], vf[kk], b[2], b[3]);
        }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int ql = qc * 16 + nt * 8 + 2 * t4 + (e & 1);
            const int key = kw0 + g + (e >> 1) * 8;
            const float p = key < n ? exp2f(st[nt][e] * scale_log2 - sLse[ql]) : 0.0f;
            st[nt][e] = p;
            dpt[nt][e] = p * (dpt[nt][e] - sD[ql]);
          }
        }
        const uint32_t pa[4] = {pack2<T>(st[0][0], st[0][1]), pack2<T>(st[0][2], st[0][3]),
                                pack2<T>(st[1][0], st[1][1]), pack2<T>(st[1][2], st[1][3])};
        const uint32_t da[4] = {pack2<T>(dpt[0][0], dpt[0][1]), pack2<T>(dpt[0][2], dpt[0][3]),
                                pack2<T>(dpt[1][0], dpt[1][1]), pack2<T>(dpt[1][2], dpt[1][3])};
        // dV += Pᵀ·dO, dK += dSᵀ·Q: B[query][d] through a transposing ldmatrix.
#pragma unroll
        for (int dp = 0; dp < HDP / 16; ++dp) {
          uint32_t b[4];
          const int off =
              (qc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kS + dp * 16 + (lane >> 4) * 8;
          ldsm_x4_t(b, sdO + off);
          mma<T>(dv[2 * dp], pa, b[0], b[1]);
          mma<T>(dv[2 * dp + 1], pa, b[2], b[3]);
          ldsm_x4_t(b, sQ + off);
          mma<T>(dk[2 * dp], da, b[0], b[1]);
          mma<T>(dk[2 * dp + 1], da, b[2], b[3]);
        }
        // dSᵀ for the dQ product below.
        T* ds_row = sdS + (warp * 16 + g) * kSD + qc * 16 + 2 * t4;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          *reinterpret_cast<uint32_t*>(ds_row + nt * 8) = da[2 * nt];
          *reinterpret_cast<uint32_t*>(ds_row + 8 * kSD + nt * 8) = da[2 * nt + 1];
        }
      }
    }
    __syncthreads();
    // dQ (16 queries of this warp) += dS·K over the block's valid keys.
    const int wq0 = q0 + warp * 16;
    if (wq0 < n) {
      float dq[HDP / 8][4];
#pragma unroll
      for (int i = 0; i < HDP / 8; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
#pragma unroll
      for (int kc = 0; kc < 4; ++kc) {
        if (kb + kc * 16 >= n) continue;
        uint32_t a[4];
        ldsm_x4_t(a, sdS + (kc * 16 + (lane & 7) + (lane >> 4) * 8) * kSD + warp * 16 +
                         ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int dp = 0; dp < HDP / 16; ++dp) {
          uint32_t b[4];
          ldsm_x4_t(b, sK + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kS + dp * 16 +
                           (lane >> 4) * 8);
          mma<T>(dq[2 * dp], a, b[0], b[1]);
          mma<T>(dq[2 * dp + 1], a, b[2], b[3]);
        }
      }
      const int row[2] = {wq0 + g, wq0 + g + 8};
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (row[r] >= n) continue;
        float* acc = dq_acc + ((bi * n + row[r]) * h + hi) * hd;
#pragma unroll
        for (int dt = 0; dt < HDP / 8; ++dt) {
          const int d = dt * 8 + 2 * t4;
          if (d < hd) {
            atomicAdd(acc + d, dq[dt][2 * r]);
            atomicAdd(acc + d + 1, dq[dt][2 * r + 1]);
          }
        }
      }
    }
    __syncthreads();  // before the next block overwrites sQ, sdO, sdS
  }
  if (!active_k) return;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = kw0 + g + 8 * r;
    if (key >= n) continue;
    T* dkr = dqkv + (bi * n + key) * stride + (h + hi) * hd;
    T* dvr = dkr + static_cast<int64_t>(h) * hd;
#pragma unroll
    for (int dt = 0; dt < HDP / 8; ++dt) {
      const int d = dt * 8 + 2 * t4;
      if (d < hd) {
        *reinterpret_cast<uint32_t*>(dkr + d) =
            pack2<T>(dk[dt][2 * r] * scale, dk[dt][2 * r + 1] * scale);
        *reinterpret_cast<uint32_t*>(dvr + d) = pack2<T>(dv[dt][2 * r], dv[dt][2 * r + 1]);
      }
    }
  }
}

// dqkv's q slot = scale · acc, acc [b, n, h, hd] fp32; 8 elements per thread.
template <typename T>
__global__ void flash_dq_kernel(const float* __restrict__ acc, T* __restrict__ dqkv, int64_t chunks,
                                int h, int hd, float scale) {
  const int per_row = hd / 8;
  CAI_GRID_STRIDE(c, chunks) {
    const int64_t r = c / per_row;  // (b·n + i)·h + hi
    const int d = static_cast<int>(c % per_row) * 8;
    const float4 x = reinterpret_cast<const float4*>(acc + r * hd + d)[0];
    const float4 y = reinterpret_cast<const float4*>(acc + r * hd + d)[1];
    uint4 v;
    v.x = pack2<T>(x.x * scale, x.y * scale);
    v.y = pack2<T>(x.z * scale, x.w * scale);
    v.z = pack2<T>(y.x * scale, y.y * scale);
    v.w = pack2<T>(y.z * scale, y.w * scale);
    const int64_t tok = r / h, hi = r % h;
    *reinterpret_cast<uint4*>(dqkv + tok * 3 * h * hd + hi * hd + d) = v;
  }
}

int padded_hd(int64_t hd) {
  return hd <= 32 ? 32 : hd <= 64 ? 64 : 128;
}

template <int HDP, typename T>
size_t fwd_smem() {
  return 3 * kTile * (HDP + 8) * sizeof(T);
}
template <int HDP, typename T>
size_t bwd_smem() {
  return (4 * kTile * (HDP + 8) + kTile * (kTile + 8)) * sizeof(T) + 2 * kTile * sizeof(float);
}

template <typename Kernel>
void allow_smem(Kernel k, size_t bytes) {
  if (bytes > 48 * 1024)
    CAI_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes)));
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

void check_args(const char* op, DT t, int64_t b, int64_t n, int64_t h, int64_t hd) {
  CAI_CHECK(flash_attention_supported(t, hd),
            "[{}] dtype {} with head dim {}: expected bf16 or f16 and hd a multiple of 8 in "
            "[8, 128]",
            op, dt_name(t), hd);
  CAI_CHECK(b >= 0 && n >= 0 && h >= 0, "[{}] b = {}, n = {}, h = {}: expected non-negative", op, b,
            n, h);
  CAI_CHECK(n <= INT_MAX && h <= INT_MAX / (3 * 128),
            "[{}] n = {} tokens or h = {} heads exceed the kernel's int sizes", op, n, h);
  const int64_t blocks = b * h * ((n + kTile - 1) / kTile);
  CAI_CHECK(blocks <= INT_MAX, "[{}] {} blocks of {} rows exceed the grid limit", op, blocks,
            kTile);
}

template <typename T, int HDP>
void fwd_launch(const void* qkv, void* out, float* lse, int64_t b, int64_t n, int64_t h, int64_t hd,
                cudaStream_t s) {
  const int q_blocks = static_cast<int>((n + kTile - 1) / kTile);
  const size_t smem = fwd_smem<HDP, T>();
  auto kernel = flash_fwd_kernel<T, HDP>;
  allow_smem(kernel, smem);
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(hd));
  kernel<<<static_cast<unsigned>(b * h * q_blocks), kThreads, smem, s>>>(
      static_cast<const T*>(qkv), static_cast<T*>(out), lse, static_cast<int>(n),
      static_cast<int>(h), static_cast<int>(hd), q_blocks, scale_log2);
  CAI_CUDA_CHECK_LAUNCH();
}

// Device scratch from the caching allocator, released at scope exit (the legacy pattern of the
// other kernels: the pool hands a block out again only to work ordered after it on the stream).
struct Scratch {
  void* p = nullptr;
  int device = 0;
  explicit Scratch(size_t bytes) {
    CAI_CUDA_CHECK(cudaGetDevice(&device));
    p = alloc(bytes, device);
  }
  ~Scratch() { free(p, device); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
};

template <typename T, int HDP>
void bwd_launch(const void* qkv, const void* out, const float* lse, const void* dout, void* dqkv,
                int64_t b, int64_t n, int64_t h, int64_t hd, cudaStream_t s) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t rows = b * n * h;
  Scratch dsum(sizeof(float) * rows), acc(sizeof(float) * rows * hd);
  float* D = static_cast<float*>(dsum.p);
  float* dq = static_cast<float*>(acc.p);
  CAI_CUDA_CHECK(cudaMemsetAsync(dq, 0, sizeof(float) * rows * hd, s));
  flash_bwd_dot_kernel<T><<<grid_for(rows), kBlock, 0, s>>>(
      static_cast<const T*>(out), static_cast<const T*>(dout), D, rows, static_cast<int>(n),
      static_cast<int>(h), static_cast<int>(hd));
  CAI_CUDA_CHECK_LAUNCH();
  const int k_blocks = static_cast<int>((n + kTile - 1) / kTile);
  const size_t smem = bwd_smem<HDP, T>();
  auto kernel = flash_bwd_kernel<T, HDP>;
  allow_smem(kernel, smem);
  kernel<<<static_cast<unsigned>(b * h * k_blocks), kThreads, smem, s>>>(
      static_cast<const T*>(qkv), static_cast<const T*>(dout), lse, D, dq, static_cast<T*>(dqkv),
      static_cast<int>(n), static_cast<int>(h), static_cast<int>(hd), k_blocks, scale,
      scale * kLog2e);
  CAI_CUDA_CHECK_LAUNCH();
  const int64_t chunks = rows * hd / 8;
  flash_dq_kernel<T><<<grid_for(chunks), kBlock, 0, s>>>(
      dq, static_cast<T*>(dqkv), chunks, static_cast<int>(h), static_cast<int>(hd), scale);
  CAI_CUDA_CHECK_LAUNCH();
}

template <typename T>
void fwd_dispatch(const void* qkv, void* out, float* lse, int64_t b, int64_t n, int64_t h,
                  int64_t hd, cudaStream_t s) {
  switch (padded_hd(hd)) {
    case 32:
      return fwd_launch<T, 32>(qkv, out, lse, b, n, h, hd, s);
    case 64:
      return fwd_launch<T, 64>(qkv, out, lse, b, n, h, hd, s);
    default:
      return fwd_launch<T, 128>(qkv, out, lse, b, n, h, hd, s);
  }
}

template <typename T>
void bwd_dispatch(const void* qkv, const void* out, const float* lse, const void* dout, void* dqkv,
                  int64_t b, int64_t n, int64_t h, int64_t hd, cudaStream_t s) {
  switch (padded_hd(hd)) {
    case 32:
      return bwd_launch<T, 32>(qkv, out, lse, dout, dqkv, b, n, h, hd, s);
    case 64:
      return bwd_launch<T, 64>(qkv, out, lse, dout, dqkv, b, n, h, hd, s);
    default:
      return bwd_launch<T, 128>(qkv, out, lse, dout, dqkv, b, n, h, hd, s);
  }
}

}  // namespace

bool flash_attention_supported(DT t, int64_t hd) {
  return (t == DT::BF16 || t == DT::F16) && hd >= 8 && hd <= 128 && hd % 8 == 0;
}

void flash_attention_fwd_t(DT t, const void* qkv, void* out, float* lse, int64_t b, int64_t n,
                           int64_t h, int64_t hd, void* stream) {
  check_args("flash_attention_fwd", t, b, n, h, hd);
  if (b == 0 || n == 0 || h == 0) return;
  CAI_CHECK(aligned16(qkv) && aligned16(out),
            "[flash_attention_fwd] qkv {} and out {}: expected 16-byte aligned addresses", qkv,
            out);
  const cudaStream_t s = as_stream(stream);
  if (t == DT::BF16)
    fwd_dispatch<__nv_bfloat16>(qkv, out, lse, b, n, h, hd, s);
  else
    fwd_dispatch<__half>(qkv, out, lse, b, n, h, hd, s);
}

void flash_attention_bwd_t(DT t, const void* qkv, const void* out, const float* lse,
                           const void* dout, void* dqkv, int64_t b, int64_t n, int64_t h,
                           int64_t hd, void* stream) {
  check_args("flash_attention_bwd", t, b, n, h, hd);
  if (b == 0 || n == 0 || h == 0) return;
  CAI_CHECK(aligned16(qkv) && aligned16(out) && aligned16(dout) && aligned16(dqkv),
            "[flash_attention_bwd] qkv {}, out {}, dout {}, dqkv {}: expected 16-byte aligned "
            "addresses",
            qkv, out, dout, dqkv);
  const cudaStream_t s = as_stream(stream);
  if (t == DT::BF16)
    bwd_dispatch<__nv_bfloat16>(qkv, out, lse, dout, dqkv, b, n, h, hd, s);
  else
    bwd_dispatch<__half>(qkv, out, lse, dout, dqkv, b, n, h, hd, s);
}

}  // namespace cai::kernels::cuda
