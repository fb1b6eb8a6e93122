#include "kernels/optim.h"
#include "kernels/base/dtype.h"
#include "kernels/cpu/parallel.h"
#include "kernels/elementwise.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#ifdef __AVX2__
#include <immintrin.h>
#endif
#include <vector>

namespace cai::kernels::cpu {

void sgd_step(float* p, const float* grad, float* buf, int64_t n, float lr, float momentum,
              float dampening, float weight_decay, bool nesterov, bool first) {
  parallel_for(n, 16384, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) {
      float g = grad[i];
      if (weight_decay != 0.0f) g += weight_decay * p[i];
      if (momentum != 0.0f) {
        buf[i] = first ? g : momentum * buf[i] + (1.0f - dampening) * g;
        g = nesterov ? g + momentum * buf[i] : buf[i];
      }
      p[i] -= lr * g;
    }
  });
}

namespace {
// One Adam element, the reference formula (the AVX2 body below computes the same operations in
// the same order, eight lanes at a time).
inline void adam_element(float& p, float g, float& m, float& v, float beta1, float beta2, float eps,
                         float wd, float lr, float bc2_sqrt, float step_size, bool decoupled) {
  if (decoupled)
    p *= 1.0f - lr * wd;
  else if (wd != 0.0f)
    g += wd * p;
  m = beta1 * m + (1.0f - beta1) * g;
  v = beta2 * v + (1.0f - beta2) * g * g;
  const float denom = std::sqrt(v) / bc2_sqrt + eps;
  p -= step_size * (m / denom);
}
#ifdef __AVX2__
// Eight lanes of bf16_bits (kernels/base/dtype.h).
inline __m128i bf16x8(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
  // Pack the eight 32-bit lanes (each < 2^16) into 16 bits, in order.
  const __m256i packed = _mm256_packus_epi32(r, r);  // [0-3 0-3 | 4-7 4-7]
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}
#endif
}  // namespace

// HybridAdam's CPU step (Colossal-AI's cpu_adam): the pool's threads take contiguous ranges and
// each range runs eight lanes per AVX2 iteration (when built with CAI_NATIVE_SIMD) plus a scalar
// tail. Divisions and the square root are the correctly rounded ones, so lanes agree with the
// scalar formula up to the compiler's contraction of the tail into FMAs.
void adam_step(float* p, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
               float beta2, float eps, float weight_decay, int64_t step, bool decoupled,
               float grad_scale, uint16_t* out_bf16) {
  const bool scaled = grad_scale != 1.0f;
  const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(step));
  const float bc2_sqrt = std::sqrt(1.0f - std::pow(beta2, static_cast<float>(step)));
  const float step_size = lr / bc1;
  parallel_for(n, 16384, [&](int64_t s, int64_t e) {
    auto one = [&](int64_t k) {
      adam_element(p[k], scaled ? grad[k] * grad_scale : grad[k], m[k], v[k], beta1, beta2, eps,
                   weight_decay, lr, bc2_sqrt, step_size, decoupled);
      if (out_bf16) out_bf16[k] = bf16_bits(p[k]);
    };
    int64_t i = s;
#ifdef __AVX2__
    const __m256 b1 = _mm256_set1_ps(beta1), b2 = _mm256_set1_ps(beta2);
    const __m256 omb1 = _mm256_set1_ps(1.0f - beta1), omb2 = _mm256_set1_ps(1.0f - beta2);
    const __m256 veps = _mm256_set1_ps(eps), vbc2 = _mm256_set1_ps(bc2_sqrt);
    const __m256 vstep = _mm256_set1_ps(step_size), vwd = _mm256_set1_ps(weight_decay);
    const __m256 vdecay = _mm256_set1_ps(1.0f - lr * weight_decay);
    const __m256 vgs = _mm256_set1_ps(grad_scale);
    const bool l2 = !decoupled && weight_decay != 0.0f;
    // Where p, m and v are 32-byte aligned together (ZeRO-Offload's host shards are laid out so),
    // the results are stored past the caches (non-temporal): a multi-gigabyte step reads p, m, v
    // and the gradient once and writes p, m, v once, without reading the written lines first.
    auto aligned = [&](int64_t k) {
      return ((reinterpret_cast<uintptr_t>(p + k) | reinterpret_cast<uintptr_t>(m + k) |
               reinterpret_cast<uintptr_t>(v + k)) &
              31) == 0;
    };
    const int64_t first =
        s + static_cast<int64_t>((32 - (reinterpret_cast<uintptr_t>(p + s) & 31)) % 32 / 4);
    const bool stream = e - first >= 4096 && aligned(first);
    if (stream)
      for (; i < e && !aligned(i); ++i) one(i);
    // The bf16 copy (the offload's page-locked staging) past the caches too where it lines up:
    // a plain store first reads each line it writes (2 of the step's ~30 bytes an element).
    const bool stream_bf16 =
        stream && out_bf16 && (reinterpret_cast<uintptr_t>(out_bf16 + i) & 15) == 0;
    for (; i + 8 <= e; i += 8) {
      __m256 vp = _mm256_loadu_ps(p + i), g = _mm256_loadu_ps(grad + i);
      if (scaled) g = _mm256_mul_ps(g, vgs);
      if (decoupled)
        vp = _mm256_mul_ps(vp, vdecay);
      else if (l2)
        g = _mm256_add_ps(g, _mm256_mul_ps(vwd, vp));
      __m256 vm = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + i)), _mm256_mul_ps(omb1, g));
      __m256 vv = _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + i)),
                                _mm256_mul_ps(_mm256_mul_ps(omb2, g), g));
      const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vv), vbc2), veps);
      vp = _mm256_sub_ps(vp, _mm256_mul_ps(vstep, _mm256_div_ps(vm, denom)));
      if (stream) {
        _mm256_stream_ps(m + i, vm);
        _mm256_stream_ps(v + i, vv);
        _mm256_stream_ps(p + i, vp);
      } else {
        _mm256_storeu_ps(m + i, vm);
        _mm256_storeu_ps(v + i, vv);
        _mm256_storeu_ps(p + i, vp);
      }
      if (stream_bf16)
        _mm_stream_si128(reinterpret_cast<__m128i*>(out_bf16 + i), bf16x8(vp));
      else if (out_bf16)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out_bf16 + i), bf16x8(vp));
    }
    if (stream) _mm_sfence();  // the streamed stores are visible before the block ends
