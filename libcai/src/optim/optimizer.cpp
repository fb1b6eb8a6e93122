#include "cai/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "cai/core/error.h"
#include "cai/ops/ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/optim.h"

namespace cai::optim {

std::vector<ParamGroup> weight_decay_groups(const std::vector<nn::Parameter*>& params, double lr,
                                            double weight_decay) {
  ParamGroup decay, no_decay;
  decay.lr = decay.base_lr = no_decay.lr = no_decay.base_lr = lr;
  decay.weight_decay = weight_decay;
  for (nn::Parameter* p : params) (p->weight_decay ? decay : no_decay).params.push_back(p);
  std::vector<ParamGroup> out;
  if (!decay.params.empty()) out.push_back(decay);
  if (!no_decay.params.empty()) out.push_back(no_decay);
  return out;
}

Optimizer::Optimizer(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {
  for (auto& g : groups_) {
    CAI_CHECK(g.lr >= 0, "[optimizer] learning rate {} must be non-negative", g.lr);
    CAI_CHECK(g.weight_decay >= 0, "[optimizer] weight decay {} must be non-negative",
              g.weight_decay);
    g.base_lr = g.lr;
    for (nn::Parameter* p : g.params)
      CAI_CHECK(p->value.dtype() == DType::F32 && p->grad.shape() == p->value.shape(),
                "[optimizer] parameter {} needs an fp32 value and a gradient of the same shape",
                p->name);
  }
}

namespace {
// Gradients grouped by device (in practice one group), as the multi-tensor kernels take them.
struct GradLists {
  Device device;
  std::vector<float*> x;
  std::vector<int64_t> n;
  std::vector<float> w;
};
std::vector<GradLists> grad_lists(const std::vector<nn::Parameter*>& params,
                                  const std::function<double(const nn::Parameter&)>& weight) {
  std::vector<GradLists> out;
  for (nn::Parameter* p : params) {
    if (!p->grad.defined() || p->grad.numel() == 0) continue;
    CAI_CHECK(p->grad.dtype() == DType::F32, "[grad_stats] gradient of {} is {}, expected fp32",
              p->name, p->grad.str());
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const GradLists& l) { return l.device == p->grad.device(); });
    if (it == out.end()) it = out.insert(out.end(), GradLists{p->grad.device(), {}, {}, {}});
    it->x.push_back(p->grad.data<float>());
    it->n.push_back(p->grad.numel());
    it->w.push_back(weight ? static_cast<float>(weight(*p)) : 1.0f);
  }
  return out;
}
// The kernels' form of sum_replicas's offsets (null for none).
std::optional<kernels::GradReplicas> replicas_of(const std::vector<int64_t>* delta) {
  if (!delta || delta->empty()) return std::nullopt;
  CAI_CHECK(delta->size() <= static_cast<size_t>(kernels::kMaxGradReplicas),
            "[optimizer] {} gradient replicas: at most {}", delta->size(),
            kernels::kMaxGradReplicas);
  kernels::GradReplicas r;
  r.n = static_cast<int>(delta->size());
  for (int k = 0; k < r.n; ++k) r.delta[k] = (*delta)[k];
  return r;
}
Tensor stats_of(GradLists& l, float scale, const std::vector<int64_t>* replicas = nullptr) {
  Tensor out = Tensor::empty({2}, DType::F32, l.device);
  const int count = static_cast<int>(l.x.size());
  const auto reps = replicas_of(replicas);
  CAI_CHECK(!reps || l.device.is_cuda(),
            "[grad_stats] gradient replicas are GPU memory; the gradients are on {}",
            l.device.str());
  if (l.device.is_cuda())
    kernels::cuda::multi_tensor_grad_stats(count, l.x.data(), l.n.data(), l.w.data(), scale,
                                           out.data<float>(), nullptr, reps ? &*reps : nullptr);
  else
    kernels::cpu::multi_tensor_grad_stats(count, l.x.data(), l.n.data(), l.w.data(), scale,
                                          out.data<float>());
  return out;
}
void clip_with(GradLists& l, const Tensor& sq, float max_norm, Tensor* norm) {
  const int count = static_cast<int>(l.x.size());
  float* nrm = norm ? norm->data<float>() : nullptr;
  if (l.device.is_cuda())
    kernels::cuda::multi_tensor_clip(count, l.x.data(), l.n.data(), sq.data<float>(), max_norm,
                                     nrm);
  else
    kernels::cpu::multi_tensor_clip(count, l.x.data(), l.n.data(), sq.data<float>(), max_norm, nrm);
}
// Whether `opt` steps exactly the parameters `params` (a deferred clip scales what opt steps).
bool steps_exactly(const Optimizer& opt, const std::vector<nn::Parameter*>& params) {
  std::set<const nn::Parameter*> mine;
  for (const auto& g : opt.groups()) mine.insert(g.params.begin(), g.params.end());
  const std::set<const nn::Parameter*> given(params.begin(), params.end());
  return mine == given;
}
}  // namespace

