// Hopper (sm_90a) kernels of the fused attention for head dim 64, on the warpgroup tensor-core
// instructions (wgmma.mma_async) instead of mma.sync: the forward and the backward's dK/dV and dQ
// kernels, each with the contract of its mma.sync twin (flash_attention.cu, flash_attention_bwd.cu;
// the backward's D kernel and the bias sums are shared). flash_attention_fwd_t / _bwd_t call them
// on a device of compute capability 9.0 (FlashKernel::Auto, unless CAI_FLASH_SM90=0).
//
// Tiles sit in shared memory in the 128-byte swizzled layout wgmma reads through matrix
// descriptors (a 64-value row is 128 bytes: row r's 16-byte chunk c at r·128 + ((c ⊕ (r mod
// 8))·16), tiles 1,024-byte aligned); cp.async fills them (zeros past the last token) in three
// stages of 64 rows with one barrier per block, as the mma.sync kernels do, and fence.proxy.async
// makes its writes visible to wgmma (the async proxy) before each barrier. A K-major operand is
// read as stored (rows of Q, K, V, dO); an N-major one (V and dO, Q as B of dV/dK's products, K for
// dQ) through the descriptor's transpose; the accumulator layout of a product (each warp 16 rows,
// the C layout of mma.sync) converts pairwise to wgmma's register A layout, so P and dS feed the
// next product from registers. Results leave through shared memory in 16-byte pieces (the 4-byte
// stores of the accumulator layout cost the dK/dV kernel 10%).
//
// Forward: one CTA of kWarpgroups warpgroups per (batch·head, block of 64·kWarpgroups queries),
// each warpgroup 64 query rows (wgmma's M). Per block of 64 keys: S = Q·Kᵀ (four m64n64k16),
// online softmax in fp32 on S's registers (base 2, running max in score units, one FFMA per
// exponent), O = diag(α)·O + P·V. Rows past the last token are zeros (scores 0): computed, never
// written. Every warp runs the softmax: a branch on the warp's rows would serialise the wgmma
// (ptxas C7520); branches on uniform values (the block of keys) do not.
// dK/dV: one warpgroup per (batch·head, block of 64 keys), over blocks of 64 queries: Sᵀ = K·Qᵀ,
// dPᵀ = V·dOᵀ, Pᵀ and dSᵀ in registers, dSᵀ to the scratch, dV += Pᵀ·dO, dK += dSᵀ·Q.
// dQ: kWarpgroups warpgroups per (batch·head, block of 64·kWarpgroups queries), over blocks of 64
// keys: dQ += dS·K with dS read M-major from the dSᵀ scratch's tiles.
// A head's last, partial block of keys (forward, dQ) or queries (dK/dV) runs only its pieces of 16
// that hold tokens (by_chunks: m64nNk16 with N = 16, 32 or 48, and as many k16 steps): ViT's 197
// tokens end in a block of 5, a quarter of the work of a whole block (B/16 shape on an H200:
// forward 0.209 → 0.184 ms, backward 0.625 → 0.534 with dK/dV's 16-byte stores). wgmma's M is
// 64, so a partial block of keys in dK/dV still costs a whole one (giving it to the mma.sync
// kernel, whose warps without a key skip their products, was slower: 0.561 ms).
//
// Compiled for sm_90a only (kernels/CMakeLists.txt), when the build's architectures include 90.
#include "kernels/cuda/flash_attention_common.cuh"
#include "kernels/cuda/flash_attention_sm90.h"

namespace cai::kernels::cuda {

namespace {

constexpr int kWarpgroups = 2;               // 128 query rows per CTA
constexpr int kRowsSm90 = 64 * kWarpgroups;  // queries per CTA
constexpr int kTileBytes = 64 * 128;         // 64 rows of 64 half values
// Stages of 64 rows: the forward's four (two loads ahead, and the P·V of the block before still
// reading its stage), the backward kernels' three (each block's products waited for in the block).
constexpr int kFwdStages = 4;
constexpr int kBwdStages = 3;
constexpr size_t kSmemSm90 =
    kWarpgroups * kTileBytes + kFwdStages * 2 * kTileBytes + 1024;  // + alignment slack

// 16 bytes of row r, chunk c (8 values) of a swizzled 128-byte-row tile.
__device__ __forceinline__ uint32_t sw128(int r, int c) {
  return static_cast<uint32_t>(r * 128 + ((c ^ (r & 7)) << 4));
}

// A warp's 16 rows (warp·16 + 0-15) of a swizzled staging tile to global memory, 16 bytes a lane
// at a time: local row r is row first + r, written at row_ptr(first + r) unless that is ≥ n.
template <typename F>
__device__ __forceinline__ void copy_out_rows(const unsigned char* stage, int warp, int lane,
                                              int first, int n, F row_ptr) {
  const int c = lane & 7;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int rl = warp * 16 + (lane >> 3) + 4 * i, row = first + rl;
    const uint4 v = *reinterpret_cast<const uint4*>(stage + sw128(rl, c));
    if (row < n) *reinterpret_cast<uint4*>(row_ptr(row) + c * 8) = v;
  }
}

// A warp's accumulator (the m64n64 layout: its rows warp·16 + g and + 8, mul[0] and mul[1] the
// factors of each) rounded to T into its 16 rows of a swizzled staging tile, for copy_out_rows
// after a __syncwarp.
template <typename T>
__device__ __forceinline__ void stage_rows(unsigned char* stage, const float (&acc)[32],
                                           const float (&mul)[2], int warp, int lane) {
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int dt = 0; dt < 8; ++dt)
      *reinterpret_cast<uint32_t*>(stage + sw128(warp * 16 + g + 8 * r, dt) + 4 * t4) =
          pack2<T>(acc[4 * dt + 2 * r] * mul[r], acc[4 * dt + 2 * r + 1] * mul[r]);
}

