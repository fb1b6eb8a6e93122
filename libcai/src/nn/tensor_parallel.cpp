#include "cai/nn/tensor_parallel.h"

#include <chrono>
#include <cstring>

#include "cai/core/error.h"
#include "cai/ops/ops.h"
#include "kernels/device.h"

namespace cai::nn {

namespace {

// The full shape viewed as [outer, groups, count, chunk, inner] along spec.dim.
struct Cut {
  int64_t outer = 1, groups = 1, count = 1, chunk = 1, inner = 1;
};

Cut cut_of(const Shape& full, const ShardSpec& s) {
  CAI_CHECK(s.dim >= 0 && s.dim < static_cast<int>(full.size()),
            "[tensor_parallel] shard dimension {} is outside shape {}", s.dim, shape_str(full));
  Cut c;
  for (int i = 0; i < s.dim; ++i) c.outer *= full[i];
  for (size_t i = s.dim + 1; i < full.size(); ++i) c.inner *= full[i];
  c.groups = s.groups;
  c.count = s.count;
  CAI_CHECK(s.groups >= 1 && s.count >= 1 && full[s.dim] % (s.groups * s.count) == 0,
            "[tensor_parallel] dimension {} of {} ({}) is not divisible by {} groups × {} parts",
            s.dim, shape_str(full), full[s.dim], s.groups, s.count);
  c.chunk = full[s.dim] / (s.groups * s.count);
  return c;
}

bool is_half(DType t) {
  return t == DType::BF16 || t == DType::F16;
}

}  // namespace

Shape shard_shape(const Shape& full, int dim, int count) {
  Shape s = full;
  s[dim] /= count;
  return s;
}

Tensor shard_of(const Tensor& full, const ShardSpec& s) {
  if (!s.sharded()) return full.clone();
  CAI_CHECK(!full.is_cuda(), "[tensor_parallel] shard_of works on CPU tensors, got {}", full.str());
  const Cut c = cut_of(full.shape(), s);
  CAI_CHECK(s.part >= 0 && s.part < s.count, "[tensor_parallel] part {} outside {} parts", s.part,
            s.count);
  Tensor out = Tensor::empty(shard_shape(full.shape(), s.dim, s.count), full.dtype());
  const size_t es = dtype_size(full.dtype()), run = static_cast<size_t>(c.chunk * c.inner) * es;
  const char* src = static_cast<const char*>(full.raw());
  char* dst = static_cast<char*>(out.raw());
  for (int64_t o = 0; o < c.outer; ++o)
    for (int64_t g = 0; g < c.groups; ++g) {
      const int64_t from = ((o * c.groups + g) * c.count + s.part), to = o * c.groups + g;
      std::memcpy(dst + to * run, src + from * run, run);
    }
  return out;
}

Tensor unshard(const std::vector<Tensor>& parts, const ShardSpec& s) {
  CAI_CHECK(!parts.empty(), "[tensor_parallel] unshard needs the parts");
  if (!s.sharded()) return parts.front().clone();
  CAI_CHECK(static_cast<int>(parts.size()) == s.count,
            "[tensor_parallel] unshard of {} needs {} parts, got {}", shape_str(s.full), s.count,
            parts.size());
  const Cut c = cut_of(s.full, s);
  const Shape part_shape = shard_shape(s.full, s.dim, s.count);
  Tensor out = Tensor::empty(s.full, parts.front().dtype());
  const size_t es = dtype_size(out.dtype()), run = static_cast<size_t>(c.chunk * c.inner) * es;
  char* dst = static_cast<char*>(out.raw());
  for (int p = 0; p < s.count; ++p) {
    const Tensor& t = parts[p];
    CAI_CHECK(!t.is_cuda() && t.shape() == part_shape && t.dtype() == out.dtype(),
              "[tensor_parallel] part {} of {} is {}, expected {} on the CPU", p, shape_str(s.full),
              t.str(), shape_str(part_shape));
    const char* src = static_cast<const char*>(t.raw());
    for (int64_t o = 0; o < c.outer; ++o)
      for (int64_t g = 0; g < c.groups; ++g) {
        const int64_t from = o * c.groups + g, to = (o * c.groups + g) * c.count + p;
        std::memcpy(dst + to * run, src + from * run, run);
      }
  }
  return out;
}

TensorParallel::TensorParallel(dist::Communicator& tp, std::string mode, bool sequence_parallel)
    : comm_(tp),
      mode_(std::move(mode)),
      sequence_parallel_(sequence_parallel),
      size_(tp.size()),
      rank_(tp.rank()) {
  CAI_CHECK(mode_ == "1d",
            "[tensor_parallel] mode '{}' is not supported yet (this build has 1d; 2d, 2.5d and 3d "
            "are planned)",
            mode_);
}

std::string TensorParallel::describe() const {
  return fmt::format("tp {} ({}{})", size_, mode_, sequence_parallel_ ? ", sequence parallel" : "");
}

std::pair<int64_t, int64_t> TensorParallel::token_range(int64_t tokens, int r) const {
  CAI_CHECK(tokens >= size_,
            "[tensor_parallel] sequence parallelism over {} ranks needs at least as many tokens, "
            "got {}",
            size_, tokens);
  return {tokens * r / size_, tokens * (r + 1) / size_};
}

std::pair<int64_t, int64_t> TensorParallel::feature_range(int64_t features, int r) const {
  CAI_CHECK(features % size_ == 0,
            "[tensor_parallel] {} features are not divisible by the tensor-parallel size {}",
            features, size_);
  const int64_t n = features / size_;
  return {n * r, n * (r + 1)};
}

void TensorParallel::complete(std::unique_ptr<dist::Work> w) {
  w->wait_on_device();
  pending_.push_back(std::move(w));
  while (!pending_.empty() && pending_.front()->test()) pending_.pop_front();
  while (pending_.size() > kMaxPending) {
    pending_.front()->wait();
    pending_.pop_front();
  }
}

void TensorParallel::drain() {
  for (auto& w : pending_) w->wait();
  pending_.clear();
}

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

double TensorParallel::profile_start(const Tensor& t) {
  if (!profiling_) return 0;
  if (t.is_cuda()) kernels::cuda::synchronize();
  return now_s();
}

void TensorParallel::profile_end(dist::Work* w, const Tensor& t, double t0) {
  if (!profiling_) return;
  if (w) w->wait();
  if (t.is_cuda()) kernels::cuda::synchronize();
  comm_seconds_ += now_s() - t0;
}

TensorParallel::Pending TensorParallel::all_reduce_start(const Tensor& t) {
  Pending p;
  p.dtype = t.dtype();
  p.result = !t.is_cuda() && is_half(t.dtype()) ? t.to(DType::F32) : t;
  const double tc = profile_start(t);
  if (size_ > 1) {
    comm_bytes_ += static_cast<int64_t>(t.nbytes());
    p.work = comm_.all_reduce_async(p.result, dist::ReduceOp::Sum);
  }
  profile_end(p.work.get(), t, tc);
  return p;
}

Tensor TensorParallel::finish(Pending p) {
  if (p.work) complete(std::move(p.work));
  return p.result.dtype() == p.dtype ? p.result : p.result.to(p.dtype);
}

Tensor TensorParallel::gather_tokens(const Tensor& part, int64_t tokens) {
  CAI_CHECK(part.dim() == 3,
            "[tensor_parallel] gather_tokens expects [batch, tokens, features], "
            "got {}",
            part.str());
  const auto [t0, t1] = my_tokens(tokens);
  CAI_CHECK(part.size(1) == t1 - t0, "[tensor_parallel] rank {} holds {} of {} tokens but got {}",
            rank_, t1 - t0, tokens, part.str());
  const int64_t b = part.size(0), f = part.size(2);
  if (size_ == 1) return part;
  const bool widen = !part.is_cuda() && is_half(part.dtype());
  const Tensor in = widen ? part.to(DType::F32) : part;
  const std::vector<int64_t> counts = token_counts(b, tokens, f);
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  Tensor staged = Tensor::empty({total}, in.dtype(), in.device());
  const double tc = profile_start(in);
  comm_bytes_ += total * static_cast<int64_t>(dtype_size(part.dtype()));
  auto w = comm_.all_gather_async(in.reshape({in.numel()}), staged, counts);
  profile_end(w.get(), in, tc);
  complete(std::move(w));
  Tensor full = Tensor::empty({b, tokens, f}, in.dtype(), in.device());
  int64_t off = 0;
  for (int r = 0; r < size_; ++r) {
    const auto [a, e] = token_range(tokens, r);
    if (e > a)
      ops::copy_tokens_(full, a, staged.narrow(off, counts[r]).reshape({b, e - a, f}), 0, e - a);
    off += counts[r];
  }
  return widen ? full.to(part.dtype()) : full;
}

std::vector<int64_t> TensorParallel::token_counts(int64_t batch, int64_t tokens,
                                                  int64_t features) const {
  std::vector<int64_t> counts(size_);
  for (int r = 0; r < size_; ++r) {
    const auto [a, e] = token_range(tokens, r);
    counts[r] = batch * (e - a) * features;
  }
  return counts;
}

TensorParallel::Pending TensorParallel::reduce_scatter_tokens_start(const Tensor& full) {
  CAI_CHECK(full.dim() == 3,
            "[tensor_parallel] reduce_scatter_tokens expects [batch, tokens, features], got {}",
            full.str());
  Pending p;
  p.dtype = full.dtype();
  if (size_ == 1) {
    p.result = full;
    return p;
  }
  const int64_t b = full.size(0), tokens = full.size(1), f = full.size(2);
  const Tensor in = !full.is_cuda() && is_half(full.dtype()) ? full.to(DType::F32) : full;
  const std::vector<int64_t> counts = token_counts(b, tokens, f);
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  Tensor staged = Tensor::empty({total}, in.dtype(), in.device());
  int64_t off = 0;
  for (int r = 0; r < size_; ++r) {
    const auto [a, e] = token_range(tokens, r);
    Tensor view = staged.narrow(off, counts[r]).reshape({b, e - a, f});
    if (e > a) ops::copy_tokens_(view, 0, in, a, e - a);
    off += counts[r];
  }
  const auto [t0, t1] = my_tokens(tokens);
  p.result = Tensor::empty({b, t1 - t0, f}, in.dtype(), in.device());
  Tensor flat = p.result.reshape({p.result.numel()});
  const double tc = profile_start(in);
  comm_bytes_ += static_cast<int64_t>(full.nbytes());
  p.work = comm_.reduce_scatter_async(staged, flat, counts, dist::ReduceOp::Sum);
  profile_end(p.work.get(), in, tc);
  return p;
}

Tensor TensorParallel::slice_tokens(const Tensor& full) const {
  CAI_CHECK(full.dim() == 3,
            "[tensor_parallel] slice_tokens expects [batch, tokens, features], "
            "got {}",
            full.str());
  const auto [t0, t1] = my_tokens(full.size(1));
  Tensor out = Tensor::empty({full.size(0), t1 - t0, full.size(2)}, full.dtype(), full.device());
  ops::copy_tokens_(out, 0, full, t0, t1 - t0);
  return out;
}

Tensor TensorParallel::pad_tokens(const Tensor& part, int64_t tokens) const {
  const auto [t0, t1] = my_tokens(tokens);
  CAI_CHECK(part.dim() == 3 && part.size(1) == t1 - t0,
            "[tensor_parallel] pad_tokens: rank {} holds {} of {} tokens, got {}", rank_, t1 - t0,
            tokens, part.str());
  Tensor full = Tensor::zeros({part.size(0), tokens, part.size(2)}, part.dtype(), part.device());
  ops::copy_tokens_(full, t0, part, 0, t1 - t0);
  return full;
}

Tensor TensorParallel::slice_features(const Tensor& x) const {
  CAI_CHECK(x.dim() == 2, "[tensor_parallel] slice_features expects [rows, features], got {}",
            x.str());
  const int64_t rows = x.size(0), f = x.size(1);
  const auto [c0, c1] = feature_range(f, rank_);
  Tensor out = Tensor::empty({rows, c1 - c0}, x.dtype(), x.device());
  Tensor o3 = out.reshape({rows, c1 - c0, 1});
  ops::copy_tokens_(o3, 0, x.reshape({rows, f, 1}), c0, c1 - c0);
  return out;
}

Tensor TensorParallel::gather_features(const Tensor& part) {
  CAI_CHECK(part.dim() == 2, "[tensor_parallel] gather_features expects [rows, features], got {}",
            part.str());
  if (size_ == 1) return part;
  const int64_t rows = part.size(0), n = part.size(1), f = n * size_;
  const bool widen = !part.is_cuda() && is_half(part.dtype());
  const Tensor in = widen ? part.to(DType::F32) : part;
  Tensor staged = Tensor::empty({rows * f}, in.dtype(), in.device());
  const double tc = profile_start(in);
  comm_bytes_ += rows * f * static_cast<int64_t>(dtype_size(part.dtype()));
  auto w = comm_.all_gather_async(in.reshape({in.numel()}), staged,
                                  std::vector<int64_t>(size_, rows * n));
  profile_end(w.get(), in, tc);
  complete(std::move(w));
  Tensor full = Tensor::empty({rows, f, 1}, in.dtype(), in.device());
  for (int r = 0; r < size_; ++r)
    ops::copy_tokens_(full, r * n, staged.narrow(r * rows * n, rows * n).reshape({rows, n, 1}), 0,
                      n);
  Tensor out = full.reshape({rows, f});
  return widen ? out.to(part.dtype()) : out;
}

Tensor row_linear_fwd(TensorParallel* tp, const Tensor& x, Linear& l) {
  const bool split = tp && tp->size() > 1;
  Tensor y =
      ops::linear_fwd(x, l.weight.value, !split || tp->rank() == 0 ? &l.bias.value : nullptr);
  if (!split) return y;
  return tp->sequence_parallel() ? tp->reduce_scatter_tokens(y) : tp->all_reduce(y);
}

Tensor column_linear_bwd(TensorParallel* tp, const Tensor& x, Linear& l, const Tensor& dy) {
  if (!tp || tp->size() == 1)
    return ops::linear_bwd(x, l.weight.value, dy, &l.weight.grad, &l.bias.grad);
  // The weight and the output gradient in the compute dtype once for both halves (linear_bwd
  // would round them again for each).
  const Tensor w = x.dtype() == DType::F32 ? l.weight.value : l.weight.value.to(x.dtype());
  const Tensor g = dy.dtype() == x.dtype() ? dy : dy.to(x.dtype());
  Tensor dx = ops::linear_bwd(x, w, g, nullptr, nullptr, true);
  auto pending =
      tp->sequence_parallel() ? tp->reduce_scatter_tokens_start(dx) : tp->all_reduce_start(dx);
  ops::linear_bwd(x, w, g, &l.weight.grad, &l.bias.grad, false);
  return tp->finish(std::move(pending));
}

namespace {
struct LinearCache : Cache {
  Tensor x;
};
}  // namespace

ParallelLinear::ParallelLinear(const std::string& name, int64_t in, int64_t out, Kind kind,
                               TensorParallel* tp)
    : name_(name), kind_(kind), tp_(tp) {
  const int T = tp ? tp->size() : 1, r = tp ? tp->rank() : 0;
  CAI_CHECK(kind == Kind::Whole || !tp || !tp->sequence_parallel(),
            "[{}] ParallelLinear has no sequence-parallel form", name);
  if (kind == Kind::Column)
    lin = Linear::column(name, in, out, r, T);
  else if (kind == Kind::Row)
    lin = Linear::row(name, in, out, r, T);
  else
    lin = Linear(name, in, out);
}

Tensor ParallelLinear::forward(const Tensor& x, std::unique_ptr<Cache>& cache, const ForwardCtx&) {
  auto c = std::make_unique<LinearCache>();
  c->x = x;
  Tensor y = kind_ == Kind::Row ? row_linear_fwd(tp_, x, lin)
                                : ops::linear_fwd(x, lin.weight.value, &lin.bias.value);
  cache = std::move(c);
  return y;
}

Tensor ParallelLinear::backward(const Tensor& dy, std::unique_ptr<Cache>& cache,
                                const ForwardCtx&) {
  auto* c = dynamic_cast<LinearCache*>(cache.get());
  CAI_CHECK(c, "[{}] backward called without a matching forward cache", name_);
  Tensor dx = kind_ == Kind::Column
                  ? column_linear_bwd(tp_, c->x, lin, dy)
                  : ops::linear_bwd(c->x, lin.weight.value, dy, &lin.weight.grad, &lin.bias.grad);
  cache.reset();
  return dx;
}

}  // namespace cai::nn
