// The Hopper kernels of the fused attention (flash_attention_sm90.cu, compiled for sm_90a when the
// build's architectures include 90): flash_attention_fwd_t / _bwd_t call them for head dim 64 on a
// device of compute capability 9.0 (flash_attention_sm90_available, FlashKernel).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/base/dtype.h"

namespace cai::kernels::cuda {

// qkv[b, n, 3, h, 64] → out[b, n, h, 64], lse[b, h, n]; t = BF16 or F16, arguments checked by
// the caller.
void flash_fwd_sm90(DT t, const void* qkv, void* out, float* lse, int64_t b, int64_t n, int64_t h,
                    cudaStream_t s);
// The backward's dK/dV kernel for hd = 64 (flash_bwd_dkdv_kernel's contract): dK, dV into dqkv
// and dSᵀ into dst [b·h, n, ld] from qkv, dout, lse and D = rowsum(dO ⊙ O).
void flash_bwd_dkdv_sm90(DT t, const void* qkv, const void* dout, const float* lse, const float* D,
                         void* dqkv, void* dst, int64_t ld, int64_t b, int64_t n, int64_t h,
                         cudaStream_t s);

// The backward's dQ kernel for hd = 64 (flash_bwd_dq_kernel's contract) from the dSᵀ scratch:
// dQ into dqkv; with bias_part, one partial row [64] of dQ's column sums per CTA, CTA i's at
// bias_part + 64·i, flash_dq_sm90_blocks(n) CTAs per (batch, head).
int flash_dq_sm90_blocks(int64_t n);
void flash_bwd_dq_sm90(DT t, const void* qkv, const void* dst, int64_t ld, void* dqkv, int64_t b,
                       int64_t n, int64_t h, float* bias_part, cudaStream_t s);

}  // namespace cai::kernels::cuda
