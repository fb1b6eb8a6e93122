#include "cai/nn/module.h"

#include "cai/core/error.h"
#include "cai/core/rng.h"

namespace cai::nn {

uint64_t Parameter::init_stream() const {
  return rng::stream_of(name);
}

ops::RngKey ForwardCtx::key(const std::string& site, int64_t per_sample) const {
  // The step goes into the stream so every step draws fresh masks; the sample index goes into
  // the offset so micro-batches and data-parallel shards see the slices of one global mask.
  return ops::RngKey{seed, rng::stream_of(site) ^ (step * 0x9E3779B97F4A7C15ull),
                     static_cast<uint64_t>(sample_offset) * static_cast<uint64_t>(per_sample)};
}

ops::RngKey ForwardCtx::key_slice(const std::string& site, int64_t per_sample, int64_t begin,
                                  int64_t row, int64_t stride) const {
  ops::RngKey k = key(site, per_sample);
  k.offset += static_cast<uint64_t>(begin);
  k.row = static_cast<uint64_t>(row);
  k.row_stride = static_cast<uint64_t>(stride);
  return k;
}

Tensor Layer::backward_input(const Tensor& dy, std::unique_ptr<Cache>& cache,
                             const ForwardCtx& ctx) {
  ForwardCtx c = ctx;
  c.defer_weight_grads = true;
  return backward(dy, cache, c);
}

void Layer::backward_weight(std::unique_ptr<Cache>& cache) {
  // A layer that did everything in backward_input released its cache there.
  if (cache)
    for (auto& step : cache->weight_steps) step();
  cache.reset();
}

void WeightGrads::run(std::function<void()> f) {
  if (defer_)
    steps_.push_back(std::move(f));
  else
    f();
}

Tensor WeightGrads::into(Parameter& p) {
  if (!defer_) return p.grad;
  CAI_CHECK(p.grad.defined(), "[{}] split backward: the gradient is not allocated", p.name);
  Tensor part = Tensor::zeros(p.grad.shape(), DType::F32, p.grad.device());
  steps_.push_back([&p, part] { ops::add_(p.grad, part); });
  return part;
}

void WeightGrads::finish(std::unique_ptr<Cache>& cache) {
  cache.reset();
  if (!defer_) return;
  cache = std::make_unique<Cache>();
  cache->weight_steps = std::move(steps_);
}

Tensor linear_bwd(WeightGrads& wg, const Tensor& x, const Tensor& w, const Tensor& dy,
                  Parameter* weight, Parameter* bias) {
  if (!wg.deferred())
    return ops::linear_bwd(x, w, dy, weight ? &weight->grad : nullptr,
                           bias ? &bias->grad : nullptr);
  Tensor dx = ops::linear_bwd(x, w, dy, nullptr, nullptr);
  if (weight || bias)
    wg.run([x, dy, weight, bias] {
      ops::linear_bwd_weight(x, dy, weight ? &weight->grad : nullptr, bias ? &bias->grad : nullptr);
    });
  return dx;
}

Parameter make_parameter(const std::string& name, const Shape& shape, bool weight_decay) {
  Parameter p;
  p.name = name;
  p.value = Tensor::zeros(shape);
  p.grad = Tensor::zeros(shape);
  p.weight_decay = weight_decay;
  return p;
}

Linear::Linear(const std::string& name, int64_t in, int64_t out, bool bias) : has_bias(bias) {
  weight = make_parameter(name + ".weight", {out, in}, true);
  if (bias) this->bias = make_parameter(name + ".bias", {out}, false);
}

bool ShardSpec::same_part(int r, int s) const {
  for (size_t i = 0; i < cuts.size(); ++i)
    if (part(i, r) != part(i, s)) return false;
  return true;
}

bool ShardSpec::primary() const {
  if (!sharded()) return rank == 0;
  for (int r = 0; r < rank; ++r)
    if (same_part(r, rank)) return false;
  return true;
}

ShardSpec ShardSpec::split(const Shape& full, int dim, int groups, int part, int count) {
  ShardSpec s;
  s.full = full;
  s.rank = part, s.size = count;
  if (count > 1) s.cuts.push_back(ShardCut{dim, groups, count, 1});
  return s;
}

Shape shard_local_shape(const ShardSpec& spec, int r) {
  (void)r;  // every rank's part has the same shape (equal cuts)
  Shape s = spec.full;
  for (const ShardCut& c : spec.cuts) {
    CAI_CHECK(c.dim >= 0 && c.dim < static_cast<int>(s.size()) && c.groups >= 1 && c.count >= 1 &&
                  c.stride >= 1 && s[c.dim] % (c.groups * c.count) == 0,
              "[tensor_parallel] dimension {} ({} of {}) cannot be split into {} groups × {} parts",
              c.dim, c.dim < static_cast<int>(s.size()) ? s[c.dim] : -1, shape_str(spec.full),
              c.groups, c.count);
    s[c.dim] /= c.count;
  }
  return s;
}

Parameter make_sharded_parameter(const std::string& name, const ShardSpec& spec,
                                 bool weight_decay) {
  Parameter p;
  try {
    p = make_parameter(name, shard_local_shape(spec), weight_decay);
  } catch (const Error& e) {
    fail("[{}] {}", name, e.what());
  }
  if (spec.sharded()) p.shard = spec;
  return p;
}

Linear Linear::column(const std::string& name, int64_t in, int64_t out, int part, int count,
                      int groups) {
  return sharded(name, in, out, ShardSpec::split({out, in}, 0, groups, part, count),
                 ShardSpec::split({out}, 0, groups, part, count));
}

Linear Linear::row(const std::string& name, int64_t in, int64_t out, int part, int count) {
  return sharded(name, in, out, ShardSpec::split({out, in}, 1, 1, part, count),
                 ShardSpec::split({out}, 0, 1, 0, 1));
}

Linear Linear::sharded(const std::string& name, int64_t in, int64_t out, const ShardSpec& weight,
                       const ShardSpec& bias) {
  CAI_CHECK(weight.full == (Shape{out, in}) && bias.full == (Shape{out}),
            "[{}] shard specs {} and {} do not describe a Linear({}, {})", name,
            shape_str(weight.full), shape_str(bias.full), in, out);
  Linear l;
  l.weight = make_sharded_parameter(name + ".weight", weight, true);
  l.bias = make_sharded_parameter(name + ".bias", bias, false);
  return l;
}

ComputeCopies::ComputeCopies(DType t, std::initializer_list<Linear*> layers) {
  if (t == DType::F32) return;
  std::vector<const Tensor*> src;
  for (Linear* l : layers) {
    if (l->weight_c.defined() || !l->weight.value.defined() ||
        l->weight.value.dtype() != DType::F32)
      continue;
    set_.push_back(l);
    src.push_back(&l->weight.value);
    if (l->has_bias && l->bias.value.defined()) src.push_back(&l->bias.value);
  }
  if (set_.empty()) return;
  std::vector<Tensor> c = ops::to_dtype(src, t);
  size_t i = 0;
  for (Linear* l : set_) {
    l->weight_c = c[i++];
    if (l->has_bias && l->bias.value.defined()) l->bias_c = c[i++];
  }
}

ComputeCopies::ComputeCopies(const Kept& kept) {
  for (size_t i = 0; i < kept.layers.size(); ++i) {
    Linear* l = kept.layers[i];
    if (l->weight_c.defined()) continue;
    set_.push_back(l);
    l->weight_c = kept.weights[i];
    l->bias_c = kept.biases[i];
  }
}

ComputeCopies::Kept ComputeCopies::keep() const {
  Kept k;
  for (Linear* l : set_) {
    k.layers.push_back(l);
    k.weights.push_back(l->weight_c);
    k.biases.push_back(l->bias_c);
  }
  return k;
}

ComputeCopies::~ComputeCopies() {
  for (Linear* l : set_) l->weight_c = l->bias_c = Tensor();
}

void Linear::collect(std::vector<Parameter*>& out) {
  out.push_back(&weight);
  if (has_bias) out.push_back(&bias);
}

LayerNorm::LayerNorm(const std::string& name, int64_t dim, float e) : eps(e) {
  weight = make_parameter(name + ".weight", {dim}, false);
  bias = make_parameter(name + ".bias", {dim}, false);
  ops::fill_(weight.value, 1.0f);
}

LayerNorm::LayerNorm(const std::string& name, const ShardSpec& spec, float e) : eps(e) {
  weight = make_sharded_parameter(name + ".weight", spec, false);
  bias = make_sharded_parameter(name + ".bias", spec, false);
  ops::fill_(weight.value, 1.0f);
}

void LayerNorm::collect(std::vector<Parameter*>& out) {
  out.push_back(&weight);
  out.push_back(&bias);
}

}  // namespace cai::nn