// Rows [r0, r0 + count) of a [rows, 64] matrix (row stride `stride` elements) into a swizzled
// tile at shared address `s` (bytes, 1,024-aligned), all the block's threads; rows ≥ rows zeros.
template <typename T>
__device__ __forceinline__ void load_sw128(unsigned char* s, const T* g, int64_t stride, int r0,
                                           int rows, int count) {
  for (int c = threadIdx.x; c < count * 8; c += blockDim.x) {
    const int r = c >> 3, ch = c & 7;
    const bool valid = r0 + r < rows;
    cp_async16(s + sw128(r, ch), valid ? g + static_cast<int64_t>(r0 + r) * stride + ch * 8 : g,
               valid);
  }
}

// wgmma's shared memory matrix descriptor for a 128-byte-swizzled tile: start address (bytes),
// leading byte offset 16 (unused by this layout within one swizzle atom), stride byte offset
// 1,024 (eight rows of 128 bytes: the next group of 8 rows for a K-major operand, the next 8
// values of K for an N-major one), swizzle mode 1 (128 B).
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr) {
  uint64_t d = (addr & 0x3FFFF) >> 4;
  d |= uint64_t{16 >> 4} << 16;
  d |= uint64_t{1024 >> 4} << 32;
  d |= uint64_t{1} << 62;
  return d;
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses to an accumulator across the asynchronous wgmma.
// (Its first N registers: the rest of a narrower product's accumulator is unused.)
template <int N = 32>
__device__ __forceinline__ void fence_regs(float (&d)[32]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
__device__ __forceinline__ void fence_frags(uint32_t (&a)[4][4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[i][j])::"memory");
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The accumulator operand lists of m64nNk16 for N = 16, 32, 48, 64 (N / 2 registers a thread).
#define CAI_WGMMA_D8 "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define CAI_WGMMA_D16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define CAI_WGMMA_D24                                                                           \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23}"
#define CAI_WGMMA_D32                                                                           \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define CAI_WGMMA_D8_OPERANDS(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define CAI_WGMMA_D16_OPERANDS(d)                                                          \
  CAI_WGMMA_D8_OPERANDS(d), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), \
      "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define CAI_WGMMA_D24_OPERANDS(d)                                                             \
  CAI_WGMMA_D16_OPERANDS(d), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
      "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
#define CAI_WGMMA_D32_OPERANDS(d)                                                             \
  CAI_WGMMA_D24_OPERANDS(d), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

// d[0, N/2) (+)= A·B, m64nNk16 (N = 16, 32, 48 or 64: a head's last block of keys or queries
// takes only the 16-wide pieces that hold tokens), A and B in shared memory, K-major (0) or
// transposed (1: A M-major, B N-major); accumulate unless `zero`. The operands after the N / 2
// accumulators are numbered from %ND.
#define CAI_WGMMA_SS(TYPE, N, D, DOPS, IA, IB, IZ, ITA, ITB)                                \
  asm volatile("{\n.reg .pred p;\nsetp.eq.u32 p, " IZ                                       \
               ", 0;\n"                                                                     \
               "wgmma.mma_async.sync.aligned.m64n" N "k16.f32." TYPE "." TYPE " " D ", " IA \
               ", " IB ", p, 1, 1, " ITA ", " ITB ";\n}\n"                                  \
               : DOPS(d)                                                                    \
               : "l"(da), "l"(db), "r"(static_cast<uint32_t>(zero)), "n"(kTransA), "n"(kTransB))
#define CAI_WGMMA_SS_N(TYPE)                                                                    \
  if constexpr (N == 16)                                                                        \
    CAI_WGMMA_SS(TYPE, "16", CAI_WGMMA_D8, CAI_WGMMA_D8_OPERANDS, "%8", "%9", "%10", "%11",     \
                 "%12");                                                                        \
  else if constexpr (N == 32)                                                                   \
    CAI_WGMMA_SS(TYPE, "32", CAI_WGMMA_D16, CAI_WGMMA_D16_OPERANDS, "%16", "%17", "%18", "%19", \
                 "%20");                                                                        \
  else if constexpr (N == 48)                                                                   \
    CAI_WGMMA_SS(TYPE, "48", CAI_WGMMA_D24, CAI_WGMMA_D24_OPERANDS, "%24", "%25", "%26", "%27", \
                 "%28");                                                                        \
  else                                                                                          \
    CAI_WGMMA_SS(TYPE, "64", CAI_WGMMA_D32, CAI_WGMMA_D32_OPERANDS, "%32", "%33", "%34", "%35", \
                 "%36");
template <typename T, int kTransA = 0, int kTransB = 0, int N = 64>
__device__ __forceinline__ void wgmma_ss(float (&d)[32], uint64_t da, uint64_t db, bool zero) {
  static_assert(N == 16 || N == 32 || N == 48 || N == 64, "m64nNk16 with N a multiple of 16");
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    CAI_WGMMA_SS_N("bf16")
  } else {
    CAI_WGMMA_SS_N("f16")
  }
}
#undef CAI_WGMMA_SS_N
#undef CAI_WGMMA_SS
// d += A·B, m64n64k16, A in registers (wgmma's A fragment), B N-major in shared memory.
#define CAI_WGMMA_RS_TB(TYPE)                                                       \
  asm volatile(                                                                     \
      "{\n.reg .pred p;\nsetp.ne.u32 p, %37, 0;\n"                                  \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " " CAI_WGMMA_D32 \
      ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                               \
      : CAI_WGMMA_D32_OPERANDS(d)                                                   \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1u))
