// Patch embedding and token bookkeeping of the ViT.
//  patchify:    img[b, c, hh, ww] -> patches[b, (hh/p)·(ww/p), c·p·p] in (c, kh, kw) order, the
//               order of a Conv2d(stride = kernel = p) weight, so the conv becomes one GEMM.
//  cls_pos:     tokens[b, np, d], cls[d], pos[np+1, d] -> out[b, np+1, d] (class token first).
//  select_token: x[b, n, d] -> out[b, d] taking token `index` (the class token for the head).
// Backward kernels overwrite input gradients and accumulate parameter gradients.
#pragma once
#include <cstdint>

#include "kernels/base/dtype.h"

namespace cai::kernels {
namespace cpu {
void patchify(const float* img, float* patches, int64_t b, int64_t c, int64_t hh, int64_t ww,
              int64_t p);
void cls_pos_fwd(const float* tokens, const float* cls, const float* pos, float* out, int64_t b,
                 int64_t np, int64_t d);
void cls_pos_bwd(const float* dout, float* dtokens, float* dcls, float* dpos, int64_t b, int64_t np,
                 int64_t d);
void select_token_fwd(const float* x, float* out, int64_t b, int64_t n, int64_t d, int64_t index);
void select_token_bwd(const float* dout, float* dx, int64_t b, int64_t n, int64_t d, int64_t index);
}  // namespace cpu
namespace cuda {
void patchify(const float* img, float* patches, int64_t b, int64_t c, int64_t hh, int64_t ww,
              int64_t p, void* stream = nullptr);
void cls_pos_fwd(const float* tokens, const float* cls, const float* pos, float* out, int64_t b,
                 int64_t np, int64_t d, void* stream = nullptr);
void cls_pos_bwd(const float* dout, float* dtokens, float* dcls, float* dpos, int64_t b, int64_t np,
                 int64_t d, void* stream = nullptr);
void select_token_fwd(const float* x, float* out, int64_t b, int64_t n, int64_t d, int64_t index,
                      void* stream = nullptr);
void select_token_bwd(const float* dout, float* dx, int64_t b, int64_t n, int64_t d, int64_t index,
                      void* stream = nullptr);

// Typed: patches in pt (fp32 image in). cls_pos: tokens in tt, cls/pos fp32, out fp32 (the
// residual stream stays fp32); backward: dout fp32, dtokens in tt, dcls/dpos fp32 accumulated.
// select_token: x, out (and dout, dx) in t.
void patchify_t(const float* img, DT pt, void* patches, int64_t b, int64_t c, int64_t hh,
                int64_t ww, int64_t p, void* stream = nullptr);
void cls_pos_fwd_t(DT tt, const void* tokens, const float* cls, const float* pos, float* out,
                   int64_t b, int64_t np, int64_t d, void* stream = nullptr);
void cls_pos_bwd_t(const float* dout, DT tt, void* dtokens, float* dcls, float* dpos, int64_t b,
                   int64_t np, int64_t d, void* stream = nullptr);
void select_token_fwd_t(DT t, const void* x, void* out, int64_t b, int64_t n, int64_t d,
                        int64_t index, void* stream = nullptr);
void select_token_bwd_t(DT t, const void* dout, void* dx, int64_t b, int64_t n, int64_t d,
                        int64_t index, void* stream = nullptr);
}  // namespace cuda
}  // namespace cai::kernels
