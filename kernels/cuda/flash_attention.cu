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
//
// On a device of compute capability 9.0 with hd = 64 the forward and the backward's dK/dV and dQ
// kernels are the Hopper ones (wgmma; flash_attention_sm90.cu, FlashKernel); these mma.sync kernels
// serve every other GPU and head dim. ViT-B/16 shape (b 256, n 197, h 12) on an H200: forward
// 0.240 → 0.209 ms, backward 0.684 → 0.625 ms (test_cuda_flash's timing;
// docs/bench/h200-flash-sm90).
//
// This file holds the forward kernel and the public entry points but the backward's
// (flash_attention_bwd.cu); the shared helpers are in flash_attention_common.cuh.
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/flash_attention_common.cuh"
#ifdef CAI_HAVE_SM90A
#include "kernels/cuda/flash_attention_sm90.h"
#endif

namespace cai::kernels::cuda {

namespace {

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
  const HeadRows<T> head = head_rows(qkv, bh, n, h, hd);
  const int64_t bi = head.bi, hi = head.hi, stride = head.stride;  // stride: between tokens
  const T *Qg = head.q, *Kg = head.k, *Vg = head.v;
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

}  // namespace

bool flash_attention_sm90_default() {
  const char* v = std::getenv("CAI_FLASH_SM90");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

bool flash_attention_supported(DT t, int64_t hd) {
  return (t == DT::BF16 || t == DT::F16) && hd >= 8 && hd <= 128 && hd % 8 == 0;
}

bool flash_attention_sm90_available(DT t, int64_t hd) {
#ifdef CAI_HAVE_SM90A
  if (!flash_attention_supported(t, hd) || hd != 64) return false;
  int dev = 0, major = 0, minor = 0;
  CAI_CUDA_CHECK(cudaGetDevice(&dev));
  CAI_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CAI_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  return major == 9 && minor == 0;
#else
  (void)t, (void)hd;
  return false;
#endif
}

void flash_attention_fwd_t(DT t, const void* qkv, void* out, float* lse, int64_t b, int64_t n,
                           int64_t h, int64_t hd, void* stream, FlashKernel kernel) {
  check_args("flash_attention_fwd", t, b, n, h, hd);
  CAI_CHECK(kernel != FlashKernel::Sm90 || flash_attention_sm90_available(t, hd),
            "[flash_attention_fwd] the Hopper kernel was asked for {} with head dim {}: it needs "
            "a build with CUDA architecture 90, a device of compute capability 9.0 and hd = 64",
            dt_name(t), hd);
  if (b == 0 || n == 0 || h == 0) return;
  CAI_CHECK(aligned16(qkv) && aligned16(out),
            "[flash_attention_fwd] qkv {} and out {}: expected 16-byte aligned addresses", qkv,
            out);
  const cudaStream_t s = as_stream(stream);
#ifdef CAI_HAVE_SM90A
  if (kernel == FlashKernel::Sm90 ||
      (kernel == FlashKernel::Auto && flash_attention_sm90_default() &&
       flash_attention_sm90_available(t, hd)))
    return flash_fwd_sm90(t, qkv, out, lse, b, n, h, s);
#endif
  if (t == DT::BF16)
    fwd_dispatch<__nv_bfloat16>(qkv, out, lse, b, n, h, hd, s);
  else
    fwd_dispatch<__half>(qkv, out, lse, b, n, h, hd, s);
}

}  // namespace cai::kernels::cuda