template <typename T>
__device__ __forceinline__ void wgmma_rs_tb(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    CAI_WGMMA_RS_TB("bf16");
  else
    CAI_WGMMA_RS_TB("f16");
}
#undef CAI_WGMMA_RS_TB
#undef CAI_WGMMA_D8
#undef CAI_WGMMA_D16
#undef CAI_WGMMA_D24
#undef CAI_WGMMA_D32
#undef CAI_WGMMA_D8_OPERANDS
#undef CAI_WGMMA_D16_OPERANDS
#undef CAI_WGMMA_D24_OPERANDS
#undef CAI_WGMMA_D32_OPERANDS

// A block of 64 keys (or queries) of which `valid` are tokens: f(C, whole) with C the 16-wide
// pieces that hold tokens (4 unless it is a head's last, partial block: ViT's 197 tokens end in a
// block of 5, which then costs a quarter of a block, not a whole one) and whole (std::true_type)
// when all 64 are tokens; both compile-time constants, chosen by a uniform branch.
template <int C>
using chunks_t = std::integral_constant<int, C>;
template <typename F>
__device__ __forceinline__ void by_chunks(int valid, F&& f) {
  if (valid >= 64)
    f(chunks_t<4>{}, std::true_type{});
  else if (valid > 48)
    f(chunks_t<4>{}, std::false_type{});
  else if (valid > 32)
    f(chunks_t<3>{}, std::false_type{});
  else if (valid > 16)
    f(chunks_t<2>{}, std::false_type{});
  else
    f(chunks_t<1>{}, std::false_type{});
}

