// Multi-head softmax attention from a fused qkv projection.
// qkv[b, n, 3, h, hd] (timm's layout of the qkv Linear output) -> out[b, n, h, hd].
// Forward saves the softmax probabilities probs[b, h, n, n] for the backward, which writes
// dqkv[b, n, 3, h, hd]. Scale is hd^-1/2.
#pragma once
#include <cstdint>

#include "kernels/base/dtype.h"

namespace cai::kernels {
namespace cpu {
void attention_fwd(const float* qkv, float* out, float* probs, int64_t b, int64_t n, int64_t h,
                   int64_t hd);
void attention_bwd(const float* qkv, const float* probs, const float* dout, float* dqkv, int64_t b,
                   int64_t n, int64_t h, int64_t hd);
}  // namespace cpu
namespace cuda {
void attention_fwd(const float* qkv, float* out, float* probs, int64_t b, int64_t n, int64_t h,
                   int64_t hd, void* stream = nullptr);
void attention_bwd(const float* qkv, const float* probs, const float* dout, float* dqkv, int64_t b,
                   int64_t n, int64_t h, int64_t hd, void* stream = nullptr);

// The same in bf16/fp16 (t != F32): qkv, out, probs, dout, dqkv in `t`; softmax and every
// reduction accumulate in fp32.
void attention_fwd_t(DT t, const void* qkv, void* out, void* probs, int64_t b, int64_t n, int64_t h,
                     int64_t hd, void* stream = nullptr);
void attention_bwd_t(DT t, const void* qkv, const void* probs, const void* dout, void* dqkv,
                     int64_t b, int64_t n, int64_t h, int64_t hd, void* stream = nullptr);

// Fused attention (t = BF16 or F16, hd a multiple of 8 and <= 128; flash_attention_supported()
// says whether a shape is handled). Forward writes out (type t) and lse[b, h, n] (fp32 log-sum-exp
// of each scaled score row) instead of the probabilities; backward recomputes them from qkv and lse
// and writes dqkv (type t, overwritten) from out, dout (type t). Pointers 16-byte aligned. With
// dbias (fp32, 3·h·hd values): the backward also adds the qkv linear's bias gradient into it, in a
// fixed order: q, the column sums of dQ as written; k, 0; v, the column sums of dout (what the
// column sums of dK and dV are in exact arithmetic: the softmax ignores a shift of a score row,
// and its rows sum to 1).
// kernels/cuda/flash_attention.cu (forward) and flash_attention_bwd.cu; the CPU-only build reports
// false / throws.
bool flash_attention_supported(DT t, int64_t hd);
// Which kernels (the forward, and the backward's dK/dV and dQ): Auto takes the Hopper ones (wgmma,
// kernels/cuda/flash_attention_sm90.cu) where flash_attention_sm90_available() and the environment
// does not set CAI_FLASH_SM90=0 (flash_attention_sm90_default()), else the mma.sync ones (any
// GPU); Portable is always the mma.sync ones; Sm90 the Hopper ones (an error where they are not
// available).
enum class FlashKernel { Auto, Portable, Sm90 };
// This build has the Hopper kernels (CUDA architectures include 90), the current device is compute
// capability 9.0, t is BF16/F16 and hd = 64.
bool flash_attention_sm90_available(DT t, int64_t hd);
bool flash_attention_sm90_default();
void flash_attention_fwd_t(DT t, const void* qkv, void* out, float* lse, int64_t b, int64_t n,
                           int64_t h, int64_t hd, void* stream = nullptr,
                           FlashKernel kernel = FlashKernel::Auto);
void flash_attention_bwd_t(DT t, const void* qkv, const void* out, const float* lse,
                           const void* dout, void* dqkv, int64_t b, int64_t n, int64_t h,
                           int64_t hd, float* dbias = nullptr, void* stream = nullptr,
                           FlashKernel kernel = FlashKernel::Auto);
}  // namespace cuda
}  // namespace cai::kernels