void Optimizer::step() {
  ++step_;
  for (auto& g : groups_) {
    if (clip_sq_.defined() && !fuses_clip(g)) {
      // No fused path for this group: its gradients scaled in place first, as clip_grad_norm.
      for (GradLists& l : grad_lists(g.params, nullptr)) clip_with(l, clip_sq_, clip_max_, nullptr);
    }
    step_group(g);
  }
  clip_sq_ = Tensor();
  replicas_.clear();
}

void Optimizer::step_ordered(const std::vector<nn::Parameter*>& order,
                             const std::function<uint16_t*(size_t)>& mirror,
                             const std::function<void(size_t)>& done) {
  ordered_step(order, mirror, done)();
}

std::function<void()> Optimizer::ordered_step(std::vector<nn::Parameter*> order,
                                              std::function<uint16_t*(size_t)> mirror,
                                              std::function<void(size_t)> done) {
  std::map<const nn::Parameter*, size_t> group_of;
  for (size_t g = 0; g < groups_.size(); ++g)
    for (const nn::Parameter* p : groups_[g].params) {
      CAI_CHECK(!p->value.is_cuda() && !p->grad.is_cuda(),
                "[optimizer] {}: an ordered step needs every parameter in host memory; {} is on {}",
                name(), p->name, p->value.device().str());
      group_of[p] = g;
    }
  CAI_CHECK(replicas_.empty(), "[optimizer] {}: an ordered step reads no gradient replicas",
            name());
  std::set<const nn::Parameter*> seen;
  for (const nn::Parameter* p : order) {
    CAI_CHECK(p && group_of.count(p) && seen.insert(p).second,
              "[optimizer] {}: the ordered step's parameter {} is in no group or listed twice",
              name(), p ? p->name : std::string("null"));
  }
  CAI_CHECK(order.size() == group_of.size(),
            "[optimizer] {}: the ordered step lists {} of the groups' {} parameters", name(),
            order.size(), group_of.size());
  ++step_;
  // The groups as they are now (a scheduler may set the next step's lr while this one runs).
  std::vector<size_t> group(order.size());
  for (size_t i = 0; i < order.size(); ++i) group[i] = group_of[order[i]];
  return [this, gs = groups_, order = std::move(order), group = std::move(group),
          mirror = std::move(mirror), done = std::move(done)]() mutable {
    for (auto& g : gs)
      if (clip_sq_.defined() && !fuses_clip(g))
        for (GradLists& l : grad_lists(g.params, nullptr))
          clip_with(l, clip_sq_, clip_max_, nullptr);
    for (size_t i = 0; i < order.size(); ++i) {
      nn::Parameter& p = *order[i];
      uint16_t* out = mirror ? mirror(i) : nullptr;
      if (!update_mirrored(gs[group[i]], p, out) && out) {
        const float* x = p.value.data<float>();
        kernels::cpu::parallel_for(p.value.numel(), 1 << 16, [&](int64_t b, int64_t e) {
          for (int64_t k = b; k < e; ++k) out[k] = float_to_bf16(x[k]);
        });
      }
      if (done) done(i);
    }
    clip_sq_ = Tensor();
  };
}

bool Optimizer::update_mirrored(ParamGroup& g, nn::Parameter& p, uint16_t*) {
  update(g, p);
  return false;
}

float Optimizer::host_clip_factor(const ParamGroup& g) const {
  if (!clip_sq_.defined() || clip_sq_.is_cuda() || !fuses_clip(g)) return 1.0f;
  // multi_tensor_clip's factor, in the same fp32 operations.
  const float total = std::sqrt(clip_sq_.data<float>()[0]);
  const float c = clip_max_ / (total + 1e-6f);
  return c < 1.0f ? c : 1.0f;
}