template <typename T>
__global__ void __launch_bounds__(kWarpgroups * 128, 2)
    flash_fwd_sm90_kernel(const T* __restrict__ qkv, T* __restrict__ out, float* __restrict__ lse,
                          int n, int h, int q_blocks, float scale_log2) {
  constexpr int hd = 64;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw), base = (raw + 1023) & ~1023u;
  unsigned char* sQ = smem_raw + (base - raw);
  unsigned char* sKV = sQ + kWarpgroups * kTileBytes;  // stage s: K at 2·s tiles, V after it

  const int64_t bh = blockIdx.x / q_blocks;
  const int q0 = static_cast<int>(blockIdx.x % q_blocks) * kRowsSm90;
  const HeadRows<T> head = head_rows(qkv, bh, n, h, hd);
  const int64_t bi = head.bi, hi = head.hi, stride = head.stride;  // stride: between tokens
  const T *Qg = head.q, *Kg = head.k, *Vg = head.v;
  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int wq0 = q0 + wg * 64;             // the warpgroup's first row
  const bool active = wq0 + warp * 16 < n;  // uniform over the warp

  load_sw128(sQ, Qg, stride, q0, n, kRowsSm90);
  load_sw128(sKV, Kg, stride, 0, n, 64);
  load_sw128(sKV + kTileBytes, Vg, stride, 0, n, 64);
  cp_async_commit();
  const int nk = (n + 63) / 64;
  if (nk > 1) {
    load_sw128(sKV + 2 * kTileBytes, Kg, stride, 64, n, 64);
    load_sw128(sKV + 3 * kTileBytes, Vg, stride, 64, n, 64);
  }
  cp_async_commit();

  float o[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  const uint32_t q_addr = base + wg * kTileBytes;
  uint32_t p[4][4];  // P of the block whose P·V may still run (its wgmma reads these registers)

  // Block it's P·V is left running into block it + 1 (past its barrier, loads and S = Q·Kᵀ): the
  // wait for S(it + 1) covers it (wgmma groups complete in order). Four stages keep the loads two
  // blocks ahead off the stage that P·V reads.
  for (int it = 0; it < nk; ++it) {
    const int kb = it * 64;
    cp_async_wait_group<1>();
    fence_proxy_async();
    __syncthreads();  // block it visible (to wgmma too); every warpgroup is past S(it − 1)
    if (it + 2 < nk) {
      unsigned char* nxt = sKV + 2 * ((it + 2) % kFwdStages) * kTileBytes;
      load_sw128(nxt, Kg, stride, kb + 128, n, 64);
      load_sw128(nxt + kTileBytes, Vg, stride, kb + 128, n, 64);
    }
    cp_async_commit();
    const uint32_t k_addr = base + kWarpgroups * kTileBytes + 2 * (it % kFwdStages) * kTileBytes;
    const uint32_t v_addr = k_addr + kTileBytes;

    // S = Q·Kᵀ over the block's C pieces of 16 keys, the online softmax on them, O += P·V with
    // P's C fragments. On the raw scores (the running max m in score units; each exponent one
    // FFMA: 2^(s·c − m·c)); a whole block (all but a head's last) takes no key checks.
    auto block = [&](auto chunks_tag, auto whole_tag) {
      constexpr int C = decltype(chunks_tag)::value, kS = 8 * C;  // S's registers
      constexpr bool kWhole = decltype(whole_tag)::value;
      float s[32];
#pragma unroll
      for (int i = 0; i < kS; ++i) s[i] = 0.0f;
      fence_regs<kS>(s);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < hd / 16; ++kk)  // 16 values of hd = 32 bytes along the swizzled row
        wgmma_ss<T, 0, 0, 16 * C>(s, desc_sw128(q_addr + kk * 32), desc_sw128(k_addr + kk * 32),
                                  kk == 0);
      wgmma_commit();
      wgmma_wait<0>();  // S(it) and P·V(it − 1)
      fence_regs<kS>(s);
      fence_regs(o);
      fence_frags(p);

      if constexpr (!kWhole) {
#pragma unroll
        for (int i = 0; i < kS; ++i)
          if (kb + (i >> 2) * 8 + 2 * t4 + (i & 1) >= n) s[i] = -INFINITY;
      }
      float mx[2] = {m_run[0], m_run[1]};
#pragma unroll
      for (int nt = 0; nt < 2 * C; ++nt) {
        mx[0] = fmaxf(mx[0], fmaxf(s[4 * nt], s[4 * nt + 1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[4 * nt + 2], s[4 * nt + 3]));
      }
      float mc[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        mc[r] = mx[r] * scale_log2;
        const float alpha = ex2(m_run[r] * scale_log2 - mc[r]);  // 0 on the first block (−∞)
        m_run[r] = mx[r];
        l_run[r] *= alpha;
#pragma unroll
        for (int dt = 0; dt < 8; ++dt) o[4 * dt + 2 * r] *= alpha, o[4 * dt + 2 * r + 1] *= alpha;
      }
#pragma unroll
      for (int i = 0; i < kS; ++i) {
        s[i] = ex2(fmaf(s[i], scale_log2, -mc[(i >> 1) & 1]));
        l_run[(i >> 1) & 1] += s[i];
      }
      // P as wgmma's A fragments, 16 keys each: the accumulator layout of two 8-key tiles.
#pragma unroll
      for (int kc = 0; kc < C; ++kc)
#pragma unroll
        for (int u = 0; u < 4; ++u) p[kc][u] = pack2<T>(s[8 * kc + 2 * u], s[8 * kc + 2 * u + 1]);
      fence_regs(o);
      wgmma_fence();
#pragma unroll
      for (int kc = 0; kc < C; ++kc)  // 16 keys = 16 rows of 128 bytes of V
        wgmma_rs_tb<T>(o, p[kc], desc_sw128(v_addr + kc * 16 * 128));
      wgmma_commit();
      fence_regs(o);
      fence_frags(p);
    };
    by_chunks(n - kb, block);
  }
  wgmma_wait<0>();
  fence_regs(o);
  if (!active) return;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  // out through the warp's 16 rows of its warpgroup's Q tile (every wgmma that read it is
  // complete): 16-byte stores of whole rows instead of 4-byte pieces.
  unsigned char* stage = sQ + wg * kTileBytes;
  stage_rows<T>(stage, o, {1.0f / l_run[0], 1.0f / l_run[1]}, warp, lane);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = wq0 + warp * 16 + g + 8 * r;
    if (t4 == 0 && row < n) lse[bh * n + row] = (m_run[r] * scale_log2 + log2f(l_run[r])) * kLn2;
  }
  __syncwarp();
  copy_out_rows(stage, warp, lane, wq0, n,
                [&](int row) { return out + ((bi * n + row) * h + hi) * hd; });
}

