// Fused (FlashAttention-2 style) bf16/fp16 attention from qkv[b, n, 3, h, hd] to out[b, n, h, hd]:
// the forward keeps no n×n matrix (the backward writes dSᵀ once, below). Tensor cores through
// mma.sync m16n8k16 (fp32 accumulators), operands from shared memory through ldmatrix, tiles loaded
// with cp.async (zero-filled past the last token and past hd, so tails need no special path).
//
// Forward, one CTA of up to 8 warps per (batch·head, block of queries), each warp 16 query rows
// (the warps per CTA chosen so a head's row tiles split evenly: n = 197 gives two CTAs of 7
// warps, so K and V are read twice per head, not four times): for each block of 64 keys (K, V
// in three cp.async stages, one barrier per block): S = Q·Kᵀ (registers), online softmax in fp32
// (base 2, running max m and sum l), O = diag(α)·O + P·V with P reused from the S accumulators as
// the A operand.
//   out = O / l, lse = (m + log2 l)·ln 2 (natural log-sum-exp of the scaled scores).
// Backward in three kernels, no atomics:
//   1. D = rowsum(dO ⊙ O) [b, h, n], 8 or 16 lanes per (token, head) (with the qkv bias
//      gradient asked: dO's column sums too, from the same reads).
//   2. dK, dV, one CTA per (batch·head, block of 64 keys), each warp 16 keys, over blocks of 64
//      queries (Q, dO, lse, D in three stages): Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, Pᵀ = exp(scale·Sᵀ − lse),
//      dSᵀ = Pᵀ ⊙ (dPᵀ − D), dV += Pᵀ·dO, dK += dSᵀ·Q (registers, fp32); scale·dK and dV written
//      into dqkv, and dSᵀ (rounded to the input type, as the products take it) into a scratch
//      [b·h, n, n rounded up to 8].
//   3. dQ = scale·dS·K from that scratch, one CTA per (batch·head, block of 64 queries).
//   S and dP are computed once (5 GEMM passes). The earlier dQ kernel recomputed them (7 passes;
//   0.445 ms of the ViT-B/16 layer's 0.948 ms on an H100); dSᵀ costs 242 MB of scratch per
//   ViT-B/16 layer at batch 256 and one write and read of it.
// Measured (H200, bf16, b 256, n 197, h 12, hd 64) before the forward's block resizing and the
// dSᵀ backward: forward 0.31 ms (99 TFLOP/s), backward 0.905 ms; the cuBLAS path was 1.15 ms /
// 1.65 ms. On an H100 (same shape, Nsight Compute): the forward and dK/dV kernels stalled on the
// MMA accumulator chains ("wait") and on barriers, not on memory (long-scoreboard stalls were a
// tenth of the total, DRAM 25-35% busy): whole tiles run without the per-chunk checks, 2^x is the
// bare MUFU instruction, and three load stages drop one barrier per block. Forward 0.311 → 0.239
// ms, backward (D, dK/dV, dQ) 0.776 → 0.727 ms, outputs bit-identical.
// hd is padded in shared memory to HDP ∈ {32, 64, 128} (zeros), so any multiple of 8 up to 128
// runs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <type_traits>
#include <utility>

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

