// The base Plugin's default step (forward, backward, gradient clipping, state access for one
// process) and the step metrics (split from trainer.cpp).
#include "cai/train/trainer.h"

#include "cai/core/error.h"
#include "cai/ops/ops.h"
#include "kernels/device.h"

namespace cai::train {

void StepMetrics::add(const Tensor& losses, const Tensor& logits, const Tensor& labels) {
  if (!sums.defined()) sums = Tensor::zeros({2}, DType::F32, logits.device());
  ops::loss_metrics_(sums, losses, logits, labels);
  samples += static_cast<double>(labels.numel());
}

int64_t count_correct(const Tensor& logits, const Tensor& labels) {
  const auto l = logits.to_vector();
  const auto y = labels.to_vector();
  const int64_t b = logits.size(0), k = logits.size(1);
  int64_t correct = 0;
  for (int64_t i = 0; i < b; ++i) {
    int64_t arg = 0;
    for (int64_t j = 1; j < k; ++j)
      if (l[i * k + j] > l[i * k + arg]) arg = j;
    correct += arg == static_cast<int64_t>(y[i]);
  }
  return correct;
}

double sum_of(const Tensor& t) {
  double s = 0;
  for (float v : t.to_vector()) s += v;
  return s;
}

StepMetrics Plugin::forward_backward(nn::ViT& model, const std::vector<data::Batch>& batches,
                                     float weight, const Criterion& crit,
                                     const nn::ForwardCtx& step_ctx) {
  StepMetrics m;
  int64_t offset = 0;  // position of this batch's global batch within the step
  for (size_t i = 0; i < batches.size(); ++i) {
    const data::Batch& b = batches[i];
    nn::ForwardCtx ctx = step_ctx;
    ctx.sample_offset = offset + b.sample_offset;
    offset += b.global_batch_size;
    const nn::LayerHooks* hooks = train_hooks(i + 1 == batches.size());
    std::vector<std::unique_ptr<nn::Cache>> caches;
    Tensor logits = model.forward(b.images, caches, ctx, hooks);
    m.add(ops::cross_entropy_fwd(logits, b.labels, crit.label_smoothing), logits, b.labels);
    model.backward(ops::cross_entropy_bwd(logits, b.labels, crit.label_smoothing, weight), caches,
                   ctx, hooks);
  }
  return m;
}

StepMetrics Plugin::eval_batch(nn::ViT& model, const data::Batch& b) {
  std::vector<std::unique_ptr<nn::Cache>> caches;
  Tensor logits = model.forward(b.images, caches, nn::ForwardCtx{}, eval_hooks());
  StepMetrics m;
  m.add(ops::cross_entropy_fwd(logits, b.labels, 0.0f), logits, b.labels);
  return m;
}

std::vector<nn::Parameter*> optimizer_params(const optim::Optimizer& opt) {
  std::vector<nn::Parameter*> ps;
  for (const auto& g : opt.groups()) ps.insert(ps.end(), g.params.begin(), g.params.end());
  return ps;
}

std::map<std::string, Tensor> Plugin::full_model_state(nn::ViT& model) {
  std::map<std::string, Tensor> out;
  for (nn::Parameter* p : model.parameters()) {
    CAI_CHECK(p->value.defined() && !p->shard.sharded(),
              "[checkpoint] {}: the {} plugin cannot gather sharded parameter {}", name(), name(),
              p->name);
    out[p->name] = p->value.to(Device::cpu()).clone();
  }
  return out;
}

std::map<std::string, Tensor> Plugin::full_optimizer_state(nn::ViT&, optim::Optimizer& opt) {
  std::map<std::string, Tensor> out;
  for (auto& [k, v] : opt.state_dict()) out[k] = v.to(Device::cpu());
  return out;
}

void Plugin::load_optimizer_state(nn::ViT&, optim::Optimizer& opt,
                                  const std::map<std::string, Tensor>& full) {
  opt.load_state_dict(full);
}

std::vector<OwnedSlice> Plugin::owned_state(nn::ViT& model, optim::Optimizer& opt) {
  std::vector<OwnedSlice> out;
  auto whole = [&out](const std::string& name, bool optimizer, const Tensor& v) {
    Tensor c = v.to(Device::cpu());
    if (c.dtype() != DType::F32) c = c.to(DType::F32);
    out.push_back(OwnedSlice{name, optimizer, nn::ShardSpec{}, c.shape(), 0, c.numel(),
                             c.reshape({c.numel()}).clone()});
  };
  for (nn::Parameter* p : model.parameters()) {
    CAI_CHECK(p->value.defined() && !p->shard.sharded(),
              "[checkpoint] {}: the {} plugin cannot save sharded parameter {}", name(), name(),
              p->name);
    whole(p->name, false, p->value);
  }
  for (const auto& [k, v] : opt.state_dict()) whole(k, true, v);
  return out;
}

Tensor Plugin::clip_grad_norm(optim::Optimizer& opt, double max_norm) {
  // The factor applied by opt's next step (optimizer_step follows) where it can be.
  return optim::clip_grad_norm_async(optimizer_params(opt), max_norm, nullptr, nullptr, nullptr,
                                     &opt);
}

}  // namespace cai::train