void Optimizer::sum_replicas(const std::vector<int64_t>& delta) {
  for (const auto& g : groups_)
    CAI_CHECK(fuses_replicas(g),
              "[optimizer] {}: gradients summed over the ranks where they are read "
              "(sum_replicas) need every group's update fused on a GPU (adam, adamw, "
              "hybrid_adam with GPU parameters)",
              name());
  replicas_of(&delta);  // checks the count
  replicas_ = delta;
}

bool Optimizer::can_sum_replicas(const Device& device) const {
  if (!can_defer_clip(device)) return false;
  for (const auto& g : groups_)
    if (!fuses_replicas(g)) return false;
  return true;
}

void Optimizer::defer_clip(const Tensor& sq, float max_norm) {
  CAI_CHECK(
      sq.defined() && sq.numel() >= 1 && sq.dtype() == DType::F32 && can_defer_clip(sq.device()),
      "[clip_grad_norm] a deferred clip needs the fp32 sum of squares where every parameter "
      "and gradient is, got {}",
      sq.defined() ? sq.str() : std::string("none"));
  CAI_CHECK(max_norm > 0, "[clip_grad_norm] max_norm {} must be positive", max_norm);
  clip_sq_ = sq;
  clip_max_ = max_norm;
}

bool Optimizer::can_defer_clip(const Device& device) const {
  for (const auto& g : groups_)
    for (const nn::Parameter* p : g.params)
      if (p->value.device() != device || p->grad.device() != device) return false;
  return true;
}

void Optimizer::step_group(ParamGroup& g) {
  for (nn::Parameter* p : g.params) update(g, *p);
}

namespace {
// The pointer lists of a group for the multi-tensor kernels, when every parameter of the group is
// on a GPU (false otherwise: the per-tensor path runs).
struct TensorLists {
  std::vector<float*> p, m, v;
  std::vector<const float*> g;
  std::vector<int64_t> n;
  std::vector<float> wd;
};
// Parameters, gradients and the Adam moments ("exp_avg", "exp_avg_sq") of a group's non-empty
// parameters; `slot` creates the moments on first use.
template <typename SlotFn>
TensorLists moment_lists(const ParamGroup& g, SlotFn slot) {
  TensorLists l;
  for (nn::Parameter* p : g.params) {
    if (p->value.numel() == 0) continue;
    l.p.push_back(p->value.data<float>());
    l.g.push_back(p->grad.data<float>());
    l.m.push_back(slot(*p, "exp_avg").template data<float>());
    l.v.push_back(slot(*p, "exp_avg_sq").template data<float>());
    l.n.push_back(p->value.numel());
    l.wd.push_back(static_cast<float>(g.weight_decay));
  }
  return l;
}
bool all_cuda(const ParamGroup& g) {
  if (g.params.empty()) return false;
  for (const nn::Parameter* p : g.params)
    if (!p->value.is_cuda()) return false;
  return true;
}
bool all_host(const ParamGroup& g) {
  if (g.params.empty()) return false;
  for (const nn::Parameter* p : g.params)
    if (p->value.is_cuda() || p->grad.is_cuda()) return false;
  return true;
}
}  // namespace

void Optimizer::drop_deferred() {
  clip_sq_ = Tensor();
  replicas_.clear();
}

void Optimizer::zero_grad() {
  drop_deferred();
  std::vector<Tensor*> grads;
  for (auto& g : groups_)
    for (nn::Parameter* p : g.params) grads.push_back(&p->grad);
  zero_all(grads);
}

void Optimizer::set_lr(double lr) {
  for (auto& g : groups_) g.lr = lr;
}

Tensor& Optimizer::slot(const nn::Parameter& p, const char* slot_name) {
  const std::string key = p.name + "." + slot_name;
  auto it = state_.find(key);
  if (it == state_.end())
    it = state_.emplace(key, Tensor::zeros(p.value.shape(), DType::F32, p.value.device())).first;
  return it->second;
}

bool Optimizer::has_slot(const nn::Parameter& p, const char* slot_name) const {
  return state_.count(p.name + "." + slot_name) > 0;
}

std::map<std::string, Tensor> Optimizer::state_dict() const {
  std::map<std::string, Tensor> out;
  for (const auto& [k, v] : state_) out.emplace(k, v.clone());
  out.emplace("step", Tensor::from_vector(std::vector<float>{static_cast<float>(step_)}, {1}));
  return out;
}