#endif
    for (; i < e; ++i) one(i);
  });
}

void lamb_update(const float* p, const float* grad, float* m, float* v, float* update, int64_t n,
                 float beta1, float beta2, float eps, float weight_decay, int64_t step) {
  const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(step));
  const float bc2 = 1.0f - std::pow(beta2, static_cast<float>(step));
  const float bc2_sqrt = std::sqrt(bc2);
  parallel_for(n, 16384, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) {
      const float g = grad[i];
      m[i] = beta1 * m[i] + (1.0f - beta1) * g;
      v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
      const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
      update[i] = (m[i] / bc1) / denom + weight_decay * p[i];
    }
  });
}

namespace {
// grad · grad_scale in `scaled` (grad itself when the scale is 1).
const float* scaled_grad(const float* grad, int64_t n, float grad_scale,
                         std::vector<float>& scaled) {
  if (grad_scale == 1.0f) return grad;
  scaled.resize(static_cast<size_t>(n));
  parallel_for(n, 16384, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) scaled[i] = grad[i] * grad_scale;
  });
  return scaled.data();
}
}  // namespace

void multi_tensor_adam(int count, float* const* p, const float* const* g, float* const* m,
                       float* const* v, const int64_t* n, const float* wd, float lr, float beta1,
                       float beta2, float eps, int64_t step, bool decoupled, float grad_scale) {
  for (int i = 0; i < count; ++i) {
    if (n[i] <= 0) continue;
    adam_step(p[i], g[i], m[i], v[i], n[i], lr, beta1, beta2, eps, wd[i], step, decoupled,
              grad_scale);
  }
}

void multi_tensor_lamb(int count, float* const* p, const float* const* g, float* const* m,
                       float* const* v, const int64_t* n, const float* wd, float lr, float beta1,
                       float beta2, float eps, int64_t step, float grad_scale) {
  std::vector<float> scaled, u;
  for (int i = 0; i < count; ++i) {
    if (n[i] <= 0) continue;
    u.resize(static_cast<size_t>(n[i]));
    lamb_update(p[i], scaled_grad(g[i], n[i], grad_scale, scaled), m[i], v[i], u.data(), n[i],
                beta1, beta2, eps, wd[i], step);
    // Trust ratio as Lamb::update (timm): ‖p‖/‖u‖ with weight decay and both norms positive.
    double trust = 1.0;
    if (wd[i] != 0.0f) {
      const double w_norm = std::sqrt(sum_squares(p[i], n[i]));
      const double u_norm = std::sqrt(sum_squares(u.data(), n[i]));
      if (w_norm > 0 && u_norm > 0) trust = w_norm / u_norm;
    }
    axpy(static_cast<float>(-static_cast<double>(lr) * trust), u.data(), p[i], n[i]);
  }
}