// acc (HDP / 8 tiles of 16 × 8) += a (16 × 16) · rows[16][HDP]: the 16 rows row-major in shared
// memory `ld` elements apart, read transposed into mma's column-major B by ldmatrix.
template <typename T, int HDP>
__device__ __forceinline__ void mma_rows(float (&acc)[HDP / 8][4], const uint32_t (&a)[4],
                                         const T* rows, int ld, int lane) {
#pragma unroll
  for (int dp = 0; dp < HDP / 16; ++dp) {
    uint32_t b[4];
    ldsm_x4_t(b, rows + ((lane & 7) + ((lane >> 3) & 1) * 8) * ld + dp * 16 + (lane >> 4) * 8);
    mma<T>(acc[2 * dp], a, b[0], b[1]);
    mma<T>(acc[2 * dp + 1], a, b[2], b[3]);
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

// f(std::true_type) for a whole tile of 64 (no per-chunk or per-key checks), else
// f(std::false_type): the tile bodies take the tag as a compile-time constant.
template <typename F>
__device__ __forceinline__ void whole_or_tail(bool whole, F&& f) {
  if (whole)
    f(std::true_type{});
  else
    f(std::false_type{});
}

// The qkv bias gradient from the backward (flash_attention_bwd_t's dbias), without the qkv
// linear's own column sum over dqkv (91 us a ViT-B/16 layer at batch 256 on an H100):
//   q: Σ_rows dQ, as stored (rounded to T): each dQ CTA sums the rows it writes into one partial
//      row [hd] of a scratch, flash_bwd_bias_finish_kernel adds the partials in a fixed order;
//   k: 0. Adding b_k to every key adds q·b_k to a whole row of scores, which the softmax ignores:
//      Σ_keys dK = scale·Σ_q (Σ_k dS[q, k])·Q[q] with Σ_k dS[q, k] = Σ_k P·dP − D·Σ_k P = 0.
//      (Summing the stored dK gives rounding noise around 0.)
//   v: Σ_rows dO. O = P·(V + 1·b_vᵀ) = P·V + b_vᵀ (P's rows sum to 1; this kernel has no
//      attention dropout), so Σ_keys dV = Σ_q dO[q]: the column sum of dout [b·n, h·hd], a third
//      of dqkv's bytes, summed by the D kernel, which reads dout anyway.
// (Measured on an H100 before these identities: partial sums in the dK/dV kernel's epilogue cost
// it 8% (540 → 583 us a layer) and gave the step nothing.)
//
// A warp's share of dQ's column sums: acc holds its 16 rows × HDP columns in mma's C layout (row
// g: e = 0, 1; row g + 8: e = 2, 3; columns dt·8 + 2·t4 + (e & 1)), stored as pack2(acc · scale);
// row0 / row1 say whether the thread's two rows exist. Sums over the warp's rows (shuffles over
// g) into red[warp][HDP] (shared).
template <typename T, int HDP>
__device__ __forceinline__ void warp_column_sums(const float (&acc)[HDP / 8][4], float scale,
                                                 bool row0, bool row1, float* red) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t4 = lane & 3;
#pragma unroll
  for (int dt = 0; dt < HDP / 8; ++dt) {
    const float2 v0 = unpack2<T>(pack2<T>(acc[dt][0] * scale, acc[dt][1] * scale));
    const float2 v1 = unpack2<T>(pack2<T>(acc[dt][2] * scale, acc[dt][3] * scale));
    float s0 = (row0 ? v0.x : 0.0f) + (row1 ? v1.x : 0.0f);
    float s1 = (row0 ? v0.y : 0.0f) + (row1 ? v1.y : 0.0f);
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
      s0 += __shfl_xor_sync(0xffffffffu, s0, o);
      s1 += __shfl_xor_sync(0xffffffffu, s1, o);
    }
    if (lane < 4) {
      red[warp * HDP + dt * 8 + 2 * t4] = s0;
      red[warp * HDP + dt * 8 + 2 * t4 + 1] = s1;
    }
  }
}
// The CTA's partial row: out[d] = Σ_warps red[w][d] in warp order (after a barrier that follows
// every warp's warp_column_sums).
template <int HDP>
__device__ __forceinline__ void block_column_sums(const float* red, float* out, int hd) {
  const int nwarps = static_cast<int>(blockDim.x >> 5);
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float s = 0.0f;
    for (int w = 0; w < nwarps; ++w) s += red[w * HDP + d];
    out[d] = s;
  }
}

// One bias's partial sums: part[((bi·h + hi)·blocks + blk)·hd + d] for bi < b, blk < blocks.
struct BiasPartials {
  const float* part;
  float* dbias;
  int64_t b, blocks;
};
// dbias[hi·hd + d] += Σ over (batch, block) of part[((bi·h + hi)·blocks + blk)·hd + d], for q's
// partials (blockIdx.y 0) and v's (1): a block of 32 columns × 32 lanes, lane y adding chunks y,
// y + 32, ... (chunk = bi·blocks + blk) in double, kBatch loads in flight, then the lanes in order.
__global__ void __launch_bounds__(1024)
    flash_bwd_bias_finish_kernel(BiasPartials q, BiasPartials v, int64_t h, int64_t hd) {
  constexpr int kBatch = 8;
  __shared__ double sums[32][33];
  const float* __restrict__ part = blockIdx.y ? v.part : q.part;
  float* __restrict__ dbias = blockIdx.y ? v.dbias : q.dbias;
  const int64_t b = blockIdx.y ? v.b : q.b, blocks = blockIdx.y ? v.blocks : q.blocks;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;  // hi·hd + d
  const int64_t chunks = b * blocks;
  double acc = 0.0;
  if (j < h * hd) {
    const int64_t hi = j / hd, d = j % hd;
    for (int64_t c0 = threadIdx.y; c0 < chunks; c0 += 32 * kBatch) {
      float v[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int64_t c = c0 + 32 * u, bi = c / blocks;
        v[u] = c < chunks ? part[((bi * h + hi) * blocks + (c - bi * blocks)) * hd + d] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) acc += static_cast<double>(v[u]);
    }
  }
  sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && j < h * hd) {
    double total = 0.0;
    for (int y = 0; y < 32; ++y) total += sums[y][threadIdx.x];
    dbias[j] += static_cast<float>(total);
  }
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Rows [r0, r0 + count) of a [rows, hd] matrix with row stride `stride` (elements) into a shared
// tile [count, HDP + 8] with all the block's threads; rows ≥ rows and columns ≥ hd become zeros.
// Asynchronous (cp.async).
template <typename T, int HDP>
__device__ __forceinline__ void load_rows(T* s, const T* g, int64_t stride, int r0, int rows,
                                          int hd, int count) {
  constexpr int kS = HDP + 8, kChunks = HDP / 8;
  for (int c = threadIdx.x; c < count * kChunks; c += blockDim.x) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool valid = r0 + r < rows && col < hd;
    cp_async16(s + r * kS + col, valid ? g + static_cast<int64_t>(r0 + r) * stride + col : g,
               valid);
  }
}
// A [64, HDP + 8] tile: rows [r0, r0 + 64).
template <typename T, int HDP>
__device__ __forceinline__ void load_tile(T* s, const T* g, int64_t stride, int r0, int rows,
                                          int hd) {
  load_rows<T, HDP>(s, g, stride, r0, rows, hd, kTile);
}

