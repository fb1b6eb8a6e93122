#include "cai/core/span_copy.h"

#include "cai/core/error.h"
#include "kernels/copy.h"

namespace cai {

namespace {
kernels::DT kernel_dtype(DType d) {
  CAI_CHECK(d == DType::F32 || d == DType::BF16 || d == DType::F16,
            "[copy_spans] dtype {}: expected fp32, bf16 or fp16", dtype_name(d));
  return d == DType::F32    ? kernels::DT::F32
         : d == DType::BF16 ? kernels::DT::BF16
                            : kernels::DT::F16;
}
}  // namespace

namespace {
void run_spans(const std::vector<SpanCopy>& copies, bool accumulate) {
  const char* op = accumulate ? "add_spans" : "copy_spans";
  std::vector<kernels::cuda::SpanDesc> run;
  DType rs = DType::F32, rd = DType::F32;
  auto flush = [&] {
    if (!run.empty())
      kernels::cuda::copy_spans(kernel_dtype(rs), kernel_dtype(rd), static_cast<int>(run.size()),
                                run.data(), nullptr, accumulate);
    run.clear();
  };
  for (size_t i = 0; i < copies.size(); ++i) {
    const SpanCopy& c = copies[i];
    CAI_CHECK(c.n >= 0 && c.doff >= 0 && c.soff >= 0 && c.dst.defined() && c.src.defined() &&
                  c.doff + c.n <= c.dst.numel() && c.soff + c.n <= c.src.numel(),
              "[{}] span {}: {} elements from offset {} of {} to offset {} of {}: expected "
              "ranges inside both tensors",
              op, i, c.n, c.soff, c.src.defined() ? c.src.str() : "undefined", c.doff,
              c.dst.defined() ? c.dst.str() : "undefined");
    CAI_CHECK(c.dst.device() == c.src.device(),
              "[{}] span {}: source on {}, destination on {}: expected one device", op, i,
              c.src.device().str(), c.dst.device().str());
    CAI_CHECK(!accumulate || (c.dst.dtype() == DType::F32 && c.src.dtype() == DType::F32),
              "[add_spans] span {}: {} into {}: expected fp32 tensors", i, c.src.str(),
              c.dst.str());
    if (c.n == 0) continue;
    Tensor d = c.dst.reshape({c.dst.numel()}).narrow(c.doff, c.n);
    Tensor s = c.src.reshape({c.src.numel()}).narrow(c.soff, c.n);
    if (!d.is_cuda()) {  // the reference: one copy (or one loop of sums) per span
      if (accumulate) {
        float* y = d.data<float>();
        const float* x = s.data<float>();
        for (int64_t k = 0; k < c.n; ++k) y[k] += x[k];
      } else {
        d.copy_from(s.dtype() == d.dtype() ? s : s.to(d.dtype()));
      }
      continue;
    }
    kernel_dtype(d.dtype());
    kernel_dtype(s.dtype());
    if (!run.empty() && (rs != s.dtype() || rd != d.dtype())) flush();
    rs = s.dtype();
    rd = d.dtype();
    run.push_back({s.raw(), d.raw(), c.n});
  }
  flush();
}
}  // namespace

void copy_spans(const std::vector<SpanCopy>& copies) {
  run_spans(copies, false);
}

void add_spans(const std::vector<SpanCopy>& copies) {
  run_spans(copies, true);
}

}  // namespace cai
