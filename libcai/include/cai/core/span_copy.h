// Batched span copies between tensors: ZeRO's packing of gradients into buckets and of shards into
// gathers, and their unpacking, as one call per bucket (one kernel launch on a GPU) instead of one
// copy per parameter.
#pragma once
#include <cstdint>
#include <vector>

#include "cai/core/tensor.h"

namespace cai {

// One copy of copy_spans: flat elements dst[doff, doff + n) = src[soff, soff + n), converted to
// dst's dtype (fp32, bf16, fp16; rounded to nearest even) where src's differs.
struct SpanCopy {
  Tensor dst;
  int64_t doff = 0;
  Tensor src;
  int64_t soff = 0;
  int64_t n = 0;
};

// Every copy of `copies` (both tensors of each on one device; destinations must not overlap each
// other or a source). Host tensors: one copy per span (the reference). CUDA tensors:
// kernels::cuda::copy_spans, one launch per run of up to 64 consecutive spans with the same pair
// of dtypes, on the legacy default stream as Tensor::copy_from. Errors name the span whose range
// lies outside its tensors or whose devices differ.
void copy_spans(const std::vector<SpanCopy>& copies);
// The same spans added instead: dst[doff + k] += src[soff + k] (fp32 tensors; on the host one loop
// per span, the reference; CUDA: the same launches, accumulating).
void add_spans(const std::vector<SpanCopy>& copies);

}  // namespace cai
