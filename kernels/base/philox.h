// Counter-based RNG (Philox4x32-10, Salmon et al. 2011). The value at (seed, stream, offset)
// depends on nothing else, so CPU and CUDA kernels, and any split of the model over ranks,
// draw the same numbers: initialisation and dropout masks do not depend on the parallel layout.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define CAI_HD __host__ __device__ __forceinline__
#else
#define CAI_HD inline
#endif

namespace cai::philox {

struct U32x4 {
  uint32_t v[4];
};

CAI_HD uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
}

// Four 32-bit words for block `counter` of (seed, stream).
CAI_HD U32x4 block(uint64_t seed, uint64_t stream, uint64_t counter) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = static_cast<uint32_t>(stream), c3 = static_cast<uint32_t>(stream >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = mulhilo(0xD2511F53u, c0, &hi0);
    const uint32_t lo1 = mulhilo(0xCD9E8D57u, c2, &hi1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return U32x4{{c0, c1, c2, c3}};
}

// A 64-bit mixing function (SplitMix64's finaliser): derives well-spread stream ids from small
// integers such as an epoch.
CAI_HD uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The 32-bit word at `offset` of the (seed, stream) sequence.
CAI_HD uint32_t word(uint64_t seed, uint64_t stream, uint64_t offset) {
  return block(seed, stream, offset >> 2).v[offset & 3];
}

// Uniform in [0, 1) with 24 random bits, the same float on every backend.
CAI_HD float to_uniform(uint32_t w) {
  return static_cast<float>(w >> 8) * (1.0f / 16777216.0f);
}

CAI_HD float uniform(uint64_t seed, uint64_t stream, uint64_t offset) {
  return to_uniform(word(seed, stream, offset));
}

// Standard normal at `offset` (Box-Muller over the two words of one half-block), in double so
// host and device agree to the last bit after rounding to float.
CAI_HD double normal(uint64_t seed, uint64_t stream, uint64_t offset) {
  const U32x4 b = block(seed, stream, offset >> 1);
  const int h = static_cast<int>(offset & 1) * 2;
  const double u1 = (static_cast<double>(b.v[h]) + 1.0) * (1.0 / 4294967296.0);  // (0, 1]
  const double u2 = static_cast<double>(b.v[h + 1]) * (1.0 / 4294967296.0);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

}  // namespace cai::philox