void Optimizer::load_state_dict(const std::map<std::string, Tensor>& state) {
  auto it = state.find("step");
  CAI_CHECK(it != state.end(), "[optimizer] state has no 'step' entry");
  std::map<std::string, Tensor> fresh;
  for (const auto& [k, v] : state) {
    if (k == "step") continue;
    const nn::Parameter* owner = nullptr;
    for (const auto& g : groups_)
      for (const nn::Parameter* p : g.params)
        if (k.size() > p->name.size() && k.compare(0, p->name.size(), p->name) == 0 &&
            k[p->name.size()] == '.' && k.find('.', p->name.size() + 1) == std::string::npos)
          owner = p;
    CAI_CHECK(owner, "[optimizer] state entry '{}' belongs to no parameter of this optimizer", k);
    CAI_CHECK(v.shape() == owner->value.shape(),
              "[optimizer] state entry '{}' has shape {}, parameter {} has {}", k,
              shape_str(v.shape()), owner->name, shape_str(owner->value.shape()));
    fresh.emplace(k, v.to(owner->value.device()).clone());
  }
  state_ = std::move(fresh);
  step_ = static_cast<int64_t>(it->second.item());
}

int64_t Optimizer::state_bytes() const {
  int64_t b = 0;
  for (const auto& [k, v] : state_) b += static_cast<int64_t>(v.nbytes());
  return b;
}

int64_t Optimizer::state_bytes(bool cuda) const {
  int64_t b = 0;
  for (const auto& [k, v] : state_)
    if (v.is_cuda() == cuda) b += static_cast<int64_t>(v.nbytes());
  return b;
}

// --- SGD --------------------------------------------------------------------------------------

SGD::SGD(std::vector<ParamGroup> groups, double momentum, double dampening, bool nesterov)
    : Optimizer(std::move(groups)),
      momentum_(momentum),
      dampening_(dampening),
      nesterov_(nesterov) {
  CAI_CHECK(momentum >= 0, "[sgd] momentum {} must be non-negative", momentum);
  CAI_CHECK(!nesterov || (momentum > 0 && dampening == 0),
            "[sgd] Nesterov momentum needs momentum > 0 and dampening 0 (got {}, {})", momentum,
            dampening);
}

void SGD::update(ParamGroup& g, nn::Parameter& p) {
  const bool first = momentum_ != 0 && !has_slot(p, "momentum_buffer");
  float* buf = momentum_ != 0 ? slot(p, "momentum_buffer").data<float>() : nullptr;
  const int64_t n = p.value.numel();
  auto run = [&](auto fn) {
    fn(p.value.data<float>(), p.grad.data<float>(), buf, n, float(g.lr), float(momentum_),
       float(dampening_), float(g.weight_decay), nesterov_, first);
  };
  if (p.value.is_cuda())
    run([](auto... a) { kernels::cuda::sgd_step(a...); });
  else
    run([](auto... a) { kernels::cpu::sgd_step(a...); });
}

// --- Adam / AdamW -----------------------------------------------------------------------------

Adam::Adam(std::vector<ParamGroup> groups, double beta1, double beta2, double eps, bool decoupled)
    : Optimizer(std::move(groups)), beta1_(beta1), beta2_(beta2), eps_(eps), decoupled_(decoupled) {
  CAI_CHECK(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1,
            "[adam] betas ({}, {}) must be in [0, 1)", beta1, beta2);
  CAI_CHECK(eps >= 0, "[adam] eps {} must be non-negative", eps);
}

void Adam::update(ParamGroup& g, nn::Parameter& p) {
  update_mirrored(g, p, nullptr);
}

bool Adam::update_mirrored(ParamGroup& g, nn::Parameter& p, uint16_t* bf16) {
  float* m = slot(p, "exp_avg").data<float>();
  float* v = slot(p, "exp_avg_sq").data<float>();
  auto run = [&](auto fn, auto... extra) {
    fn(p.value.data<float>(), p.grad.data<float>(), m, v, p.value.numel(), float(g.lr),
       float(beta1_), float(beta2_), float(eps_), float(g.weight_decay), step_, decoupled_,
       extra...);
  };
  if (p.value.is_cuda()) {
    run([](auto... a) { kernels::cuda::adam_step(a...); });
    return false;
  }
  run([](auto... a) { kernels::cpu::adam_step(a...); }, host_clip_factor(g), bf16);
  return bf16 != nullptr;
}

