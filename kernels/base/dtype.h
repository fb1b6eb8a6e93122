// Element types of the typed (mixed-precision) kernels. Activations may be fp32, bf16 or fp16;
// parameters, their gradients and all statistics (mean, rstd, losses) stay fp32.
#pragma once
#include <cstdint>
#include <cstring>

namespace cai::kernels {

enum class DT : int { F32 = 0, BF16 = 1, F16 = 2 };

inline const char* dt_name(DT t) {
  return t == DT::F32 ? "fp32" : t == DT::BF16 ? "bf16" : "fp16";
}
inline int dt_size(DT t) {
  return t == DT::F32 ? 4 : 2;
}

// fp32 -> bf16 bits, round to nearest even, a NaN kept a quiet NaN of its sign: the one rule of
// the host (cai::float_to_bf16, the CPU Adam's bf16 copies) and the GPU (typed.cuh).
inline uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace cai::kernels
