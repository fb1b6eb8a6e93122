// Optimizers over parameter groups (PyTorch semantics), global-norm gradient clipping, and
// savable state. State tensors live beside the parameters (same device) and are named
// "<parameter name>.<slot>" so that a checkpoint or a ZeRO shard can address them.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cai/nn/module.h"

namespace cai::optim {

struct ParamGroup {
  std::vector<nn::Parameter*> params;
  double lr = 1e-3;
  double weight_decay = 0.0;
  double base_lr = 1e-3;  // the lr a scheduler scales (set from lr when the optimizer is built)
};

// timm's split: weight decay for weights of rank ≥ 2, none for biases, norms, tokens and the
// position embedding (Parameter::weight_decay). Empty groups are dropped.
std::vector<ParamGroup> weight_decay_groups(const std::vector<nn::Parameter*>& params, double lr,
                                            double weight_decay);

class Optimizer {
 public:
  explicit Optimizer(std::vector<ParamGroup> groups);
  virtual ~Optimizer() = default;
  // Applies one update from the parameters' gradients.
  void step();
  // step() parameter by parameter in `order` (every parameter of the groups once; all in host
  // memory), where mirror(i) (may be empty; may return nullptr) gives where order[i]'s updated
  // values also go, rounded to bf16: Adam's host update writes them in its own pass, the other
  // updates are cast after. done(i) (may be empty) runs after order[i] is updated. The same
  // values as step() (ZeRO-Offload's host step: each stepped chunk is uploaded while the next
  // steps).
  void step_ordered(const std::vector<nn::Parameter*>& order,
                    const std::function<uint16_t*(size_t)>& mirror,
                    const std::function<void(size_t)>& done);
  // step_ordered in two parts: this call checks the arguments, counts the step and takes the
  // groups' hyperparameters as they are now; the returned function runs the updates (once, on
  // any one thread: ZeRO-Offload's host step runs beside the next forward). Until it has
  // returned, only groups() may be used (e.g. a scheduler setting the next step's lr).
  std::function<void()> ordered_step(std::vector<nn::Parameter*> order,
                                     std::function<uint16_t*(size_t)> mirror,
                                     std::function<void(size_t)> done);
  void zero_grad();
  // zero_grad() without the zeroing: drops a pending clip and replica sum (for gradients that
  // another fill zeroes, e.g. ZeRO-1's shard gradients, views of the full ones).
  void drop_deferred();
  std::vector<ParamGroup>& groups() { return groups_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  int64_t steps() const { return step_; }
  void set_lr(double lr);  // every group
  virtual std::string name() const = 0;

  // Named state tensors plus "step" (a 1-element tensor); load checks names and shapes.
  std::map<std::string, Tensor> state_dict() const;
  void load_state_dict(const std::map<std::string, Tensor>& state);
  int64_t state_bytes() const;  // optimizer-state memory held by this process
  // The part of state_bytes() on GPUs (cuda = true) or in host memory (cuda = false).
  int64_t state_bytes(bool cuda) const;

  // Global-norm clipping folded into the next step() (clip_grad_norm_async's `defer`): step()
  // multiplies the gradients it reads by c = max_norm / (√sq[0] + 1e-6) when c < 1 — the factor
  // and the products of clipping in place, so the update is the same — and leaves the gradient
  // memory unscaled: one pass over the gradients less. `sq` (fp32, where the parameters are) is
  // read when step() runs. Groups whose update has no such path are scaled in place at the start
  // of step(). step() and zero_grad() drop it. Adam's updates fuse it on a GPU (the multi-tensor
  // kernel) and in host memory (the CPU kernel: ZeRO-Offload's host step reads each gradient
  // once instead of three times).
  void defer_clip(const Tensor& sq, float max_norm);
  // Whether defer_clip may be used: every group's parameters and gradients on `device` (a GPU, or
  // host memory).
  bool can_defer_clip(const Device& device) const;

  // The copy-engine gradient exchange (DDP): the next step() reads every gradient as its sum over
  // the ranks, gradient element x at address a as Σ_r a[delta[r]] added in rank order
  // (kernels::GradReplicas: element offsets from the gradient memory to each rank's copy, 0 for
  // this rank's own, multiples of 4), and leaves the gradient memory as it is. Only where
  // can_sum_replicas holds. step() and zero_grad() drop it.
  void sum_replicas(const std::vector<int64_t>& delta);
  // Whether sum_replicas may be used: every group's update reads its gradients in a fused GPU
  // kernel that takes them (Adam, AdamW, HybridAdam) with its parameters on `device`, a GPU.
  bool can_sum_replicas(const Device& device) const;

 protected:
  virtual void update(ParamGroup& g, nn::Parameter& p) = 0;
  // update() that also writes the updated values rounded to bf16 into `bf16` when it can in the
  // same pass; returns whether it did (the default: update() only, false).
  virtual bool update_mirrored(ParamGroup& g, nn::Parameter& p, uint16_t* bf16);
  // The deferred clip's factor for group g's host update: c = max_norm / (√sq + 1e-6) when a
  // clip is pending, fuses_clip(g) and c < 1; else 1 (nothing to scale).
  float host_clip_factor(const ParamGroup& g) const;
  // One group's update; the default calls update() per parameter. Adam and LAMB override it with
  // the multi-tensor fused kernels when the group's parameters are on a GPU.
  virtual void step_group(ParamGroup& g);
  // Whether step_group applies a deferred clip itself (clip_sq_ defined) for this group.
  virtual bool fuses_clip(const ParamGroup&) const { return false; }
  // Whether step_group reads the gradients through replicas_ (sum_replicas) for this group.
  virtual bool fuses_replicas(const ParamGroup&) const { return false; }
  std::vector<int64_t> replicas_;  // sum_replicas's offsets (empty: none pending)
  Tensor clip_sq_;                 // defer_clip's sum of squares (undefined: none pending)
  float clip_max_ = 0.0f;
  Tensor& slot(const nn::Parameter& p, const char* slot_name);  // zero-initialised on first use
  bool has_slot(const nn::Parameter& p, const char* slot_name) const;
  std::vector<ParamGroup> groups_;
  int64_t step_ = 0;
  std::map<std::string, Tensor> state_;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<ParamGroup> groups, double momentum = 0.0, double dampening = 0.0,
      bool nesterov = false);
  std::string name() const override { return nesterov_ ? "sgd(nesterov)" : "sgd"; }

