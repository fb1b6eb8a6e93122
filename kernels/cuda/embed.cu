// Patch embedding and token bookkeeping on the GPU: the twins of kernels/cpu/embed.cpp.
// Backward kernels overwrite input gradients and accumulate (+=) parameter gradients.
#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/typed.cuh"
#include "kernels/embed.h"

namespace cai::kernels::cuda {

namespace {

// One thread per output element of patches[b, gh·gw, c·p·p] ((c, ky, kx) order in a row).
// The typed kernels are these templates with a half type for the token-side tensors.
template <typename TO>
__global__ void patchify_kernel(const float* __restrict__ img, TO* __restrict__ patches,
                                int64_t total, int64_t c, int64_t hh, int64_t ww, int64_t p,
                                int64_t gh, int64_t gw) {
  const int64_t row = c * p * p;
  for (int64_t o = first_index(); o < total; o += grid_step()) {
    const int64_t r = o % row;  // (ci·p + ky)·p + kx
    const int64_t f = o / row;  // (bi·gh + py)·gw + px
    const int64_t kx = r % p, ky = (r / p) % p, ci = r / (p * p);
    const int64_t px = f % gw, py = (f / gw) % gh, bi = f / (gw * gh);
    patches[o] = from_f32<TO>(img[((bi * c + ci) * hh + py * p + ky) * ww + px * p + kx]);
  }
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
}  // namespace

void patchify(const float* img, float* patches, int64_t b, int64_t c, int64_t hh, int64_t ww,
              int64_t p, void* stream) {
  if (p <= 0) return;  // nothing defined to write (the CPU kernel would divide by zero)
  const int64_t gh = hh / p, gw = ww / p;
  const int64_t total = b * gh * gw * c * p * p;
  if (total <= 0) return;
  patchify_kernel<<<grid_for(total), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
      img, patches, total, c, hh, ww, p, gh, gw);
  CAI_CUDA_CHECK_LAUNCH();
}

void cls_pos_fwd(const float* tokens, const float* cls, const float* pos, float* out, int64_t b,
                 int64_t np, int64_t d, void* stream) {
  const int64_t total = b * (np + 1) * d;
  if (total <= 0) return;
  cls_pos_fwd_kernel<<<grid_for(total), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
      tokens, cls, pos, out, total, np, d);
  CAI_CUDA_CHECK_LAUNCH();
}

void cls_pos_bwd(const float* dout, float* dtokens, float* dcls, float* dpos, int64_t b, int64_t np,
                 int64_t d, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const int64_t ntok = b * np * d;
  if (dtokens && ntok > 0) {
    cls_pos_dtokens_kernel<<<grid_for(ntok), kBlock, 0, s>>>(dout, dtokens, ntok, np, d);
    CAI_CUDA_CHECK_LAUNCH();
  }
  const int64_t n = (np + 1) * d;
  if ((dcls || dpos) && n > 0 && b > 0) {
    cls_pos_dparam_kernel<<<grid_for(n), kBlock, 0, s>>>(dout, dcls, dpos, b, n, d);
    CAI_CUDA_CHECK_LAUNCH();
  }
}

void select_token_fwd(const float* x, float* out, int64_t b, int64_t n, int64_t d, int64_t index,
                      void* stream) {
  const int64_t total = b * d;
  if (total <= 0) return;
  CAI_CHECK(index >= 0 && index < n, "[select_token] token {} out of range for {} tokens", index,
            n);
  select_token_fwd_kernel<<<grid_for(total), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
      x, out, total, n, d, index);
  CAI_CUDA_CHECK_LAUNCH();
}

void select_token_bwd(const float* dout, float* dx, int64_t b, int64_t n, int64_t d, int64_t index,
                      void* stream) {
  const int64_t total = b * n * d;
  if (total <= 0) return;
  CAI_CHECK(index >= 0 && index < n, "[select_token] token {} out of range for {} tokens", index,
            n);
  select_token_bwd_kernel<<<grid_for(total), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
      dout, dx, total, n, d, index);
  CAI_CUDA_CHECK_LAUNCH();
}

void patchify_t(const float* img, DT pt, void* patches, int64_t b, int64_t c, int64_t hh,
                int64_t ww, int64_t p, void* stream) {
  if (p <= 0) return;
  const int64_t gh = hh / p, gw = ww / p;
  const int64_t total = b * gh * gw * c * p * p;
  if (total <= 0) return;
  dispatch_dt(pt, "patchify", [&](auto tag) {
    using T = decltype(tag);
    patchify_kernel<T><<<grid_for(total), kBlock, 0, as_stream(stream)>>>(
        img, static_cast<T*>(patches), total, c, hh, ww, p, gh, gw);
    CAI_CUDA_CHECK_LAUNCH();
  });
}

void cls_pos_fwd_t(DT tt, const void* tokens, const float* cls, const float* pos, float* out,
                   int64_t b, int64_t np, int64_t d, void* stream) {
  const int64_t total = b * (np + 1) * d;
  if (total <= 0) return;
  dispatch_dt(tt, "cls_pos", [&](auto tag) {
    using T = decltype(tag);
    cls_pos_fwd_kernel<T><<<grid_for(total), kBlock, 0, as_stream(stream)>>>(
        static_cast<const T*>(tokens), cls, pos, out, total, np, d);
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
      cls_pos_dtokens_kernel<T>
          <<<grid_for(ntok), kBlock, 0, s>>>(dout, static_cast<T*>(dtokens), ntok, np, d);
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
    select_token_bwd_kernel<T><<<grid_for(total), kBlock, 0, as_stream(stream)>>>(
        static_cast<const T*>(dout), static_cast<T*>(dx), total, n, d, index);
    CAI_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace cai::kernels::cuda
