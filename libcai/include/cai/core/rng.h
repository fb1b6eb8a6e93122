// Layout-independent random initialisation on top of the counter-based Philox RNG
// (kernels/base/philox.h). A tensor drawn from (seed, stream) gets element i from offset i, so a
// parameter initialised whole or shard by shard (offset = shard start) holds the same values.
#pragma once
#include <cstdint>
#include <string>

#include "cai/core/tensor.h"

namespace cai::rng {

// A stable 64-bit stream id for a name (FNV-1a), e.g. a parameter's name.
uint64_t stream_of(const std::string& name);

void uniform_(Tensor& t, uint64_t seed, uint64_t stream, float lo, float hi, uint64_t offset = 0);
void normal_(Tensor& t, uint64_t seed, uint64_t stream, float mean, float std, uint64_t offset = 0);
// Normal(mean, std) truncated to [a, b] (absolute bounds, as torch.nn.init.trunc_normal_),
// by inverse-CDF so each element uses exactly one draw.
void trunc_normal_(Tensor& t, uint64_t seed, uint64_t stream, float mean, float std, float a,
                   float b, uint64_t offset = 0);

}  // namespace cai::rng