 private:
  void update(ParamGroup& g, nn::Parameter& p) override;
  double momentum_, dampening_;
  bool nesterov_;
};

// Adam with L2 weight decay (decoupled = false) or AdamW (decoupled = true).
class Adam : public Optimizer {
 public:
  Adam(std::vector<ParamGroup> groups, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8,
       bool decoupled = false);
  std::string name() const override { return decoupled_ ? "adamw" : "adam"; }

 private:
  void update(ParamGroup& g, nn::Parameter& p) override;
  bool update_mirrored(ParamGroup& g, nn::Parameter& p, uint16_t* bf16) override;
  void step_group(ParamGroup& g) override;
  bool fuses_clip(const ParamGroup& g) const override;
  bool fuses_replicas(const ParamGroup& g) const override;
  double beta1_, beta2_, eps_;
  bool decoupled_;
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<ParamGroup> groups, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8)
      : Adam(std::move(groups), beta1, beta2, eps, true) {}
};

// HybridAdam (Colossal-AI's nn.optimizer.HybridAdam with adamw_mode = true): AdamW whose
// parameters in host memory step with the vectorised multi-threaded CPU kernel (cpu_adam) and
// whose parameters on a GPU step with the multi-tensor fused CUDA kernel, group by group. The
// optimizer for ZeRO with cpu_offload, where the shards it steps live on the host. Results equal
// AdamW's bit for bit on either device.
class HybridAdam : public Adam {
 public:
  HybridAdam(std::vector<ParamGroup> groups, double beta1 = 0.9, double beta2 = 0.999,
             double eps = 1e-8, bool adamw_mode = true)
      : Adam(std::move(groups), beta1, beta2, eps, adamw_mode) {}
  std::string name() const override { return "hybrid_adam"; }
};

