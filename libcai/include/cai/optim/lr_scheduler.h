// Learning-rate schedules with Colossal-AI's definitions. A scheduler scales each group's
// base_lr; `t` counts scheduler steps (optimizer steps, or epochs when stepped by epoch),
// starting at 0 when the scheduler is built (PyTorch's last_epoch convention).
//  LinearWarmupLR:          t < W: (t+1)/(W+1)·base, else (T − t)/(T − W)·base (floored at 0)
//  CosineAnnealingWarmupLR: t < W: (t+1)/W·base,
//                           else eta_min + (base − eta_min)·(1 + cos(π·(t − W)/(T − W)))/2
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "cai/optim/optimizer.h"

namespace cai::optim {

class LRScheduler {
 public:
  explicit LRScheduler(Optimizer& opt) : opt_(opt) {}
  virtual ~LRScheduler() = default;
  void step();  // t += 1, then set the groups' lr
  int64_t last() const { return t_; }
  void set_last(int64_t t);  // for resuming
  double lr() const;         // lr of the first group now
  virtual double lr_at(double base_lr, int64_t t) const = 0;
  virtual std::string name() const = 0;

 protected:
  void apply();
  Optimizer& opt_;
  int64_t t_ = 0;
};

class ConstantLR : public LRScheduler {
 public:
  explicit ConstantLR(Optimizer& opt) : LRScheduler(opt) { apply(); }
  double lr_at(double base, int64_t) const override { return base; }
  std::string name() const override { return "constant"; }
};

class LinearWarmupLR : public LRScheduler {
 public:
  LinearWarmupLR(Optimizer& opt, int64_t total_steps, int64_t warmup_steps = 0);
  double lr_at(double base, int64_t t) const override;
  std::string name() const override { return "linear"; }

 private:
  int64_t total_, warmup_;
};

class CosineAnnealingWarmupLR : public LRScheduler {
 public:
  CosineAnnealingWarmupLR(Optimizer& opt, int64_t total_steps, int64_t warmup_steps = 0,
                          double eta_min = 0.0);
  double lr_at(double base, int64_t t) const override;
  std::string name() const override { return "cosine"; }

 private:
  int64_t total_, warmup_;
  double eta_min_;
};

// name: "cosine" | "linear" | "constant".
std::unique_ptr<LRScheduler> make_scheduler(const std::string& name, Optimizer& opt,
                                            int64_t total_steps, int64_t warmup_steps,
                                            double eta_min = 0.0);

}  // namespace cai::optim
