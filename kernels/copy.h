// Batched span copies on the GPU: many (src, dst, n) element ranges copied in one launch, with the
// element type converted where the call's source and destination types differ (fp32 <-> bf16 or
// fp16, rounded to nearest even as cast). ZeRO's packing and unpacking (a bucket's gradients into
// its flat buffer, a gather's shards into the full parameters) is one launch per bucket instead
// of one device copy per parameter (and rank). The host reference is cai::copy_spans on CPU
// tensors (cai/core/tensor.h: one copy per span), which tests/cuda/test_cuda_copy_spans.cpp
// compares this against.
#pragma once
#include <cstdint>

#include "kernels/base/dtype.h"

namespace cai::kernels::cuda {

// dst[0, n) = src[0, n), src of the call's src_t, dst of its dst_t. Ranges must not overlap.
struct SpanDesc {
  const void* src;
  void* dst;
  int64_t n;
};

// At most kCopyMulti spans per launch (the descriptors travel as the kernel's parameters: no
// host-to-device copy of them); more take ceil(count / kCopyMulti) launches on `stream`.
constexpr int kCopyMulti = 64;
// accumulate: dst[k] += src[k] instead (the sum in fp32, rounded to dst's type; ZeRO-2/3's
// reduced gradient chunks added into the shards' gradients).
void copy_spans(DT src_t, DT dst_t, int count, const SpanDesc* spans, void* stream = nullptr,
                bool accumulate = false);

}  // namespace cai::kernels::cuda