// LAMB as timm's Lamb (NVIDIA FusedLAMB behaviour): Adam direction with bias correction plus
// weight decay, scaled per parameter by the trust ratio ‖p‖/‖update‖ when the group has weight
// decay. No internal gradient clipping: use clip_grad_norm.
class Lamb : public Optimizer {
 public:
  Lamb(std::vector<ParamGroup> groups, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-6);
  std::string name() const override { return "lamb"; }

 private:
  void update(ParamGroup& g, nn::Parameter& p) override;
  void step_group(ParamGroup& g) override;
  double beta1_, beta2_, eps_;
};

struct OptimizerOptions {
  std::string name = "adamw";  // sgd | adam | adamw | hybrid_adam | lamb
  double momentum = 0.9;       // sgd
  bool nesterov = false;       // sgd
  double beta1 = 0.9, beta2 = 0.999;
  double eps = -1;  // < 0: the optimizer's default (1e-8, Lamb 1e-6)
};
std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& o, std::vector<ParamGroup> g);

// Scales all gradients so their global L2 norm is at most max_norm (PyTorch's clip_grad_norm_:
// factor max_norm / (norm + 1e-6), only when < 1). Returns the norm before clipping.
// `reduce_sq` (optional) turns this process's sum of squares into the global one, for gradients
// sharded over ranks (ZeRO, pipeline stages).
// `weight` (optional) multiplies each parameter's sum of squares before the reduction: 0 for a
// copy that another rank already counts (tensor-parallel replicas, DDP replicas).
// clip_grad_norm reads the norm to the host; clip_grad_norm_async returns it as a 1-element fp32
// tensor where the gradients live and reads nothing without reduce_sq (one pass of the
// multi-tensor kernels for the sum of squares, one that computes the factor on the device and
// scales); with reduce_sq it reads the local sum of squares once (the one host read of the step),
// reduces it and applies the factor from the reduced value. `reduce_on_device` (optional, taken
// instead of reduce_sq where the gradients sit on one device) sums the local {sum of squares,
// non-finite count} fp32 [2] tensor over the ranks in place, ordered on the device (an
// all-reduce the compute stream waits for): nothing is read to the host.
double clip_grad_norm(const std::vector<nn::Parameter*>& params, double max_norm,
                      const std::function<double(double)>& reduce_sq = nullptr,
                      const std::function<double(const nn::Parameter&)>& weight = nullptr);
// `defer` (optional): the optimizer whose next step() follows; where it steps exactly `params`,
// the sum of squares stays on the device (this device's alone, or reduced there by
// reduce_on_device) and defer->can_defer_clip holds, the factor is left to that step
// (Optimizer::defer_clip) instead of a pass that scales the gradients here.
// `replicas` (optional): the gradients are read as their sum over the ranks (the offsets of
// Optimizer::sum_replicas, which the caller passes to defer's next step too); needs the deferred
// path (defer given, stepping exactly `params`, no reduction), else an error.
Tensor clip_grad_norm_async(const std::vector<nn::Parameter*>& params, double max_norm,
                            const std::function<double(double)>& reduce_sq = nullptr,
                            const std::function<double(const nn::Parameter&)>& weight = nullptr,
                            const std::function<void(Tensor&)>& reduce_on_device = nullptr,
                            Optimizer* defer = nullptr,
                            const std::vector<int64_t>* replicas = nullptr);
// One pass over the gradients of `params` (multi-tensor kernels on a GPU): multiplies them by
// `scale` first when scale != 1 (the fp16 unscale), then returns {Σ weight(p)·‖grad‖², number of
// inf/NaN elements} as an fp32 [2] tensor where the gradients live; nothing is read to the host.
// Gradients on several devices (never the case in a plugin) give a host tensor.
// `replicas` (optional, scale = 1, gradients on a GPU): the statistics of the gradients' sum over
// the ranks (Optimizer::sum_replicas's offsets) instead of this rank's copy.
Tensor grad_stats(const std::vector<nn::Parameter*>& params,
                  const std::function<double(const nn::Parameter&)>& weight = nullptr,
                  float scale = 1.0f, const std::vector<int64_t>* replicas = nullptr);
double grad_norm(const std::vector<nn::Parameter*>& params);

}  // namespace cai::optim