template <typename T>
void fwd_sm90_launch(const void* qkv, void* out, float* lse, int64_t b, int64_t n, int64_t h,
                     cudaStream_t s) {
  const int q_blocks = static_cast<int>((n + kRowsSm90 - 1) / kRowsSm90);
  auto kernel = flash_fwd_sm90_kernel<T>;
  allow_smem(kernel, kSmemSm90);
  const float scale_log2 = kLog2e / 8.0f;  // 1/√64
  kernel<<<static_cast<unsigned>(b * h * q_blocks), kWarpgroups * 128, kSmemSm90, s>>>(
      static_cast<const T*>(qkv), static_cast<T*>(out), lse, static_cast<int>(n),
      static_cast<int>(h), q_blocks, scale_log2);
  CAI_CUDA_CHECK_LAUNCH();
}

// dK, dV and dSᵀ for hd = 64 (flash_bwd_dkdv_kernel's contract, flash_attention_bwd.cu): one CTA
// of one warpgroup per (batch·head, block of 64 keys), over blocks of 64 queries (Q, dO, lse, D in
// three cp.async stages, one barrier per block). Per block, all on wgmma m64n64k16:
//   Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (operands from shared memory, K-major: rows of K, V, Q, dO);
//   Pᵀ = exp(scale·Sᵀ − lse), dSᵀ = Pᵀ ⊙ (dPᵀ − D) in registers (the accumulator layout: a
//   thread's rows are keys, its columns queries); dSᵀ (rounded) to the scratch for the dQ kernel;
//   dV += Pᵀ·dO and dK += dSᵀ·Q with Pᵀ and dSᵀ from registers and dO, Q read N-major.
template <typename T>
__global__ void __launch_bounds__(128, 3)
    flash_bwd_dkdv_sm90_kernel(const T* __restrict__ qkv, const T* __restrict__ dout,
                               const float* __restrict__ lse, const float* __restrict__ Dsum,
                               T* __restrict__ dqkv, T* __restrict__ dst, int ld, int n, int h,
                               int k_blocks, float scale, float scale_log2) {
  constexpr int hd = 64;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw), base = (raw + 1023) & ~1023u;
  unsigned char* sK = smem_raw + (base - raw);
  unsigned char* sV = sK + kTileBytes;
  unsigned char* sQdO = sV + kTileBytes;  // stage s (of 3): Q at 2·s tiles, dO after it
  float* sLse = reinterpret_cast<float*>(sQdO + 6 * kTileBytes);       // [3][64]
  float* sD = sLse + 3 * 64;                                           // [3][64]
  unsigned char* sDS = reinterpret_cast<unsigned char*>(sD + 3 * 64);  // dSᵀ [64][64] swizzled

  const int64_t bh = blockIdx.x / k_blocks;
  const int kb = static_cast<int>(blockIdx.x % k_blocks) * 64;
  const HeadRows<T> head = head_rows(qkv, dout, bh, n, h, hd);
  const int64_t bi = head.bi, hi = head.hi, stride = head.stride, ostride = head.ostride;
  const T *Qg = head.q, *Kg = head.k, *Vg = head.v, *dOg = head.dout;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int kw0 = kb + warp * 16;

  // A block of 64 queries' Q, dO, lse and D into stage st, asynchronously (lse and D by 4-byte
  // copies: a head's rows are not 16-byte aligned). Past the last query everything is 0: there P
  // = 2^(scale·0 − 0) = 1, but dO = 0 and D = 0 make its dV, dK and dSᵀ terms 0.
  auto load_block = [&](int st, int q0) {
    unsigned char* dstq = sQdO + 2 * st * kTileBytes;
    load_sw128(dstq, Qg, stride, q0, n, 64);
    load_sw128(dstq + kTileBytes, dOg, ostride, q0, n, 64);
    load_lse_d(sLse + st * 64, sD + st * 64, lse, Dsum, bh, n, q0);
  };
  load_sw128(sK, Kg, stride, kb, n, 64);
  load_sw128(sV, Vg, stride, kb, n, 64);
  load_block(0, 0);
  cp_async_commit();
  load_block(1, 64);
  cp_async_commit();

  float dk[32], dv[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) dk[i] = dv[i] = 0.0f;
  const bool key_ok[2] = {kw0 + g < n, kw0 + g + 8 < n};
  const uint32_t k_addr = base, v_addr = base + kTileBytes;

  const int nq = (n + 63) / 64;
  for (int it = 0; it < nq; ++it) {
    const int q0 = it * 64, st = it % kBwdStages, nst = (it + 2) % kBwdStages;
    cp_async_wait_group<1>();
    fence_proxy_async();
    __syncthreads();  // block it visible (to wgmma too); every warp is past block it − 1
    if (it + 2 < nq) load_block(nst, q0 + 128);
    cp_async_commit();
    const uint32_t q_addr = base + 2 * kTileBytes + 2 * st * kTileBytes;
    const uint32_t do_addr = q_addr + kTileBytes;
    const float* lq = sLse + st * 64;
    const float* dd = sD + st * 64;

    // The block's C pieces of 16 queries (all 4 but in a head's last block).
    auto block = [&](auto chunks_tag, auto) {
      constexpr int C = decltype(chunks_tag)::value, kS = 8 * C;  // Sᵀ's registers
      float s[32], dp[32];
#pragma unroll
      for (int i = 0; i < kS; ++i) s[i] = dp[i] = 0.0f;
      fence_regs<kS>(s);
      fence_regs<kS>(dp);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < hd / 16; ++kk)
        wgmma_ss<T, 0, 0, 16 * C>(s, desc_sw128(k_addr + kk * 32), desc_sw128(q_addr + kk * 32),
                                  kk == 0);
#pragma unroll
      for (int kk = 0; kk < hd / 16; ++kk)
        wgmma_ss<T, 0, 0, 16 * C>(dp, desc_sw128(v_addr + kk * 32), desc_sw128(do_addr + kk * 32),
                                  kk == 0);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs<kS>(s);
      fence_regs<kS>(dp);

      // Pᵀ and dSᵀ; the keys past the last token (only in a head's last block of keys: a uniform
      // branch) get P = 0.
      auto elementwise = [&](auto full_tag) {
        constexpr bool kFull = decltype(full_tag)::value;
#pragma unroll
        for (int j = 0; j < 2 * C; ++j) {
          const float2 l2 = *reinterpret_cast<const float2*>(lq + j * 8 + 2 * t4);
          const float2 d2 = *reinterpret_cast<const float2*>(dd + j * 8 + 2 * t4);
          const float nl[2] = {-l2.x * kLog2e, -l2.y * kLog2e};  // lse in base 2
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float p = ex2(fmaf(s[4 * j + e], scale_log2, nl[e & 1]));
            if constexpr (!kFull) p = key_ok[e >> 1] ? p : 0.0f;
            s[4 * j + e] = p;
            dp[4 * j + e] = p * (dp[4 * j + e] - ((e & 1) ? d2.y : d2.x));
          }
        }
      };
      whole_or_tail(kb + 64 <= n, elementwise);
      uint32_t pa[4][4], da[4][4];
