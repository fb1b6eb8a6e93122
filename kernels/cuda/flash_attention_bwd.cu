// FlashAttention-2 style backward (flash_attention.cu's header comment describes the three
// kernels): D = rowsum(dO ⊙ O), dK/dV with dSᵀ to a scratch, then dQ from it; and
// flash_attention_bwd_t. The shared helpers are in flash_attention_common.cuh.
#include "kernels/cuda/flash_attention_common.cuh"
#ifdef CAI_HAVE_SM90A
#include "kernels/cuda/flash_attention_sm90.h"
#endif

namespace cai::kernels::cuda {

namespace {

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
  // hd > 64 (one CTA an SM, so room to spare): lse and D arrive by cp.async with the tiles, and
  // dSᵀ leaves through a [64][72] tile in 16-byte stores. ViT-H/14's shape (b 32, n 257, h 16,
  // hd 80) on an H200, the whole backward: 0.529 → 0.470 ms (the staging's share 0.489 → 0.469).
  // For hd ≤ 64 (three CTAs an SM) the loads did not pay (0.682 → 0.688 ms at ViT-B/16's shape),
  // so those kernels load lse and D through registers and store dSᵀ in 4-byte pieces.
  constexpr bool kWide = HDP > 64;
  constexpr int kDs = kTile + 8;
  T* sDs = reinterpret_cast<T*>(sD + 3 * kTile);

  const int64_t bh = blockIdx.x / k_blocks;
  const int kb = static_cast<int>(blockIdx.x % k_blocks) * kTile;
  const HeadRows<T> head = head_rows(qkv, dout, bh, n, h, hd);
  const int64_t bi = head.bi, hi = head.hi, stride = head.stride, ostride = head.ostride;
  const T *Qg = head.q, *Kg = head.k, *Vg = head.v, *dOg = head.dout;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int kw0 = kb + warp * 16;
  const bool active_k = kw0 < n;

