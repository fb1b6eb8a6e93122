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

namespace {
Parameter sharded_parameter(const std::string& name, const Shape& full, bool weight_decay, int dim,
                            int groups, int part, int count) {
  CAI_CHECK(count >= 1 && part >= 0 && part < count && full[dim] % (groups * count) == 0,
            "[{}] dimension {} ({}) cannot be split into {} groups × {} parts", name, dim,
            full[dim], groups, count);
  Shape s = full;
  s[dim] /= count;
  Parameter p = make_parameter(name, s, weight_decay);
  if (count > 1) p.shard = ShardSpec{dim, groups, part, count, full};
  return p;
}
}  // namespace

Linear Linear::column(const std::string& name, int64_t in, int64_t out, int part, int count,
                      int groups) {
  Linear l;
  l.weight = sharded_parameter(name + ".weight", {out, in}, true, 0, groups, part, count);
  l.bias = sharded_parameter(name + ".bias", {out}, false, 0, groups, part, count);
  return l;
}

Linear Linear::row(const std::string& name, int64_t in, int64_t out, int part, int count) {
  Linear l;
  l.weight = sharded_parameter(name + ".weight", {out, in}, true, 1, 1, part, count);
  l.bias = make_parameter(name + ".bias", {out}, false);
  return l;
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

void LayerNorm::collect(std::vector<Parameter*>& out) {
  out.push_back(&weight);
  out.push_back(&bias);
}

}  // namespace cai::nn
