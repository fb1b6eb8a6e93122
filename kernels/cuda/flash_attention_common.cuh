// Shared by flash_attention.cu (forward) and flash_attention_bwd.cu (backward): the tile
// constants, the mma/ldmatrix/cp.async helpers, the bias partial sums and the host-side argument
// checks. Internal to those two files (everything sits in an anonymous namespace).
#pragma once
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

// One (batch·head) bh's rows: Q, K and V of head hi of sample bi in qkv [b, n, 3, h, hd] (stride
// elements between tokens) and, given dout [b, n, h, hd], its rows there (ostride apart).
template <typename T>
struct HeadRows {
  int64_t bi, hi, stride, ostride;
  const T *q, *k, *v, *dout = nullptr;
};
template <typename T>
__device__ __forceinline__ HeadRows<T> head_rows(const T* qkv, int64_t bh, int n, int h, int hd) {
  HeadRows<T> r;
  r.bi = bh / h, r.hi = bh % h;
  r.stride = 3LL * h * hd, r.ostride = static_cast<int64_t>(h) * hd;
  r.q = qkv + r.bi * n * r.stride + r.hi * hd;
  r.k = r.q + static_cast<int64_t>(h) * hd;
  r.v = r.k + static_cast<int64_t>(h) * hd;
  return r;
}
template <typename T>
__device__ __forceinline__ HeadRows<T> head_rows(const T* qkv, const T* dout, int64_t bh, int n,
                                                 int h, int hd) {
  HeadRows<T> r = head_rows(qkv, bh, n, h, hd);
  r.dout = dout + r.bi * n * r.ostride + r.hi * hd;
  return r;
}

// 16 bytes global → shared; zero-filled (nothing read) when !valid.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}

// 4 bytes global → shared; zero-filled when !valid.
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 4 : 0));
}

// Queries [q0, q0 + 64) of a head's lse and D (fp32 rows of n at bh·n) into sl[64] and sd[64] by
// 4-byte cp.async (a head's rows are not 16-byte aligned), threads 0-63; zeros past n.
__device__ __forceinline__ void load_lse_d(float* sl, float* sd, const float* lse, const float* D,
                                           int64_t bh, int n, int q0) {
  if (threadIdx.x < 64) {
    const int i = q0 + static_cast<int>(threadIdx.x);
    const bool valid = i < n;
    const int64_t src = bh * n + (valid ? i : 0);
    cp_async4(sl + threadIdx.x, lse + src, valid);
    cp_async4(sd + threadIdx.x, D + src, valid);
  }
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

inline int padded_hd(int64_t hd) {
  return hd <= 32 ? 32 : hd <= 64 ? 64 : 128;
}

// Warps per forward block for n tokens: the 16-row tiles of a head split evenly over the fewest
// blocks of at most kFwdMaxWarps warps (n = 197: 13 tiles, two blocks of 7 warps).
inline int fwd_warps(int64_t n) {
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

inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

inline void check_args(const char* op, DT t, int64_t b, int64_t n, int64_t h, int64_t hd) {
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

}  // namespace

}  // namespace cai::kernels::cuda