namespace {
// One block of squares_and_nonfinite: Σ x² in double and the inf/NaN count of x[0, n).
void block_squares(const float* x, int64_t n, double* sq, int64_t* bad) {
  int64_t i = 0;
  double acc = 0.0;
  int64_t c = 0;
#ifdef __AVX2__
  // Four independent accumulators of four doubles (one chain of dependent adds was bound by its
  // latency: 0.9 s a step over a 6.4B model's host gradients on 16 cores), added in a fixed
  // order: the result still depends on the blocks only.
  __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  const __m256 inf = _mm256_set1_ps(INFINITY);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (; i + 16 <= n; i += 16) {
    const __m256 u = _mm256_loadu_ps(x + i), w = _mm256_loadu_ps(x + i + 8);
    const __m256d u0 = _mm256_cvtps_pd(_mm256_castps256_ps128(u));
    const __m256d u1 = _mm256_cvtps_pd(_mm256_extractf128_ps(u, 1));
    const __m256d w0 = _mm256_cvtps_pd(_mm256_castps256_ps128(w));
    const __m256d w1 = _mm256_cvtps_pd(_mm256_extractf128_ps(w, 1));
    a0 = _mm256_add_pd(a0, _mm256_mul_pd(u0, u0));
    a1 = _mm256_add_pd(a1, _mm256_mul_pd(u1, u1));
    a2 = _mm256_add_pd(a2, _mm256_mul_pd(w0, w0));
    a3 = _mm256_add_pd(a3, _mm256_mul_pd(w1, w1));
    // Not finite: |x| not below infinity (unordered: NaN too).
    c += __builtin_popcount(static_cast<unsigned>(
        _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(u, abs_mask), inf, _CMP_NLT_UQ))));
    c += __builtin_popcount(static_cast<unsigned>(
        _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(w, abs_mask), inf, _CMP_NLT_UQ))));
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3)));
  acc = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
#endif
  for (; i < n; ++i) {
    acc += static_cast<double>(x[i]) * x[i];
    c += !std::isfinite(x[i]);
  }
  *sq = acc;
  *bad = c;
}

// The blocks of squares_and_nonfinite over x[0, n) on the CPU pool, `before(lo, hi)` run on each
// block first (add_with_squares: the add that makes it), then summed in block order.
template <typename Before>
std::pair<double, int64_t> blocked_squares(float* x, int64_t n, Before before) {
  const int64_t blocks = (n + kSquaresBlock - 1) / kSquaresBlock;
  std::vector<double> sq(blocks, 0.0);
  std::vector<int64_t> bad(blocks, 0);
  parallel_for(blocks, 1, [&](int64_t s, int64_t e) {
    for (int64_t b = s; b < e; ++b) {
      const int64_t lo = b * kSquaresBlock, hi = std::min(n, lo + kSquaresBlock);
      before(lo, hi);
      block_squares(x + lo, hi - lo, &sq[b], &bad[b]);
    }
  });
  double total = 0.0;
  int64_t count = 0;
  for (int64_t b = 0; b < blocks; ++b) total += sq[b], count += bad[b];
  return {total, count};
}

// The sum of squares of x[0, n) (as sum_squares: fixed blocks, so the result does not depend on
// the thread count) and how many elements are inf or NaN, in one pass over the CPU pool (a
// ZeRO-Offload shard of a 6.4B model is 6.4e9 elements on one GPU: one thread took seconds).
std::pair<double, int64_t> squares_and_nonfinite(const float* x, int64_t n) {
  return blocked_squares(const_cast<float*>(x), n, [](int64_t, int64_t) {});
}
}  // namespace

void add_with_squares(float* y, const float* x, int64_t n, bool assign, double* sq, int64_t* bad) {
  const auto [total, count] = blocked_squares(y, n, [&](int64_t lo, int64_t hi) {
    if (assign)
      std::memcpy(y + lo, x + lo, static_cast<size_t>(hi - lo) * sizeof(float));
    else
      for (int64_t k = lo; k < hi; ++k) y[k] += x[k];
  });
  *sq = total;
  *bad = count;
}

void multi_tensor_grad_stats(int count, float* const* x, const int64_t* n, const float* weight,
                             float scale, float* out) {
  double sq = 0.0, bad = 0.0;
  for (int i = 0; i < count; ++i) {
    if (n[i] <= 0) continue;
    if (scale != 1.0f) cpu::scale(scale, x[i], n[i]);
    const float w = weight ? weight[i] : 1.0f;
    const auto [part_sq, part_bad] = squares_and_nonfinite(x[i], n[i]);
    if (w != 0.0f) sq += static_cast<double>(w) * part_sq;
    bad += static_cast<double>(part_bad);
  }
  out[0] = static_cast<float>(sq);
  out[1] = static_cast<float>(bad);
}

void multi_tensor_clip(int count, float* const* x, const int64_t* n, const float* sq,
                       float max_norm, float* norm) {
  const float total = std::sqrt(sq[0]);
  if (norm) norm[0] = total;
  const float c = max_norm / (total + 1e-6f);
  if (!(c < 1.0f)) return;
  for (int i = 0; i < count; ++i)
    if (n[i] > 0) cpu::scale(c, x[i], n[i]);
}

}  // namespace cai::kernels::cpu