// Forward: a block of blockDim.x / 32 warps takes 16 query rows per warp (fwd_warps picks the
// count so the row tiles of a head split evenly over its blocks: fewer blocks re-read K and V),
// with K and V in three cp.async stages.
constexpr int kFwdMaxWarps = 8;

// 2^x as the MUFU instruction alone (flush-to-zero): exp2f adds a denormal path, which these
// arguments (≤ 0 after the max is subtracted) never need; the ViT-B/16 outputs are bit-identical
// (with the full-tile paths below the forward went 0.31 → 0.25 ms on an H100).
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
template <typename T, int HDP>
__global__ void __launch_bounds__(kFwdMaxWarps * 32, HDP > 64 ? 1 : 2)
    flash_fwd_kernel(const T* __restrict__ qkv, T* __restrict__ out, float* __restrict__ lse, int n,
                     int h, int hd, int q_blocks, float scale_log2) {
  constexpr int kS = HDP + 8, kK = HDP / 16, kT = kTile * kS;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int warps = static_cast<int>(blockDim.x >> 5), qrows = warps * 16;
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sKV = sQ + qrows * kS;  // stage s: K at sKV + 2·s·kT, V after it

  const int64_t bh = blockIdx.x / q_blocks;
  const int q0 = static_cast<int>(blockIdx.x % q_blocks) * qrows;
  const int64_t bi = bh / h, hi = bh % h;
  const int64_t stride = 3LL * h * hd;  // between tokens in qkv
  const T* Qg = qkv + bi * n * stride + hi * hd;
  const T* Kg = Qg + static_cast<int64_t>(h) * hd;
  const T* Vg = Kg + static_cast<int64_t>(h) * hd;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int wq0 = q0 + warp * 16;
  const bool active = wq0 < n;

  load_rows<T, HDP>(sQ, Qg, stride, q0, n, hd, qrows);
  load_tile<T, HDP>(sKV, Kg, stride, 0, n, hd);
  load_tile<T, HDP>(sKV + kT, Vg, stride, 0, n, hd);
  cp_async_commit();
  const int nk = (n + kTile - 1) / kTile;
  if (nk > 1) {
    load_tile<T, HDP>(sKV + 2 * kT, Kg, stride, kTile, n, hd);
    load_tile<T, HDP>(sKV + 3 * kT, Vg, stride, kTile, n, hd);
  }
  cp_async_commit();

  uint32_t qf[kK][4];
  float o[HDP / 8][4];
#pragma unroll
  for (int i = 0; i < HDP / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

  for (int it = 0; it < nk; ++it) {
    const int kb = it * kTile;
    cp_async_wait_group<1>();
    __syncthreads();  // tile it visible; every warp is past tile it − 1, whose stage is reloaded
    if (it + 2 < nk) {
      T* nxt = sKV + 2 * ((it + 2) % 3) * kT;
      load_tile<T, HDP>(nxt, Kg, stride, kb + 2 * kTile, n, hd);
      load_tile<T, HDP>(nxt + kT, Vg, stride, kb + 2 * kTile, n, hd);
    }
    cp_async_commit();
    const T* sK = sKV + 2 * (it % 3) * kT;
    const T* sV = sK + kT;
    if (active) {
      if (it == 0) {
#pragma unroll
        for (int kk = 0; kk < kK; ++kk)
          ldsm_x4(qf[kk], sQ + (warp * 16 + (lane & 15)) * kS + kk * 16 + (lane >> 4) * 8);
      }
      const int kvalid = min(kTile, n - kb);
      // A whole tile of keys (all but a head's last) runs without the per-chunk and per-key
      // checks, so the compiler schedules its 16 independent MMA chains freely (the checks split
      // them into blocks of 2 and stalled on the accumulator dependencies).
      auto tile = [&](auto full_tag) {
        constexpr bool kFull = decltype(full_tag)::value;
        float s[8][4];
#pragma unroll
        for (int i = 0; i < 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
          // S = Q·Kᵀ: B[d][key] = K[key][d], K rows as ldmatrix rows (no transpose).
#pragma unroll
        for (int kc = 0; kc < 4; ++kc) {
          if (kFull || kc * 16 < kvalid) {
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
            s[nt][e] = (kFull || key < n) ? s[nt][e] * scale_log2 : -INFINITY;
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
          alpha[r] = ex2(m_run[r] - mx[r]);  // 0 on the first block (m_run = −∞)
          m_run[r] = mx[r];
          l_run[r] *= alpha[r];
        }
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          s[nt][0] = ex2(s[nt][0] - mx[0]);
          s[nt][1] = ex2(s[nt][1] - mx[0]);
          s[nt][2] = ex2(s[nt][2] - mx[1]);
          s[nt][3] = ex2(s[nt][3] - mx[1]);
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
          if (kFull || kc * 16 < kvalid) {
            const uint32_t a[4] = {pack2<T>(s[2 * kc][0], s[2 * kc][1]),
                                   pack2<T>(s[2 * kc][2], s[2 * kc][3]),
                                   pack2<T>(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                                   pack2<T>(s[2 * kc + 1][2], s[2 * kc + 1][3])};
            mma_rows<T, HDP>(o, a, sV + kc * 16 * kS, kS, lane);
          }
        }
      };
      whole_or_tail(kvalid == kTile, tile);
    }
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

// D[bh, q] = Σ_d dO ⊙ O over a head's row (out and dout [b, n, h, hd], hd a multiple of 8):
// L = 8 lanes per (token, head) row for hd ≤ 64, else 16, each adding one 16-byte chunk (hd ≤
// 128), so a warp reads whole rows (coalesced); the lanes are added by shuffles. A thread takes
// kBatch rows a grid step apart at a time, their loads issued together.
// With kSums, v's bias gradient (Σ_rows dout, see flash_bwd_bias_finish_kernel) comes from the
// same reads: the grid steps over rows by a multiple of h (d_sums_grid), so each thread's rows
// share one head and its lane's 8 columns, summed in registers; at the end the block adds its
// threads' sums per column (in row order) into one partial row [h·hd] of `part` ([h][blocks][hd],
// zeros for heads the block has no row of), and the finish kernel adds the partials in order.
// ViT-B/16 at batch 256 on an H100, a layer: this kernel 60.0 → 65.7 us and the finish 8.2 →
// 11.1 us (q and v in one launch), against dout's own column sum and its finish (32.7 + 4.5 us)
// gone: 105 → 77 us. (One block per 32 rows and no loop was 60 us without the sums; the sums
// need a thread's rows to share a head, hence the loop over one wave of blocks.)
template <typename T, int L, bool kSums>
__global__ void __launch_bounds__(kBlock)
    flash_bwd_d_kernel(const T* __restrict__ out, const T* __restrict__ dout,
                       float* __restrict__ Dsum, int64_t rows, int n, int h, int hd,
                       float* __restrict__ part) {
  constexpr int R = kBlock / L, kBatch = 2;  // rows per block and grid step; rows in flight
  const int lane = threadIdx.x % L, c = lane * 8;
  // The warp's first row (its lanes run the same iterations: the shuffles need them all) and the
  // thread's place among the warp's 32 / L rows.
  const int64_t warp_first = static_cast<int64_t>(blockIdx.x) * R + threadIdx.x / 32 * (32 / L);
  const int sub = threadIdx.x % 32 / L;
  const int64_t step = static_cast<int64_t>(gridDim.x) * R;
  float col[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i0 = warp_first; i0 < rows; i0 += kBatch * step) {
    const int64_t i0t = i0 + sub;  // this thread's row in the batch's first step
    uint4 ov[kBatch], dv[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t i = i0t + u * step;
      if (i < rows && c < hd) {
        ov[u] = *reinterpret_cast<const uint4*>(out + i * hd + c);
        dv[u] = *reinterpret_cast<const uint4*>(dout + i * hd + c);
      } else {
        ov[u] = dv[u] = make_uint4(0, 0, 0, 0);  // zeros of T: adds nothing
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t i = i0t + u * step;
      const uint32_t ow[4] = {ov[u].x, ov[u].y, ov[u].z, ov[u].w};
      const uint32_t dw[4] = {dv[u].x, dv[u].y, dv[u].z, dv[u].w};
      float acc = 0.0f;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 x = unpack2<T>(ow[k]), y = unpack2<T>(dw[k]);
        acc += x.x * y.x + x.y * y.y;
        if constexpr (kSums) col[2 * k] += y.x, col[2 * k + 1] += y.y;
      }
#pragma unroll
      for (int o = L / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o, L);
      if (lane == 0 && i < rows) {
        const int64_t hi = i % h, tok = i / h, q = tok % n, bi = tok / n;
        Dsum[(bi * h + hi) * n + q] = acc;
      }
    }
  }
  if constexpr (kSums) {
    __shared__ float red[kBlock * 8];  // thread t's 8 columns at red[8·t]
#pragma unroll
    for (int k = 0; k < 8; ++k) red[threadIdx.x * 8 + k] = col[k];
    __syncthreads();
    // Row r0 + s of every step has head (r0 + s) % h (the step is a multiple of h).
    const int64_t r0 = static_cast<int64_t>(blockIdx.x) * R;
    const int shift = static_cast<int>(r0 % h);
    for (int j = threadIdx.x; j < h * hd; j += blockDim.x) {
      const int hi = j / hd, d = j % hd;
      float s = 0.0f;
      for (int sb = (hi - shift + h) % h; sb < R; sb += h) s += red[(sb * L + d / 8) * 8 + d % 8];
      part[(static_cast<int64_t>(hi) * gridDim.x + blockIdx.x) * hd + d] = s;
    }
  }
}

// The D kernel's grid with v's column sums: one wave (the blocks resident at once on the device,
// so no block waits for a slot while the others idle at the end), rounded down so a step of
// grid·r rows is a multiple of h. Each block adds one partial row for the finish.
template <typename K>
unsigned d_sums_grid(K kernel, int64_t rows, int64_t h, int r) {
  const int64_t m = h / std::gcd(h, static_cast<int64_t>(r));
  const int64_t g = std::min<int64_t>((rows + r - 1) / r, resident_blocks(kernel, kBlock));
  return static_cast<unsigned>(std::max<int64_t>(g / m * m, m));
}

// dQ = scale · dS·K from the dSᵀ the dK/dV kernel wrote ([b·h, n keys, ld queries], rounded to
// T): one CTA per (batch·head, block of 64 queries), each warp 16 queries, over blocks of 64 keys
// (dSᵀ and K double-buffered through cp.async); dS as the A operand through a transposing
// ldmatrix of dSᵀ, K as B. Written straight into dqkv's q slot.
template <typename T, int HDP>
__global__ void __launch_bounds__(kFwdMaxWarps * 32)
    flash_bwd_dq_kernel(const T* __restrict__ qkv, const T* __restrict__ dst, int ld,
                        T* __restrict__ dqkv, int n, int h, int hd, int q_blocks, float scale,
                        float* __restrict__ bias_part) {
  constexpr int kS = HDP + 8, kT = kTile * kS;  // K tiles [64][HDP + 8]
  // As the forward: blockDim.x / 32 warps of 16 queries (fwd_warps), dSᵀ tiles [64 keys][qrows
  // + 8 queries].
  const int qrows = static_cast<int>(blockDim.x >> 5) * 16, kA = qrows + 8, kAT = kTile * kA;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sA = reinterpret_cast<T*>(smem_raw);  // stage s at sA + s·kAT
  T* sK = sA + 2 * kAT;                    // stage s at sK + s·kT

  const int64_t bh = blockIdx.x / q_blocks;
  const int q0 = static_cast<int>(blockIdx.x % q_blocks) * qrows;
  const int64_t bi = bh / h, hi = bh % h;
  const int64_t stride = 3LL * h * hd;
  const T* Kg = qkv + bi * n * stride + (h + hi) * hd;
  const T* Ag = dst + bh * n * static_cast<int64_t>(ld);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int wq0 = q0 + warp * 16;
  const bool active = wq0 < n;

  // Keys [k0, k0 + 64) × queries [q0, q0 + qrows) of dSᵀ into a stage (zeros past n keys and
  // past ld queries; ld is a multiple of 8, so a chunk of 8 is wholly inside or outside).
  auto load_a = [&](T* sa, int k0) {
    const int chunks = qrows / 8;
    for (int c = threadIdx.x; c < kTile * chunks; c += blockDim.x) {
      const int r = c / chunks, col = (c % chunks) * 8;
      const bool valid = k0 + r < n && q0 + col < ld;
      cp_async16(sa + r * kA + col, valid ? Ag + static_cast<int64_t>(k0 + r) * ld + q0 + col : Ag,
                 valid);
    }
  };
  load_a(sA, 0);
  load_tile<T, HDP>(sK, Kg, stride, 0, n, hd);
  cp_async_commit();

  float dq[HDP / 8][4];
#pragma unroll
  for (int i = 0; i < HDP / 8; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
  const int nk = (n + kTile - 1) / kTile;
  for (int it = 0; it < nk; ++it) {
    const int kb = it * kTile;
    if (it + 1 < nk) {
      load_a(sA + ((it + 1) & 1) * kAT, kb + kTile);
      load_tile<T, HDP>(sK + ((it + 1) & 1) * kT, Kg, stride, kb + kTile, n, hd);
    }
    cp_async_commit();
    cp_async_wait_group<1>();
    __syncthreads();
    const T* a_s = sA + (it & 1) * kAT;
    const T* k_s = sK + (it & 1) * kT;
    if (active) {
      const int kvalid = min(kTile, n - kb);
      auto block = [&](auto full_tag) {  // as the forward: whole tiles without checks
        constexpr bool kFull = decltype(full_tag)::value;
#pragma unroll
        for (int kc = 0; kc < 4; ++kc) {
          if (kFull || kc * 16 < kvalid) {
            // A = dS[q][k] (16 queries × 16 keys) from dSᵀ[k][q]: matrices (q 0-7, k 0-7),
            // (q 8-15, k 0-7), (q 0-7, k 8-15), (q 8-15, k 8-15), each read transposed.
            uint32_t a[4];
            ldsm_x4_t(a, a_s + (kc * 16 + (lane & 7) + ((lane >> 4) << 3)) * kA + warp * 16 +
                             ((lane >> 3) & 1) * 8);
            mma_rows<T, HDP>(dq, a, k_s + kc * 16 * kS, kS, lane);
          }
        }
      };
      whole_or_tail(kvalid == kTile, block);
    }
    __syncthreads();  // before the next iteration's loads overwrite this stage
  }
  if (bias_part) {  // every stage is read (the barrier above): the tiles' memory takes the sums
    float* red = reinterpret_cast<float*>(smem_raw);
    warp_column_sums<T, HDP>(dq, scale, active && wq0 + g < n, active && wq0 + g + 8 < n, red);
    __syncthreads();
    block_column_sums<HDP>(red, bias_part + static_cast<int64_t>(blockIdx.x) * hd, hd);
  }
  if (!active) return;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = wq0 + g + 8 * r;
    if (row >= n) continue;
    T* dqr = dqkv + (bi * n + row) * stride + hi * hd;
#pragma unroll
    for (int dt = 0; dt < HDP / 8; ++dt) {
      const int d = dt * 8 + 2 * t4;
      if (d < hd)
        *reinterpret_cast<uint32_t*>(dqr + d) =
            pack2<T>(dq[dt][2 * r] * scale, dq[dt][2 * r + 1] * scale);
    }
  }
}

// dK and dV only (no dQ, no atomics), one CTA per (batch·head, block of 64 keys), each warp 16
// keys, looping over query blocks with Q, dO, lse and D in three stages (one barrier per block).
template <typename T, int HDP, int MINB>
__global__ void __launch_bounds__(kThreads, MINB)
    flash_bwd_dkdv_kernel(const T* __restrict__ qkv, const T* __restrict__ dout,
                          const float* __restrict__ lse, const float* __restrict__ Dsum,
                          T* __restrict__ dqkv, T* __restrict__ dst, int ld, int n, int h, int hd,
                          int k_blocks, float scale, float scale_log2) {
  constexpr int kS = HDP + 8, kK = HDP / 16, kT = kTile * kS;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);
  T* sV = sK + kT;
  T* sQdO = sV + kT;  // stage s (of 3): Q at sQdO + 2·s·kT, dO after it
  float* sLse = reinterpret_cast<float*>(sQdO + 6 * kT);  // [3][64]
  float* sD = sLse + 3 * kTile;                           // [3][64]

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
  load_tile<T, HDP>(sQdO, Qg, stride, 0, n, hd);
  load_tile<T, HDP>(sQdO + kT, dOg, ostride, 0, n, hd);
  cp_async_commit();
  load_tile<T, HDP>(sQdO + 2 * kT, Qg, stride, kTile, n, hd);
  load_tile<T, HDP>(sQdO + 3 * kT, dOg, ostride, kTile, n, hd);
  cp_async_commit();
  if (threadIdx.x < kTile) {  // stages 0 and 1
#pragma unroll
    for (int s2 = 0; s2 < 2; ++s2) {
      const int i = s2 * kTile + threadIdx.x;
      sLse[i] = i < n ? lse[bh * n + i] * kLog2e : INFINITY;  // P = 0 past the end
      sD[i] = i < n ? Dsum[bh * n + i] : 0.0f;
    }
  }

  uint32_t kf[kK][4], vf[kK][4];
  float dk[HDP / 8][4], dv[HDP / 8][4];
#pragma unroll
  for (int i = 0; i < HDP / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.0f;

  const int nq = (n + kTile - 1) / kTile;
  for (int it = 0; it < nq; ++it) {
    const int q0 = it * kTile, st = it % 3, nst = (it + 2) % 3;
    cp_async_wait_group<1>();
    __syncthreads();  // block it visible; every warp is past block it − 1, whose stage is reloaded
    float nl = INFINITY, nd = 0.0f;
    if (it + 2 < nq) {
      T* nxt = sQdO + 2 * nst * kT;
      load_tile<T, HDP>(nxt, Qg, stride, q0 + 2 * kTile, n, hd);
      load_tile<T, HDP>(nxt + kT, dOg, ostride, q0 + 2 * kTile, n, hd);
      const int i = q0 + 2 * kTile + threadIdx.x;
      if (threadIdx.x < kTile && i < n) {
        nl = lse[bh * n + i] * kLog2e;
        nd = Dsum[bh * n + i];
      }
    }
    cp_async_commit();
    const T* sQ = sQdO + 2 * st * kT;
    const T* sdO = sQ + kT;
    const float* lq = sLse + st * kTile;
    const float* dd = sD + st * kTile;
    const int qvalid = min(kTile, n - q0);
    if (active_k) {
      if (it == 0) {
#pragma unroll
        for (int kk = 0; kk < kK; ++kk) {
          ldsm_x4(kf[kk], sK + (warp * 16 + (lane & 15)) * kS + kk * 16 + (lane >> 4) * 8);
          ldsm_x4(vf[kk], sV + (warp * 16 + (lane & 15)) * kS + kk * 16 + (lane >> 4) * 8);
        }
      }
      // As the forward: a whole block of queries without the per-chunk checks.
      auto block = [&](auto full_tag) {
        constexpr bool kFull = decltype(full_tag)::value;
#pragma unroll
        for (int qc = 0; qc < 4; ++qc) {
          if (!kFull && qc * 16 >= qvalid) continue;
          float st2[2][4] = {}, dpt[2][4] = {};
#pragma unroll
          for (int kk = 0; kk < kK; ++kk) {
            uint32_t b[4];
            const int off =
                (qc * 16 + (lane & 7) + ((lane >> 4) << 3)) * kS + kk * 16 + ((lane >> 3) & 1) * 8;
            ldsm_x4(b, sQ + off);
            mma<T>(st2[0], kf[kk], b[0], b[1]);
            mma<T>(st2[1], kf[kk], b[2], b[3]);
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
              const float p = key < n ? ex2(st2[nt][e] * scale_log2 - lq[ql]) : 0.0f;
              st2[nt][e] = p;
              dpt[nt][e] = p * (dpt[nt][e] - dd[ql]);
            }
          }
          const uint32_t pa[4] = {pack2<T>(st2[0][0], st2[0][1]), pack2<T>(st2[0][2], st2[0][3]),
                                  pack2<T>(st2[1][0], st2[1][1]), pack2<T>(st2[1][2], st2[1][3])};
          const uint32_t da[4] = {pack2<T>(dpt[0][0], dpt[0][1]), pack2<T>(dpt[0][2], dpt[0][3]),
                                  pack2<T>(dpt[1][0], dpt[1][1]), pack2<T>(dpt[1][2], dpt[1][3])};
          // dSᵀ (rounded as the dK product takes it) for the dQ kernel: rows of keys, ld queries
          // (zeros past the last query: P is 0 there).
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            const int q = q0 + qc * 16 + nt * 8 + 2 * t4;
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              const int key = kw0 + g + 8 * r;
              if (key < n && q < ld)
                *reinterpret_cast<uint32_t*>(dst + (bh * n + key) * static_cast<int64_t>(ld) + q) =
                    da[2 * nt + r];
            }
          }
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
        }
      };
      whole_or_tail(qvalid == kTile, block);
    }
    if (threadIdx.x < kTile) {  // block it + 2's lse and D (that stage was last read in it − 1)
      sLse[nst * kTile + threadIdx.x] = nl;
      sD[nst * kTile + threadIdx.x] = nd;
    }
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

int padded_hd(int64_t hd) {
  return hd <= 32 ? 32 : hd <= 64 ? 64 : 128;
}

// Warps per forward block for n tokens: the 16-row tiles of a head split evenly over the fewest
// blocks of at most kFwdMaxWarps warps (n = 197: 13 tiles, two blocks of 7 warps).
int fwd_warps(int64_t n) {
  const int64_t tiles = (n + 15) / 16;
  const int64_t blocks = (tiles + kFwdMaxWarps - 1) / kFwdMaxWarps;
  return static_cast<int>((tiles + blocks - 1) / blocks);
}
template <int HDP, typename T>
size_t fwd_smem(int warps) {
  return (16 * warps + 6 * kTile) * (HDP + 8) * sizeof(T);
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
  const int warps = fwd_warps(n);
  const int q_blocks = static_cast<int>((n + 16 * warps - 1) / (16 * warps));
  const size_t smem = fwd_smem<HDP, T>(warps);
  auto kernel = flash_fwd_kernel<T, HDP>;
  allow_smem(kernel, fwd_smem<HDP, T>(kFwdMaxWarps));
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(hd));
  kernel<<<static_cast<unsigned>(b * h * q_blocks), 32 * warps, smem, s>>>(
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

template <int HDP, typename T>
size_t bwd_dq_smem(int warps) {
  return (2 * kTile * (16 * warps + 8) + 2 * kTile * (HDP + 8)) * sizeof(T);
}
template <int HDP, typename T>
size_t bwd_dkdv_smem() {
  return 8 * kTile * (HDP + 8) * sizeof(T) + 6 * kTile * sizeof(float);
}

// Backward: D = rowsum(dO ⊙ O); dK, dV and dSᵀ (the only n×n matrix that reaches memory, in T,
// [b·h, n, ld]); then dQ = dS·K from it: no atomics, S and dP computed once.
template <typename T, int HDP>
void bwd_launch(const void* qkv, const void* out, const float* lse, const void* dout, void* dqkv,
                int64_t b, int64_t n, int64_t h, int64_t hd, float* dbias, cudaStream_t s) {
  // 3 CTAs per SM (168 registers) for hd ≤ 64 in the dK/dV kernel: measured 0.905 ms for both
  // backward kernels against 1.16 ms uncapped (200 registers, 2 CTAs) and 1.13 ms at 4 CTAs (128
  // registers, spills); hd 128 spills under any cap.
  constexpr int kMinB = HDP > 64 ? 1 : 3;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t ld = (n + 7) / 8 * 8;
  Scratch dsum(sizeof(float) * b * h * n);
  Scratch dst(sizeof(T) * b * h * n * ld);
  float* D = static_cast<float*>(dsum.p);
  T* dS = static_cast<T*>(dst.p);
  const int64_t rows = b * n * h;
  const int lanes = hd <= 64 ? 8 : 16;
  // With dbias: v's column sums from the D kernel, one partial row [h·hd] per block.
  auto d_kernel =
      hd <= 64 ? (dbias ? flash_bwd_d_kernel<T, 8, true> : flash_bwd_d_kernel<T, 8, false>)
               : (dbias ? flash_bwd_d_kernel<T, 16, true> : flash_bwd_d_kernel<T, 16, false>);
  const unsigned d_grid =
      dbias ? d_sums_grid(d_kernel, rows, h, kBlock / lanes) : grid_for(rows * lanes);
  Scratch v_part(dbias ? sizeof(float) * static_cast<size_t>(d_grid * h * hd) : 0);
  d_kernel<<<d_grid, kBlock, 0, s>>>(static_cast<const T*>(out), static_cast<const T*>(dout), D,
                                     rows, static_cast<int>(n), static_cast<int>(h),
                                     static_cast<int>(hd), static_cast<float*>(v_part.p));
  CAI_CUDA_CHECK_LAUNCH();
  const int blocks = static_cast<int>((n + kTile - 1) / kTile);
  // dQ in blocks of 16·warps queries, as the forward splits a head.
  const int warps = fwd_warps(n);
  const int q_blocks = static_cast<int>((n + 16 * warps - 1) / (16 * warps));
  // With dbias: one partial row [hd] of dQ's column sums per dQ CTA.
  Scratch part(dbias ? sizeof(float) * static_cast<size_t>(b * h * q_blocks * hd) : 0);
  float* q_part = dbias ? static_cast<float*>(part.p) : nullptr;
  const size_t smem_k = bwd_dkdv_smem<HDP, T>();
  auto kk = flash_bwd_dkdv_kernel<T, HDP, kMinB>;
  allow_smem(kk, smem_k);
  kk<<<static_cast<unsigned>(b * h * blocks), kThreads, smem_k, s>>>(
      static_cast<const T*>(qkv), static_cast<const T*>(dout), lse, D, static_cast<T*>(dqkv), dS,
      static_cast<int>(ld), static_cast<int>(n), static_cast<int>(h), static_cast<int>(hd), blocks,
      scale, scale * kLog2e);
  CAI_CUDA_CHECK_LAUNCH();
  const size_t smem_q = bwd_dq_smem<HDP, T>(warps);
  auto kq = flash_bwd_dq_kernel<T, HDP>;
  allow_smem(kq, bwd_dq_smem<HDP, T>(kFwdMaxWarps));
  kq<<<static_cast<unsigned>(b * h * q_blocks), 32 * warps, smem_q, s>>>(
      static_cast<const T*>(qkv), dS, static_cast<int>(ld), static_cast<T*>(dqkv),
      static_cast<int>(n), static_cast<int>(h), static_cast<int>(hd), q_blocks, scale, q_part);
  CAI_CUDA_CHECK_LAUNCH();
  if (!dbias) return;
  // q: the partials in order; k: nothing (0); v: Σ_rows dout from the D kernel's partials.
  const BiasPartials q{q_part, dbias, b, q_blocks};
  const BiasPartials v{static_cast<const float*>(v_part.p), dbias + 2 * h * hd, 1, d_grid};
  flash_bwd_bias_finish_kernel<<<dim3(static_cast<unsigned>((h * hd + 31) / 32), 2), dim3(32, 32),
                                 0, s>>>(q, v, h, hd);
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
                  int64_t b, int64_t n, int64_t h, int64_t hd, float* dbias, cudaStream_t s) {
  switch (padded_hd(hd)) {
    case 32:
      return bwd_launch<T, 32>(qkv, out, lse, dout, dqkv, b, n, h, hd, dbias, s);
    case 64:
      return bwd_launch<T, 64>(qkv, out, lse, dout, dqkv, b, n, h, hd, dbias, s);
    default:
      return bwd_launch<T, 128>(qkv, out, lse, dout, dqkv, b, n, h, hd, dbias, s);
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
                           int64_t hd, float* dbias, void* stream) {
  check_args("flash_attention_bwd", t, b, n, h, hd);
  if (b == 0 || n == 0 || h == 0) return;
  CAI_CHECK(aligned16(qkv) && aligned16(out) && aligned16(dout) && aligned16(dqkv),
            "[flash_attention_bwd] qkv {}, out {}, dout {}, dqkv {}: expected 16-byte aligned "
            "addresses",
            qkv, out, dout, dqkv);
  const cudaStream_t s = as_stream(stream);
  if (t == DT::BF16)
    bwd_dispatch<__nv_bfloat16>(qkv, out, lse, dout, dqkv, b, n, h, hd, dbias, s);
  else
    bwd_dispatch<__half>(qkv, out, lse, dout, dqkv, b, n, h, hd, dbias, s);
}

}  // namespace cai::kernels::cuda