  // A block of 64 queries' Q, dO, lse and D into stage st, asynchronously (lse and D by 4-byte
  // copies: a head's rows are not 16-byte aligned). Past the last query everything is 0: there P
  // = 2^(scale·0 − 0) = 1, but dO = 0 and D = 0 make its dV, dK and dSᵀ terms 0.
  // (hd > 64; else lse·log2e and D through registers, +∞ and 0 past the end.)
  auto load_block = [&](int st, int q0) {
    T* dstq = sQdO + 2 * st * kT;
    load_tile<T, HDP>(dstq, Qg, stride, q0, n, hd);
    load_tile<T, HDP>(dstq + kT, dOg, ostride, q0, n, hd);
    if (kWide) load_lse_d(sLse + st * kTile, sD + st * kTile, lse, Dsum, bh, n, q0);
  };
  load_tile<T, HDP>(sK, Kg, stride, kb, n, hd);
  load_tile<T, HDP>(sV, Vg, stride, kb, n, hd);
  load_block(0, 0);
  cp_async_commit();
  load_block(1, kTile);
  cp_async_commit();
  if (!kWide && threadIdx.x < kTile) {  // stages 0 and 1
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
      load_block(nst, q0 + 2 * kTile);
      const int i = q0 + 2 * kTile + threadIdx.x;
      if (!kWide && threadIdx.x < kTile && i < n) {
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
              const float l = kWide ? lq[ql] * kLog2e : lq[ql];  // lse in base 2
              const float p = key < n ? ex2(st2[nt][e] * scale_log2 - l) : 0.0f;
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
              const int rl = warp * 16 + g + 8 * r;
              if constexpr (kWide) {
                *reinterpret_cast<uint32_t*>(sDs + rl * kDs + q - q0) = da[2 * nt + r];
              } else {
                const int key = kb + rl;
                if (key < n && q < ld)
                  *reinterpret_cast<uint32_t*>(dst + (bh * n + key) * static_cast<int64_t>(ld) +
                                               q) = da[2 * nt + r];
              }
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
      if constexpr (kWide) {  // the warp's 16 rows of dSᵀ, 8 queries a lane at a time
        __syncwarp();
        const int c = lane & 7, q = q0 + 8 * c;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int rl = (lane >> 3) + 4 * i, key = kw0 + rl;
          const uint4 v = *reinterpret_cast<const uint4*>(sDs + (warp * 16 + rl) * kDs + 8 * c);
          if (key < n && q < ld)
            *reinterpret_cast<uint4*>(dst + (bh * n + key) * static_cast<int64_t>(ld) + q) = v;
        }
        __syncwarp();  // read before the next block's writes
      }
    }
    if (!kWide && threadIdx.x < kTile) {  // block it + 2's lse and D (stage last read in it − 1)
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
  return 8 * kTile * (HDP + 8) * sizeof(T) + 6 * kTile * sizeof(float) +
         (HDP > 64 ? kTile * (kTile + 8) * sizeof(T) : 0);
}

// Backward: D = rowsum(dO ⊙ O); dK, dV and dSᵀ (the only n×n matrix that reaches memory, in T,
// [b·h, n, ld]); then dQ = dS·K from it: no atomics, S and dP computed once.
template <typename T, int HDP>
void bwd_launch(const void* qkv, const void* out, const float* lse, const void* dout, void* dqkv,
                int64_t b, int64_t n, int64_t h, int64_t hd, float* dbias, bool sm90,
                cudaStream_t s) {
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
  int q_blocks = static_cast<int>((n + 16 * warps - 1) / (16 * warps));
#ifdef CAI_HAVE_SM90A
  if (sm90) q_blocks = flash_dq_sm90_blocks(n);  // 128 queries a CTA
#endif
  // With dbias: one partial row [hd] of dQ's column sums per dQ CTA.
  Scratch part(dbias ? sizeof(float) * static_cast<size_t>(b * h * q_blocks * hd) : 0);
  float* q_part = dbias ? static_cast<float*>(part.p) : nullptr;
#ifdef CAI_HAVE_SM90A
  if (sm90) {
    flash_bwd_dkdv_sm90(std::is_same_v<T, __nv_bfloat16> ? DT::BF16 : DT::F16, qkv, dout, lse, D,
                        dqkv, dS, ld, b, n, h, s);
  } else
#endif
  {
    (void)sm90;
    const size_t smem_k = bwd_dkdv_smem<HDP, T>();
    auto kk = flash_bwd_dkdv_kernel<T, HDP, kMinB>;
    allow_smem(kk, smem_k);
    kk<<<static_cast<unsigned>(b * h * blocks), kThreads, smem_k, s>>>(
        static_cast<const T*>(qkv), static_cast<const T*>(dout), lse, D, static_cast<T*>(dqkv), dS,
        static_cast<int>(ld), static_cast<int>(n), static_cast<int>(h), static_cast<int>(hd),
        blocks, scale, scale * kLog2e);
    CAI_CUDA_CHECK_LAUNCH();
  }
#ifdef CAI_HAVE_SM90A
  if (sm90) {
    flash_bwd_dq_sm90(std::is_same_v<T, __nv_bfloat16> ? DT::BF16 : DT::F16, qkv, dS, ld, dqkv, b,
                      n, h, q_part, s);
  } else
#endif
  {
    const size_t smem_q = bwd_dq_smem<HDP, T>(warps);
    auto kq = flash_bwd_dq_kernel<T, HDP>;
    allow_smem(kq, bwd_dq_smem<HDP, T>(kFwdMaxWarps));
    kq<<<static_cast<unsigned>(b * h * q_blocks), 32 * warps, smem_q, s>>>(
        static_cast<const T*>(qkv), dS, static_cast<int>(ld), static_cast<T*>(dqkv),
        static_cast<int>(n), static_cast<int>(h), static_cast<int>(hd), q_blocks, scale, q_part);
    CAI_CUDA_CHECK_LAUNCH();
  }
  if (!dbias) return;
  // q: the partials in order; k: nothing (0); v: Σ_rows dout from the D kernel's partials.
  const BiasPartials q{q_part, dbias, b, q_blocks};
  const BiasPartials v{static_cast<const float*>(v_part.p), dbias + 2 * h * hd, 1, d_grid};
  flash_bwd_bias_finish_kernel<<<dim3(static_cast<unsigned>((h * hd + 31) / 32), 2), dim3(32, 32),
                                 0, s>>>(q, v, h, hd);
  CAI_CUDA_CHECK_LAUNCH();
}

template <typename T>
void bwd_dispatch(const void* qkv, const void* out, const float* lse, const void* dout, void* dqkv,
                  int64_t b, int64_t n, int64_t h, int64_t hd, float* dbias, bool sm90,
                  cudaStream_t s) {
  switch (padded_hd(hd)) {
    case 32:
      return bwd_launch<T, 32>(qkv, out, lse, dout, dqkv, b, n, h, hd, dbias, false, s);
    case 64:
      return bwd_launch<T, 64>(qkv, out, lse, dout, dqkv, b, n, h, hd, dbias, sm90, s);
    default:
      return bwd_launch<T, 128>(qkv, out, lse, dout, dqkv, b, n, h, hd, dbias, false, s);
  }
}

}  // namespace

void flash_attention_bwd_t(DT t, const void* qkv, const void* out, const float* lse,
                           const void* dout, void* dqkv, int64_t b, int64_t n, int64_t h,
                           int64_t hd, float* dbias, void* stream, FlashKernel kernel) {
  check_args("flash_attention_bwd", t, b, n, h, hd);
  CAI_CHECK(kernel != FlashKernel::Sm90 || flash_attention_sm90_available(t, hd),
            "[flash_attention_bwd] the Hopper kernel was asked for {} with head dim {}: it needs "
            "a build with CUDA architecture 90, a device of compute capability 9.0 and hd = 64",
            dt_name(t), hd);
  if (b == 0 || n == 0 || h == 0) return;
  CAI_CHECK(aligned16(qkv) && aligned16(out) && aligned16(dout) && aligned16(dqkv),
            "[flash_attention_bwd] qkv {}, out {}, dout {}, dqkv {}: expected 16-byte aligned "
            "addresses",
            qkv, out, dout, dqkv);
  const cudaStream_t s = as_stream(stream);
  const bool sm90 = kernel == FlashKernel::Sm90 ||
                    (kernel == FlashKernel::Auto && flash_attention_sm90_default() &&
                     flash_attention_sm90_available(t, hd));
  if (t == DT::BF16)
    bwd_dispatch<__nv_bfloat16>(qkv, out, lse, dout, dqkv, b, n, h, hd, dbias, sm90, s);
  else
    bwd_dispatch<__half>(qkv, out, lse, dout, dqkv, b, n, h, hd, dbias, sm90, s);
}

}  // namespace cai::kernels::cuda
