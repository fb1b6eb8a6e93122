// Patch embedding and token bookkeeping on the GPU: the twins of kernels/cpu/embed.cpp.
// Backward kernels overwrite input gradients and accumulate (+=) parameter gradients.
#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/typed.cuh"
#include "kernels/embed.h"

namespace cai::kernels::cuda {

namespace {

// The image element of patches[b, gh·gw, c·p·p] element o ((c, ky, kx) order in a row), in the
// index type I (int64_t, or uint32_t for the 4-wide kernel's fewer than 2^31 elements).
template <typename I>
__device__ __forceinline__ I patch_source(I o, I c, I hh, I ww, I p, I gh, I gw) {
  const I row = c * p * p;
  const I r = o % row;  // (ci·p + ky)·p + kx
  const I f = o / row;  // (bi·gh + py)·gw + px
  const I kx = r % p, ky = (r / p) % p, ci = r / (p * p);
  const I px = f % gw, py = (f / gw) % gh, bi = f / (gw * gh);
  return ((bi * c + ci) * hh + py * p + ky) * ww + px * p + kx;
}

// One thread per output element of patches[b, gh·gw, c·p·p].
// The typed kernels are these templates with a half type for the token-side tensors.
template <typename TO>
__global__ void patchify_kernel(const float* __restrict__ img, TO* __restrict__ patches,
                                int64_t total, int64_t c, int64_t hh, int64_t ww, int64_t p,
                                int64_t gh, int64_t gw) {
  for (int64_t o = first_index(); o < total; o += grid_step())
    patches[o] = from_f32<TO>(img[patch_source(o, c, hh, ww, p, gh, gw)]);
}

// out[b, np+1, d]: token 0 = cls + pos[0], token t ≥ 1 = tokens[t-1] + pos[t].
template <typename TT>
__global__ void cls_pos_fwd_kernel(const TT* __restrict__ tokens, const float* __restrict__ cls,
                                   const float* __restrict__ pos, float* __restrict__ out,
                                   int64_t total, int64_t np, int64_t d) {
  const int64_t per = (np + 1) * d;
  for (int64_t o = first_index(); o < total; o += grid_step()) {
    const int64_t bi = o / per, r = o % per;
    out[o] = r < d ? cls[r] + pos[r] : to_f32(tokens[bi * np * d + (r - d)]) + pos[r];
  }
}

// dtokens[b, np, d] = dout[b, 1:, d].
template <typename TT>
__global__ void cls_pos_dtokens_kernel(const float* __restrict__ dout, TT* __restrict__ dtokens,
                                       int64_t total, int64_t np, int64_t d) {
  const int64_t per = np * d;
  for (int64_t o = first_index(); o < total; o += grid_step()) {
    const int64_t bi = o / per, r = o % per;
    dtokens[o] = from_f32<TT>(dout[bi * (per + d) + d + r]);
  }
}

// One thread per (token, feature) element i of [(np+1)·d]: the batch sum of dout[:, i] in double,
// in batch order; dpos[i] += it, and dcls[i] += it for the class token (i < d).
__global__ void cls_pos_dparam_kernel(const float* __restrict__ dout, float* dcls, float* dpos,
                                      int64_t b, int64_t n, int64_t d) {
  for (int64_t i = first_index(); i < n; i += grid_step()) {
    double s = 0.0;
    for (int64_t bi = 0; bi < b; ++bi) s += dout[bi * n + i];
    if (dpos) dpos[i] += static_cast<float>(s);
    if (dcls && i < d) dcls[i] += static_cast<float>(s);
  }
}

// out[b, d] = x[b, index, d].
template <typename T>
__global__ void select_token_fwd_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t total,
                                        int64_t n, int64_t d, int64_t index) {
  for (int64_t o = first_index(); o < total; o += grid_step()) {
    const int64_t bi = o / d, j = o % d;
    out[o] = x[(bi * n + index) * d + j];
  }
}

// dx[b, n, d] = dout[b, d] at token `index`, 0 elsewhere (every element is written).
template <typename T>
__global__ void select_token_bwd_kernel(const T* __restrict__ dout, T* __restrict__ dx,
                                        int64_t total, int64_t n, int64_t d, int64_t index) {
  for (int64_t o = first_index(); o < total; o += grid_step()) {
    const int64_t j = o % d, t = (o / d) % n, bi = o / (n * d);
    dx[o] = t == index ? dout[bi * d + j] : from_f32<T>(0.0f);
  }
}
// The typed paths' fast forms: 4 consecutive elements per thread (rows whose lengths are
// multiples of 4, pointers that allow vector access) and 32-bit index arithmetic (fewer than
// 2^31 elements), the same values as the kernels above.
inline bool fits32(int64_t n) {
  return n < (int64_t{1} << 31);
}
__device__ __forceinline__ uint32_t first_index32() {
  return blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ uint32_t grid_step32() {
  return gridDim.x * blockDim.x;
}

template <typename TO>
__global__ void patchify4_kernel(const float* __restrict__ img, TO* __restrict__ patches,
                                 uint32_t groups, uint32_t c, uint32_t hh, uint32_t ww, uint32_t p,
                                 uint32_t gh, uint32_t gw) {
  for (uint32_t g = first_index32(); g < groups; g += grid_step32()) {
    float v[4];  // kx .. kx + 3 of one image row (p is a multiple of 4)
    load_vec(img + patch_source(g * 4, c, hh, ww, p, gh, gw), v);
    store_vec(patches + g * 4, v);
  }
}

template <typename TT>
__global__ void cls_pos_fwd4_kernel(const TT* __restrict__ tokens, const float* __restrict__ cls,
                                    const float* __restrict__ pos, float* __restrict__ out,
                                    uint32_t groups, uint32_t np, uint32_t d) {
  const uint32_t per = (np + 1) * d;
  for (uint32_t g = first_index32(); g < groups; g += grid_step32()) {
    const uint32_t o = g * 4, bi = o / per, r = o % per;
    float a[4], b[4];
    load_vec(pos + r, b);
    if (r < d)
      load_vec(cls + r, a);
    else
      load_vec(tokens + bi * np * d + (r - d), a);
#pragma unroll
    for (int e = 0; e < 4; ++e) a[e] += b[e];
    store_vec(out + o, a);
  }
}

template <typename TT>
__global__ void cls_pos_dtokens4_kernel(const float* __restrict__ dout, TT* __restrict__ dtokens,
                                        uint32_t groups, uint32_t np, uint32_t d) {
  const uint32_t per = np * d;
  for (uint32_t g = first_index32(); g < groups; g += grid_step32()) {
    const uint32_t o = g * 4, bi = o / per, r = o % per;
    float a[4];
    load_vec(dout + bi * (per + d) + d + r, a);
    store_vec(dtokens + o, a);
  }
}

template <typename T>
__global__ void select_token_bwd4_kernel(const T* __restrict__ dout, T* __restrict__ dx,
                                         uint32_t groups, uint32_t n, uint32_t d, uint32_t index) {
  for (uint32_t g = first_index32(); g < groups; g += grid_step32()) {
    const uint32_t o = g * 4, j = o % d, t = (o / d) % n, bi = o / (n * d);
    float a[4] = {0.f, 0.f, 0.f, 0.f};
    if (t == index) load_vec(dout + bi * d + j, a);
    store_vec(dx + o, a);
  }
}
}  // namespace

// The fp32 entry points are the typed ones with fp32 tokens.
void patchify(const float* img, float* patches, int64_t b, int64_t c, int64_t hh, int64_t ww,
              int64_t p, void* stream) {
  patchify_t(img, DT::F32, patches, b, c, hh, ww, p, stream);
}

void cls_pos_fwd(const float* tokens, const float* cls, const float* pos, float* out, int64_t b,
                 int64_t np, int64_t d, void* stream) {
  cls_pos_fwd_t(DT::F32, tokens, cls, pos, out, b, np, d, stream);
}

void cls_pos_bwd(const float* dout, float* dtokens, float* dcls, float* dpos, int64_t b, int64_t np,
                 int64_t d, void* stream) {
  cls_pos_bwd_t(dout, DT::F32, dtokens, dcls, dpos, b, np, d, stream);
}

void select_token_fwd(const float* x, float* out, int64_t b, int64_t n, int64_t d, int64_t index,
                      void* stream) {
  select_token_fwd_t(DT::F32, x, out, b, n, d, index, stream);
}

void select_token_bwd(const float* dout, float* dx, int64_t b, int64_t n, int64_t d, int64_t index,
                      void* stream) {
  select_token_bwd_t(DT::F32, dout, dx, b, n, d, index, stream);
}

void patchify_t(const float* img, DT pt, void* patches, int64_t b, int64_t c, int64_t hh,
                int64_t ww, int64_t p, void* stream) {
  if (p <= 0) return;
  const int64_t gh = hh / p, gw = ww / p;
  const int64_t total = b * gh * gw * c * p * p;
  if (total <= 0) return;
  dispatch_dt(pt, "patchify", [&](auto tag) {
    using T = decltype(tag);
    if (p % 4 == 0 && ww % 4 == 0 && fits32(total) && fits32(b * c * hh * ww) &&
        vec_aligned<float, 4>(img) && vec_aligned<T, 4>(patches)) {
      patchify4_kernel<T><<<grid_for(total / 4), kBlock, 0, as_stream(stream)>>>(
          img, static_cast<T*>(patches), static_cast<uint32_t>(total / 4), c, hh, ww, p, gh, gw);
    } else {
      patchify_kernel<T><<<grid_for(total), kBlock, 0, as_stream(stream)>>>(
          img, static_cast<T*>(patches), total, c, hh, ww, p, gh, gw);
    }
    CAI_CUDA_CHECK_LAUNCH();
  });
}

void cls_pos_fwd_t(DT tt, const void* tokens, const float* cls, const float* pos, float* out,
                   int64_t b, int64_t np, int64_t d, void* stream) {
  const int64_t total = b * (np + 1) * d;
  if (total <= 0) return;
  dispatch_dt(tt, "cls_pos", [&](auto tag) {
    using T = decltype(tag);
    if (d % 4 == 0 && fits32(total) && vec_aligned<T, 4>(tokens) && vec_aligned<float, 4>(cls) &&
        vec_aligned<float, 4>(pos) && vec_aligned<float, 4>(out)) {
      cls_pos_fwd4_kernel<T><<<grid_for(total / 4), kBlock, 0, as_stream(stream)>>>(
          static_cast<const T*>(tokens), cls, pos, out, static_cast<uint32_t>(total / 4), np, d);
    } else {
      cls_pos_fwd_kernel<T><<<grid_for(total), kBlock, 0, as_stream(stream)>>>(
          static_cast<const T*>(tokens), cls, pos, out, total, np, d);
    }
    CAI_CUDA_CHECK_LAUNCH();
  });
}

void cls_pos_bwd_t(const float* dout, DT tt, void* dtokens, float* dcls, float* dpos, int64_t b,
                   int64_t np, int64_t d, void* stream) {
  const auto s = as_stream(stream);
  const int64_t ntok = b * np * d;
  if (dtokens && ntok > 0) {
    dispatch_dt(tt, "cls_pos", [&](auto tag) {
      using T = decltype(tag);
      if (d % 4 == 0 && fits32(b * (np + 1) * d) && vec_aligned<float, 4>(dout) &&
          vec_aligned<T, 4>(dtokens)) {
        cls_pos_dtokens4_kernel<T><<<grid_for(ntok / 4), kBlock, 0, s>>>(
            dout, static_cast<T*>(dtokens), static_cast<uint32_t>(ntok / 4), np, d);
      } else {
        cls_pos_dtokens_kernel<T>
            <<<grid_for(ntok), kBlock, 0, s>>>(dout, static_cast<T*>(dtokens), ntok, np, d);
      }
      CAI_CUDA_CHECK_LAUNCH();
    });
  }
  const int64_t n = (np + 1) * d;
  if ((dcls || dpos) && n > 0 && b > 0) {
    cls_pos_dparam_kernel<<<grid_for(n), kBlock, 0, s>>>(dout, dcls, dpos, b, n, d);
    CAI_CUDA_CHECK_LAUNCH();
  }
}

void select_token_fwd_t(DT t, const void* x, void* out, int64_t b, int64_t n, int64_t d,
                        int64_t index, void* stream) {
  const int64_t total = b * d;
  if (total <= 0) return;
  CAI_CHECK(index >= 0 && index < n, "[select_token] token {} out of range for {} tokens", index,
            n);
  dispatch_dt(t, "select_token", [&](auto tag) {
    using T = decltype(tag);
    select_token_fwd_kernel<T><<<grid_for(total), kBlock, 0, as_stream(stream)>>>(
        static_cast<const T*>(x), static_cast<T*>(out), total, n, d, index);
    CAI_CUDA_CHECK_LAUNCH();
  });
}

void select_token_bwd_t(DT t, const void* dout, void* dx, int64_t b, int64_t n, int64_t d,
                        int64_t index, void* stream) {
  const int64_t total = b * n * d;
  if (total <= 0) return;
  CAI_CHECK(index >= 0 && index < n, "[select_token] token {} out of range for {} tokens", index,
            n);
  dispatch_dt(t, "select_token", [&](auto tag) {
    using T = decltype(tag);
    if (d % 4 == 0 && fits32(total) && vec_aligned<T, 4>(dout) && vec_aligned<T, 4>(dx)) {
      select_token_bwd4_kernel<T><<<grid_for(total / 4), kBlock, 0, as_stream(stream)>>>(
          static_cast<const T*>(dout), static_cast<T*>(dx), static_cast<uint32_t>(total / 4), n, d,
          index);
    } else {
      select_token_bwd_kernel<T><<<grid_for(total), kBlock, 0, as_stream(stream)>>>(
          static_cast<const T*>(dout), static_cast<T*>(dx), total, n, d, index);
    }
    CAI_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace cai::kernels::cuda
