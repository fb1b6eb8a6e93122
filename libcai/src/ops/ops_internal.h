// Internal to libcai/src/ops: the dispatch macro and the small tensor helpers that ops.cpp
// (linear, LayerNorm, GELU, attention, dropout) and ops_tokens.cpp (embedding, token ranges,
// cross-entropy, elementwise) share. Not installed.
#pragma once

#include "cai/ops/ops.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "cai/core/error.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/device.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/embed.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/linear.h"

// Calls kernels::cuda::fn or kernels::cpu::fn by the device of tensor t.
#define CAI_DISPATCH(t, fn, ...)             \
  do {                                       \
    if ((t).is_cuda())                       \
      ::cai::kernels::cuda::fn(__VA_ARGS__); \
    else                                     \
      ::cai::kernels::cpu::fn(__VA_ARGS__);  \
  } while (0)

namespace cai::ops::detail {

inline const float* f32(const Tensor& t) {
  return t.data<float>();
}
inline float* f32m(const Tensor& t) {
  return t.data<float>();
}
inline float* opt(Tensor* t) {
  return t ? t->data<float>() : nullptr;
}
inline bool is_half(DType t) {
  return t == DType::BF16 || t == DType::F16;
}
inline bool is_float(DType t) {
  return t == DType::F32 || is_half(t);
}
inline kernels::DT kdt(DType t) {
  return t == DType::F32    ? kernels::DT::F32
         : t == DType::BF16 ? kernels::DT::BF16
                            : kernels::DT::F16;
}
// fp32 view of a tensor for the CPU reference path (a converted copy when it is half).
inline Tensor up(const Tensor& t) {
  return t.dtype() == DType::F32 ? t : t.to(DType::F32);
}
// `t` in dtype `d` (a converted copy when it differs).
inline Tensor as(const Tensor& t, DType d) {
  return t.dtype() == d ? t : t.to(d);
}

inline void same_device(const char* op, const Tensor& a, const Tensor& b) {
  CAI_CHECK(a.device() == b.device(), "[{}] tensors on different devices: {} and {}", op, a.str(),
            b.str());
}
inline void f32_only(const char* op, const Tensor& t) {
  CAI_CHECK(t.dtype() == DType::F32, "[{}] expects fp32 tensors, got {}", op, t.str());
}
inline void floating(const char* op, const Tensor& t) {
  CAI_CHECK(t.defined() && is_float(t.dtype()), "[{}] expects an fp32, bf16 or fp16 tensor, got {}",
            op, t.str());
}
inline void floating_dtype(const char* op, DType d) {
  CAI_CHECK(is_float(d), "[{}] output dtype {} must be fp32, bf16 or fp16", op, dtype_name(d));
}
inline void check_grad(const char* op, const char* what, const Tensor* g, const Tensor& like) {
  if (!g) return;
  CAI_CHECK(g->shape() == like.shape() && g->device() == like.device(),
            "[{}] {} gradient {} does not match its parameter {}", op, what, g->str(), like.str());
  f32_only(op, *g);
}
inline int64_t rows_of(const Tensor& x) {
  return x.numel() / x.size(-1);
}
inline Shape with_last(const Shape& s, int64_t last) {
  Shape r = s;
  r.back() = last;
  return r;
}

}  // namespace cai::ops::detail
