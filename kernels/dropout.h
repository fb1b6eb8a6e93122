// Dropout and drop-path (stochastic depth) with masks drawn from the counter-based RNG:
// element i of the mask is philox::uniform(seed, stream, offset + i) >= p, so the mask is the
// same on CPU and CUDA and does not depend on how the batch is split over ranks (offset is the
// global position of the first element). Kept values are scaled by 1/(1-p). The backward
// regenerates the mask instead of storing it.
//
// The strided variants serve a slice of a bigger logical tensor whose global element indices are
// not contiguous (a column block of each row, a token range of each sample): element i draws at
// offset + (i / row) · row_stride + (i % row). row <= 0 means contiguous (offset + i), the same
// mask as dropout_fwd. Forward and backward are the same call (same mask, scale 1/(1-p)).
#pragma once
#include <cstdint>

#include "kernels/base/dtype.h"

namespace cai::kernels {
namespace cpu {
void dropout_fwd(const float* x, float* y, int64_t n, float p, uint64_t seed, uint64_t stream,
                 uint64_t offset);
void dropout_bwd(const float* dy, float* dx, int64_t n, float p, uint64_t seed, uint64_t stream,
                 uint64_t offset);
// x[b, per_sample]: whole samples are dropped; sample i draws at offset + i.
void drop_path_fwd(const float* x, float* y, int64_t b, int64_t per_sample, float p, uint64_t seed,
                   uint64_t stream, uint64_t offset);
void drop_path_bwd(const float* dy, float* dx, int64_t b, int64_t per_sample, float p,
                   uint64_t seed, uint64_t stream, uint64_t offset);
void dropout_strided(const float* x, float* y, int64_t n, float p, uint64_t seed, uint64_t stream,
                     uint64_t offset, int64_t row, int64_t row_stride);
}  // namespace cpu
namespace cuda {
void dropout_fwd(const float* x, float* y, int64_t n, float p, uint64_t seed, uint64_t stream,
                 uint64_t offset, void* cuda_stream = nullptr);
void dropout_bwd(const float* dy, float* dx, int64_t n, float p, uint64_t seed, uint64_t stream,
                 uint64_t offset, void* cuda_stream = nullptr);
void drop_path_fwd(const float* x, float* y, int64_t b, int64_t per_sample, float p, uint64_t seed,
                   uint64_t stream, uint64_t offset, void* cuda_stream = nullptr);
void drop_path_bwd(const float* dy, float* dx, int64_t b, int64_t per_sample, float p,
                   uint64_t seed, uint64_t stream, uint64_t offset, void* cuda_stream = nullptr);

// Typed: input and output in t, same masks as the fp32 kernels.
void dropout_fwd_t(DT t, const void* x, void* y, int64_t n, float p, uint64_t seed, uint64_t stream,
                   uint64_t offset, void* cuda_stream = nullptr);
void drop_path_fwd_t(DT t, const void* x, void* y, int64_t b, int64_t per_sample, float p,
                     uint64_t seed, uint64_t stream, uint64_t offset, void* cuda_stream = nullptr);
// (the backward of both is the forward applied to dy: same mask, same scale)
// Strided dropout in t (fp32 included); masks bit-identical to cpu::dropout_strided.
void dropout_strided_t(DT t, const void* x, void* y, int64_t n, float p, uint64_t seed,
                       uint64_t stream, uint64_t offset, int64_t row, int64_t row_stride,
                       void* cuda_stream = nullptr);
}  // namespace cuda
}  // namespace cai::kernels