#pragma unroll
      for (int kc = 0; kc < C; ++kc) {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          pa[kc][u] = pack2<T>(s[8 * kc + 2 * u], s[8 * kc + 2 * u + 1]);
          da[kc][u] = pack2<T>(dp[8 * kc + 2 * u], dp[8 * kc + 2 * u + 1]);
        }
      }
      // dSᵀ (rounded as the dK product takes it) for the dQ kernel: rows of keys, ld queries
      // (zeros past the last query: P is 0 there, and the pieces past the block's C are not
      // computed). Each warp stages its 16 rows in shared memory (the swizzled layout:
      // conflict-free) and copies them out in 16-byte pieces while the dV/dK wgmma run.
      // da[kc][u]: 8-query tile 2·kc + u / 2, row g + 8·(u & 1).
#pragma unroll
      for (int j = 0; j < 2 * C; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r)
          *reinterpret_cast<uint32_t*>(sDS + sw128(warp * 16 + g + 8 * r, j) + 4 * t4) =
              da[j >> 1][2 * (j & 1) + r];
      __syncwarp();
      fence_regs(dv);
      fence_regs(dk);
      wgmma_fence();
#pragma unroll
      for (int kc = 0; kc < C; ++kc)  // 16 queries = 16 rows of 128 bytes of dO and of Q
        wgmma_rs_tb<T>(dv, pa[kc], desc_sw128(do_addr + kc * 16 * 128));