void Adam::step_group(ParamGroup& g) {
  if (!all_cuda(g)) return Optimizer::step_group(g);
  const TensorLists l =
      moment_lists(g, [&](nn::Parameter& p, const char* n) -> Tensor& { return slot(p, n); });
  if (l.p.empty()) return;
  const auto reps = replicas_of(&replicas_);
  kernels::cuda::multi_tensor_adam(static_cast<int>(l.p.size()), l.p.data(), l.g.data(), l.m.data(),
                                   l.v.data(), l.n.data(), l.wd.data(), float(g.lr), float(beta1_),
                                   float(beta2_), float(eps_), step_, decoupled_, 1.0f, nullptr,
                                   clip_sq_.defined() ? clip_sq_.data<float>() : nullptr, clip_max_,
                                   reps ? &*reps : nullptr);
}

bool Adam::fuses_clip(const ParamGroup& g) const {
  return all_cuda(g) || all_host(g);
}

bool Adam::fuses_replicas(const ParamGroup& g) const {
  return all_cuda(g);
}

// --- LAMB -------------------------------------------------------------------------------------

Lamb::Lamb(std::vector<ParamGroup> groups, double beta1, double beta2, double eps)
    : Optimizer(std::move(groups)), beta1_(beta1), beta2_(beta2), eps_(eps) {
  CAI_CHECK(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1,
            "[lamb] betas ({}, {}) must be in [0, 1)", beta1, beta2);
}

void Lamb::update(ParamGroup& g, nn::Parameter& p) {
  float* m = slot(p, "exp_avg").data<float>();
  float* v = slot(p, "exp_avg_sq").data<float>();
  Tensor u = Tensor::empty(p.value.shape(), DType::F32, p.value.device());
  auto run = [&](auto fn) {
    fn(p.value.data<float>(), p.grad.data<float>(), m, v, u.data<float>(), p.value.numel(),
       float(beta1_), float(beta2_), float(eps_), float(g.weight_decay), step_);
  };
  if (p.value.is_cuda())
    run([](auto... a) { kernels::cuda::lamb_update(a...); });
  else
    run([](auto... a) { kernels::cpu::lamb_update(a...); });
  double trust = 1.0;
  if (g.weight_decay != 0) {
    const double w_norm = std::sqrt(ops::sum_squares(p.value));
    const double u_norm = std::sqrt(ops::sum_squares(u));
    if (w_norm > 0 && u_norm > 0) trust = w_norm / u_norm;
  }
  ops::axpy_(p.value, static_cast<float>(-g.lr * trust), u);
}

void Lamb::step_group(ParamGroup& g) {
  if (!all_cuda(g)) return Optimizer::step_group(g);
  const TensorLists l =
      moment_lists(g, [&](nn::Parameter& p, const char* n) -> Tensor& { return slot(p, n); });
  if (l.p.empty()) return;
  kernels::cuda::multi_tensor_lamb(static_cast<int>(l.p.size()), l.p.data(), l.g.data(), l.m.data(),
                                   l.v.data(), l.n.data(), l.wd.data(), float(g.lr), float(beta1_),
                                   float(beta2_), float(eps_), step_);
}

// --- factory and clipping ---------------------------------------------------------------------

std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& o, std::vector<ParamGroup> g) {
  if (o.name == "sgd") return std::make_unique<SGD>(std::move(g), o.momentum, 0.0, o.nesterov);
  if (o.name == "adam")
    return std::make_unique<Adam>(std::move(g), o.beta1, o.beta2, o.eps < 0 ? 1e-8 : o.eps);
  if (o.name == "adamw")
    return std::make_unique<AdamW>(std::move(g), o.beta1, o.beta2, o.eps < 0 ? 1e-8 : o.eps);
  if (o.name == "hybrid_adam")
    return std::make_unique<HybridAdam>(std::move(g), o.beta1, o.beta2, o.eps < 0 ? 1e-8 : o.eps);
  if (o.name == "lamb")
    return std::make_unique<Lamb>(std::move(g), o.beta1, o.beta2, o.eps < 0 ? 1e-6 : o.eps);
  fail("[optimizer] unknown optimizer '{}': expected sgd, adam, adamw, hybrid_adam or lamb",
       o.name);
}

double grad_norm(const std::vector<nn::Parameter*>& params) {
  double s = 0;
  for (const nn::Parameter* p : params) s += ops::sum_squares(p->grad);
  return std::sqrt(s);
}

