// Element types of the typed (mixed-precision) kernels. Activations may be fp32, bf16 or fp16;
// parameters, their gradients and all statistics (mean, rstd, losses) stay fp32.
#pragma once
#include <cstdint>

namespace cai::kernels {

enum class DT : int { F32 = 0, BF16 = 1, F16 = 2 };

inline const char* dt_name(DT t) {
  return t == DT::F32 ? "fp32" : t == DT::BF16 ? "bf16" : "fp16";
}
inline int dt_size(DT t) {
  return t == DT::F32 ? 4 : 2;
}

}  // namespace cai::kernels