#pragma unroll
      for (int kc = 0; kc < C; ++kc) wgmma_rs_tb<T>(dk, da[kc], desc_sw128(q_addr + kc * 16 * 128));
      wgmma_commit();
      {
        const int c = lane & 7, q = q0 + 8 * c;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int rl = warp * 16 + (lane >> 3) + 4 * i, key = kb + rl;
          const uint4 v = c < 2 * C ? *reinterpret_cast<const uint4*>(sDS + sw128(rl, c))
                                    : make_uint4(0u, 0u, 0u, 0u);
          if (key < n && q < ld)
            *reinterpret_cast<uint4*>(dst + (bh * n + key) * static_cast<int64_t>(ld) + q) = v;
        }
      }
      wgmma_wait<0>();
      fence_regs(dv);
      fence_regs(dk);
    };
    by_chunks(n - q0, block);
  }
  // dK, then dV, through the warp's 16 rows of the K tile (every wgmma that read it is complete):
  // 16-byte stores of whole rows instead of 4-byte pieces.
  unsigned char* stage = smem_raw + (k_addr - smem_u32(smem_raw));
  auto store = [&](const float(&acc)[32], float mul, int64_t col) {
    stage_rows<T>(stage, acc, {mul, mul}, warp, lane);
    __syncwarp();
    copy_out_rows(stage, warp, lane, kb, n,
                  [&](int key) { return dqkv + (bi * n + key) * stride + col; });
    __syncwarp();
  };
  store(dk, scale, (h + hi) * hd);
  store(dv, 1.0f, (2 * h + hi) * hd);
}

// dQ = scale·dS·K for hd = 64 (flash_bwd_dq_kernel's contract): one CTA of kWarpgroups
// warpgroups per (batch·head, block of 64·kWarpgroups queries), over blocks of 64 keys (the dSᵀ
// tiles and K in three cp.async stages, one barrier per block): per block four m64n64k16 wgmma,
// A = dS read M-major from the dSᵀ tile [keys][64 queries] of the warpgroup, B = K read N-major.
// With bias_part: the CTA's partial column sums of dQ as stored (warp_column_sums /
// block_column_sums, as the mma.sync kernel), one row [64] per CTA. dQ leaves through shared
// memory in 16-byte pieces.
template <typename T>
__global__ void __launch_bounds__(kWarpgroups * 128, 2)
    flash_bwd_dq_sm90_kernel(const T* __restrict__ qkv, const T* __restrict__ dst, int ld,
                             T* __restrict__ dqkv, int n, int h, int q_blocks, float scale,
                             float* __restrict__ bias_part) {
  constexpr int hd = 64, kStage = (kWarpgroups + 1) * kTileBytes;  // dSᵀ tiles, then K
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw), base = (raw + 1023) & ~1023u;
  unsigned char* sm = smem_raw + (base - raw);
  float* red = reinterpret_cast<float*>(sm + kBwdStages * kStage);  // [warps][64]

  const int64_t bh = blockIdx.x / q_blocks;
  const int q0 = static_cast<int>(blockIdx.x % q_blocks) * kRowsSm90;
  const int64_t bi = bh / h, hi = bh % h;
  const int64_t stride = 3LL * h * hd;
  const T* Kg = qkv + bi * n * stride + (h + hi) * hd;
  const T* Ag = dst + bh * n * static_cast<int64_t>(ld);
  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int wq0 = q0 + wg * 64;

  // Keys [k0, k0 + 64) of dSᵀ, queries [q0, q0 + 64·kWarpgroups) as one swizzled tile per
  // warpgroup, and K's rows [k0, k0 + 64) (zeros past n keys and past ld queries: ld is a
  // multiple of 8, so a chunk of 8 is wholly inside or outside).
  auto load = [&](unsigned char* st, int k0) {
    for (int c = threadIdx.x; c < kWarpgroups * 64 * 8; c += blockDim.x) {
      const int w = c >> 9, r = (c >> 3) & 63, ch = c & 7;
      const int q = q0 + 64 * w + 8 * ch;
      const bool valid = k0 + r < n && q < ld;
      cp_async16(st + w * kTileBytes + sw128(r, ch),
                 valid ? Ag + static_cast<int64_t>(k0 + r) * ld + q : Ag, valid);
    }
    load_sw128(st + kWarpgroups * kTileBytes, Kg, stride, k0, n, 64);
  };
  load(sm, 0);
  cp_async_commit();
  const int nk = (n + 63) / 64;
  if (nk > 1) load(sm + kStage, 64);
  cp_async_commit();

  float dq[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) dq[i] = 0.0f;
  for (int it = 0; it < nk; ++it) {
    cp_async_wait_group<1>();
    fence_proxy_async();
    __syncthreads();  // block it visible (to wgmma too); every warpgroup is past block it − 1
    if (it + 2 < nk) load(sm + ((it + 2) % kBwdStages) * kStage, (it + 2) * 64);
    cp_async_commit();
    const uint32_t a_addr = base + (it % kBwdStages) * kStage + wg * kTileBytes;
    const uint32_t k_addr = base + (it % kBwdStages) * kStage + kWarpgroups * kTileBytes;
    // The block's C pieces of 16 keys (all 4 but in a head's last block).
    auto block = [&](auto chunks_tag, auto) {
      constexpr int C = decltype(chunks_tag)::value;
      fence_regs(dq);
      wgmma_fence();
#pragma unroll
      for (int kc = 0; kc < C; ++kc)  // 16 keys = 16 rows of 128 bytes of dSᵀ and of K
        wgmma_ss<T, 1, 1>(dq, desc_sw128(a_addr + kc * 2048), desc_sw128(k_addr + kc * 2048),
                          false);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(dq);
    };
    by_chunks(n - it * 64, block);
  }
  const int row0 = wq0 + warp * 16 + g;
  if (bias_part) {
    warp_column_sums<T, 64>(reinterpret_cast<const float(&)[8][4]>(dq), scale, row0 < n,
                            row0 + 8 < n, red);
    __syncthreads();
    block_column_sums<64>(red, bias_part + static_cast<int64_t>(blockIdx.x) * hd, hd);
  }
  // The warpgroup's dSᵀ tile of the last stage (read only by its own, finished wgmma) stages
  // its rows of dQ.
  unsigned char* stage = sm + ((nk - 1) % kBwdStages) * kStage + wg * kTileBytes;
  stage_rows<T>(stage, dq, {scale, scale}, warp, lane);
  __syncwarp();
  copy_out_rows(stage, warp, lane, wq0, n,
                [&](int row) { return dqkv + (bi * n + row) * stride + hi * hd; });
}