Tensor grad_stats(const std::vector<nn::Parameter*>& params,
                  const std::function<double(const nn::Parameter&)>& weight, float scale,
                  const std::vector<int64_t>* replicas) {
  auto lists = grad_lists(params, weight);
  if (lists.empty()) return Tensor::zeros({2});
  if (lists.size() == 1) return stats_of(lists[0], scale, replicas);
  CAI_CHECK(!replicas || replicas->empty(),
            "[grad_stats] gradient replicas with gradients on several devices");
  std::vector<float> total(2, 0.0f);
  for (auto& l : lists) {
    const auto v = stats_of(l, scale).to_vector();
    total[0] += v[0], total[1] += v[1];
  }
  return Tensor::from_vector(total, {2});
}

Tensor clip_grad_norm_async(const std::vector<nn::Parameter*>& params, double max_norm,
                            const std::function<double(double)>& reduce_sq,
                            const std::function<double(const nn::Parameter&)>& weight,
                            const std::function<void(Tensor&)>& reduce_on_device, Optimizer* defer,
                            const std::vector<int64_t>* replicas) {
  CAI_CHECK(max_norm > 0, "[clip_grad_norm] max_norm {} must be positive", max_norm);
  auto lists = grad_lists(params, weight);
  // The factor left to defer's next step: one device, the sum of squares this device's or
  // reduced over the ranks on it (reduce_on_device, ordered before the step there), defer steps
  // exactly these.
  const bool deferred = lists.size() == 1 && defer &&
                        (reduce_on_device ? lists[0].device.is_cuda() : !reduce_sq) &&
                        defer->can_defer_clip(lists[0].device) && steps_exactly(*defer, params);
  // Gradients summed over the ranks where they are read: the sum exists only as the step will
  // read it, so the factor must be deferred.
  CAI_CHECK(!replicas || replicas->empty() || deferred,
            "[clip_grad_norm] gradients summed over the ranks where they are read need the "
            "clip deferred to an optimizer stepping exactly these parameters where they are");
  if (lists.size() == 1 && (!reduce_sq || reduce_on_device)) {
    // Everything on the device: the factor comes from the device sum of squares (summed over
    // the ranks there with reduce_on_device).
    GradLists& l = lists[0];
    Tensor stats = stats_of(l, 1.0f, replicas);
    if (reduce_on_device) reduce_on_device(stats);
    Tensor norm = Tensor::empty({1}, DType::F32, l.device);
    if (deferred) {
      if (l.device.is_cuda())
        kernels::cuda::multi_tensor_clip(0, nullptr, nullptr, stats.data<float>(),
                                         static_cast<float>(max_norm), norm.data<float>());
      else
        kernels::cpu::multi_tensor_clip(0, nullptr, nullptr, stats.data<float>(),
                                        static_cast<float>(max_norm), norm.data<float>());
      defer->defer_clip(stats, static_cast<float>(max_norm));
      return norm;
    }
    clip_with(l, stats, static_cast<float>(max_norm), &norm);
    return norm;
  }
  // The sum of squares read once, reduced over the ranks, and the factor applied from it: by
  // defer's step where every gradient is in host memory and defer steps exactly them (ZeRO-Offload:
  // no pass that scales gradients here), else here.
  double sq = 0;
  for (auto& l : lists) sq += stats_of(l, 1.0f).to_vector()[0];
  if (reduce_sq) sq = reduce_sq(sq);
  const Tensor total = Tensor::from_vector(std::vector<float>{static_cast<float>(sq)}, {1});
  if (lists.size() == 1 && !lists[0].device.is_cuda() && defer &&
      defer->can_defer_clip(lists[0].device) && steps_exactly(*defer, params))
    defer->defer_clip(total, static_cast<float>(max_norm));
  else
    for (auto& l : lists) clip_with(l, total.to(l.device), static_cast<float>(max_norm), nullptr);
  return Tensor::from_vector(std::vector<float>{static_cast<float>(std::sqrt(sq))}, {1});
}

double clip_grad_norm(const std::vector<nn::Parameter*>& params, double max_norm,
                      const std::function<double(double)>& reduce_sq,
                      const std::function<double(const nn::Parameter&)>& weight) {
  return clip_grad_norm_async(params, max_norm, reduce_sq, weight).item();
}

}  // namespace cai::optim
