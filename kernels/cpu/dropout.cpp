#include "kernels/dropout.h"
#include "kernels/cpu/parallel.h"

#include "kernels/base/philox.h"

namespace cai::kernels::cpu {

namespace {
// Applies the mask: y = keep ? x / (1 - p) : 0. Used by forward (x) and backward (dy).
void masked_scale(const float* x, float* y, int64_t n, float p, uint64_t seed, uint64_t stream,
                  uint64_t offset) {
  const float keep_scale = 1.0f / (1.0f - p);
  parallel_for(n, 16384, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i)
      y[i] = philox::uniform(seed, stream, offset + i) >= p ? x[i] * keep_scale : 0.0f;
  });
}

// Strided mask: element i draws at offset + (i / row) · row_stride + (i % row), row > 0.
void strided_scale(const float* x, float* y, int64_t n, float p, uint64_t seed, uint64_t stream,
                   uint64_t offset, uint64_t row, uint64_t row_stride) {
  const float keep_scale = 1.0f / (1.0f - p);
  parallel_for(n, 16384, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) {
      const uint64_t u = static_cast<uint64_t>(i);
      const uint64_t pos = offset + (u / row) * row_stride + (u % row);
      y[i] = philox::uniform(seed, stream, pos) >= p ? x[i] * keep_scale : 0.0f;
    }
  });
}

void sample_scale(const float* x, float* y, int64_t b, int64_t per, float p, uint64_t seed,
                  uint64_t stream, uint64_t offset) {
  const float keep_scale = 1.0f / (1.0f - p);
  for (int64_t i = 0; i < b; ++i) {
    const float f = philox::uniform(seed, stream, offset + i) >= p ? keep_scale : 0.0f;
    for (int64_t j = 0; j < per; ++j) y[i * per + j] = x[i * per + j] * f;
  }
}
}  // namespace

void dropout_fwd(const float* x, float* y, int64_t n, float p, uint64_t seed, uint64_t stream,
                 uint64_t offset) {
  masked_scale(x, y, n, p, seed, stream, offset);
}
void dropout_bwd(const float* dy, float* dx, int64_t n, float p, uint64_t seed, uint64_t stream,
                 uint64_t offset) {
  masked_scale(dy, dx, n, p, seed, stream, offset);
}
void dropout_strided(const float* x, float* y, int64_t n, float p, uint64_t seed, uint64_t stream,
                     uint64_t offset, int64_t row, int64_t row_stride) {
  if (row <= 0)
    masked_scale(x, y, n, p, seed, stream, offset);
  else
    strided_scale(x, y, n, p, seed, stream, offset, static_cast<uint64_t>(row),
                  static_cast<uint64_t>(row_stride));
}
void drop_path_fwd(const float* x, float* y, int64_t b, int64_t per_sample, float p, uint64_t seed,
                   uint64_t stream, uint64_t offset) {
  sample_scale(x, y, b, per_sample, p, seed, stream, offset);
}
void drop_path_bwd(const float* dy, float* dx, int64_t b, int64_t per_sample, float p,
                   uint64_t seed, uint64_t stream, uint64_t offset) {
  sample_scale(dy, dx, b, per_sample, p, seed, stream, offset);
}

}  // namespace cai::kernels::cpu