template <typename T>
void dq_sm90_launch(const void* qkv, const void* dst, int64_t ld, void* dqkv, int64_t b, int64_t n,
                    int64_t h, float* bias_part, cudaStream_t s) {
  const int q_blocks = flash_dq_sm90_blocks(n);
  constexpr size_t smem =
      kBwdStages * (kWarpgroups + 1) * kTileBytes + kWarpgroups * 4 * 64 * sizeof(float) + 1024;
  auto kernel = flash_bwd_dq_sm90_kernel<T>;
  allow_smem(kernel, smem);
  kernel<<<static_cast<unsigned>(b * h * q_blocks), kWarpgroups * 128, smem, s>>>(
      static_cast<const T*>(qkv), static_cast<const T*>(dst), static_cast<int>(ld),
      static_cast<T*>(dqkv), static_cast<int>(n), static_cast<int>(h), q_blocks, 0.125f, bias_part);
  CAI_CUDA_CHECK_LAUNCH();
}

template <typename T>
void dkdv_sm90_launch(const void* qkv, const void* dout, const float* lse, const float* D,
                      void* dqkv, void* dst, int64_t ld, int64_t b, int64_t n, int64_t h,
                      cudaStream_t s) {
  const int blocks = static_cast<int>((n + 63) / 64);
  constexpr size_t smem = 9 * kTileBytes + 6 * 64 * sizeof(float) + 1024;
  auto kernel = flash_bwd_dkdv_sm90_kernel<T>;
  allow_smem(kernel, smem);
  const float scale = 0.125f;  // 1/√64
  kernel<<<static_cast<unsigned>(b * h * blocks), 128, smem, s>>>(
      static_cast<const T*>(qkv), static_cast<const T*>(dout), lse, D, static_cast<T*>(dqkv),
      static_cast<T*>(dst), static_cast<int>(ld), static_cast<int>(n), static_cast<int>(h), blocks,
      scale, scale * kLog2e);
  CAI_CUDA_CHECK_LAUNCH();
}

}  // namespace

void flash_bwd_dkdv_sm90(DT t, const void* qkv, const void* dout, const float* lse, const float* D,
                         void* dqkv, void* dst, int64_t ld, int64_t b, int64_t n, int64_t h,
                         cudaStream_t s) {
  if (t == DT::BF16)
    dkdv_sm90_launch<__nv_bfloat16>(qkv, dout, lse, D, dqkv, dst, ld, b, n, h, s);
  else
    dkdv_sm90_launch<__half>(qkv, dout, lse, D, dqkv, dst, ld, b, n, h, s);
}

int flash_dq_sm90_blocks(int64_t n) {
  return static_cast<int>((n + kRowsSm90 - 1) / kRowsSm90);
}

void flash_bwd_dq_sm90(DT t, const void* qkv, const void* dst, int64_t ld, void* dqkv, int64_t b,
                       int64_t n, int64_t h, float* bias_part, cudaStream_t s) {
  if (t == DT::BF16)
    dq_sm90_launch<__nv_bfloat16>(qkv, dst, ld, dqkv, b, n, h, bias_part, s);
  else
    dq_sm90_launch<__half>(qkv, dst, ld, dqkv, b, n, h, bias_part, s);
}

void flash_fwd_sm90(DT t, const void* qkv, void* out, float* lse, int64_t b, int64_t n, int64_t h,
                    cudaStream_t s) {
  if (t == DT::BF16)
    fwd_sm90_launch<__nv_bfloat16>(qkv, out, lse, b, n, h, s);
  else
    fwd_sm90_launch<__half>(qkv, out, lse, b, n, h, s);
}

}  // namespace cai::kernels::cuda
