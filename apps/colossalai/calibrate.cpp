#include "calibrate.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <thread>

#include "cai/config/config.h"
#include "cai/core/error.h"
#include "cai/core/host_memory.h"
#include "cai/core/rng.h"
#include "cai/dist/communicator.h"
#include "cai/dist/launch.h"
#include "cai/dist/nccl.h"
#include "cai/nn/module.h"
#include "cai/nn/vit.h"
#include "cai/ops/ops.h"
#include "cai/optim/optimizer.h"
#include "cai/plan/plan.h"
#include "calibrate_internal.h"
#include "kernels/cpu/parallel.h"
#include "kernels/device.h"

namespace cai::app {

namespace detail {

// Inputs of the timed kernels: constant values made where they are used (the host RNG would
// take longer than the kernels for the large shapes; the timings do not depend on the values).
Tensor randn(const Shape& s, DType t, Device dev, uint64_t stream) {
  Tensor x = Tensor::full(s, 0.01f * static_cast<float>(1 + stream % 7), dev);
  return t == DType::F32 ? x : x.to(t);
}

// Seconds per call of f: warm twice, then repeat until 20 ms or 30 calls (at least 3).
double time_it(const std::function<void()>& f, Device dev) {
  auto sync = [&] {
    if (dev.is_cuda()) kernels::cuda::synchronize();
  };
  f();
  f();
  sync();
  int n = 0;
  const auto t0 = Clock::now();
  double s = 0;
  do {
    f();
    ++n;
    sync();
    s = std::chrono::duration<double>(Clock::now() - t0).count();
  } while ((s < 0.02 || n < 3) && n < 30);
  return s / n;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace detail

using namespace detail;

namespace {

// The split LayerNorm of a 2D block (nn::nd_layernorm_fwd / _bwd without their all-reduces; plan.h
// kNdNormCalibration): x [rows, f] fp32, f of F features on this rank.
double nd_layernorm(int64_t rows, int64_t f, int64_t F, bool fwd, DType ct, Device dev) {
  const Tensor x = randn({rows, f}, DType::F32, dev, 1);
  const Tensor g = Tensor::full({f}, 1.0f).to(dev);
  const Tensor bb = Tensor::zeros({f}, DType::F32, dev);
  Tensor mean, rstd;
  auto forward = [&] {
    Tensor m = ops::layernorm_row_sums(x, Tensor());
    ops::scale_(m, 1.0f / static_cast<float>(F));
    const Tensor v = ops::layernorm_row_sums(x, m);
    mean = m;
    return ops::layernorm_split_fwd(x, g, bb, m, v, F, 1e-6f, ct, &rstd);
  };
  const Tensor y = forward();
  if (fwd) return time_it([&] { forward(); }, dev);
  Tensor dg = Tensor::zeros({f}, DType::F32, dev), db = dg.clone();
  return time_it(
      [&] {
        const Tensor sums = ops::layernorm_split_bwd_sums(x, g, mean, rstd, y, &dg, &db);
        ops::layernorm_split_bwd(x, g, mean, rstd, y, sums, F);
      },
      dev);
}

// The kernels of one (micro-batch b, tensor-parallel size T) layout of the model.
class OpTimer {
 public:
  OpTimer(const nn::ViTConfig& c, int64_t b, int T, DType ct, Device dev)
      : c_(c), b_(b), T_(T), ct_(ct), dev_(dev) {
    n_ = c.num_patches() + 1;
    d_ = c.embed_dim;
    dt_ = d_ / T;
    heads_ = c.num_heads / T;
    hid_ = c.mlp_hidden() / T;
    rows_ = b * n_;
  }

  // Seconds of `op` in `phase` (Forward: its forward, Backward: its backward); < 0 when this
  // op has no kernel here.
  double time(const std::string& op, plan::Phase phase) {
    const bool fwd = phase != plan::Phase::Backward;
    if (op == "norm1" || op == "norm2") return layernorm({b_, n_, d_}, fwd);
    if (op == "norm") return layernorm({b_, d_}, fwd);
    // The block takes qkv's bias gradient from the fused attention backward where it runs.
    if (op == "attn.qkv") return linear(rows_, d_, 3 * dt_, fwd, ct_, !attention_sums_bias());
    if (op == "attn.proj") return linear(rows_, dt_, d_, fwd, ct_);
    // fc1's bias gradient comes from the GELU's backward pass, except with the tanh GELU's
    // DGELU epilogue (ViT::Block::backward).
    if (op == "mlp.fc1") return linear(rows_, d_, hid_, fwd, ct_, dgelu_epilogue());
    if (op == "mlp.fc2") return linear(rows_, hid_, d_, fwd, ct_);
    if (op == "attn.proj+residual") return linear_residual(rows_, dt_, d_);
    if (op == "mlp.fc2+residual") return linear_residual(rows_, hid_, d_);
    if (op == "head") return linear(b_, dt_, c_.num_classes, fwd, DType::F32);
    if (op == "attn") return attention(fwd);
    if (op == "mlp.act") return gelu(fwd);
    if (op == "residual") return residual(fwd);
    if (op == "patch_embed.proj") return patch_embed(fwd);
    if (op == "cls_pos") return cls_pos(fwd);
    if (op == "cross_entropy") return cross_entropy(fwd);
    return -1;
  }

  // The residual stream as the 1D block runs it (nn::Block::backward): each LayerNorm backward adds
  // the residual gradient in its pass and writes the compute-dtype copy the next GEMM takes
  // (ops::layernorm_bwd_add); forward, unfused (tensor parallelism), each residual add takes the
  // linear's output in the compute dtype into the fp32 stream.
  // Both at the block's [b, n, d], timed once per timer (norm1 and norm2 share the shape).
  double layernorm_bwd_add() {
    if (bwd_add_s_ >= 0) return bwd_add_s_;
    LnInputs in = ln_inputs({b_, n_, d_});
    const Tensor r = randn({b_, n_, d_}, DType::F32, dev_, 13);
    Tensor half;
    const bool h = ct_ != DType::F32;
    return bwd_add_s_ = time_it(
               [&] {
                 ops::layernorm_bwd_add(in.x, in.g, in.mean, in.rstd, in.y, r, &in.dg, &in.db, ct_,
                                        h ? &half : nullptr);
               },
               dev_);
  }
  double residual_fwd_ct() {
    if (residual_ct_s_ >= 0) return residual_ct_s_;
    const Tensor x = randn({b_, n_, d_}, DType::F32, dev_, 7);
    const Tensor y = randn({b_, n_, d_}, ct_, dev_, 14);
    return residual_ct_s_ = time_it(
               [&] {
                 const Tensor h = ops::add(x, y);
                 ops::add(h, y);
               },
               dev_);
  }

 private:
  // A LayerNorm's operands over the fp32 residual stream, its forward run once.
  struct LnInputs {
    Tensor x, g, bb, mean, rstd, y, dg, db;
  };
  LnInputs ln_inputs(const Shape& s) const {
    LnInputs in;
    in.x = randn(s, DType::F32, dev_, 1);  // the residual stream is fp32
    in.g = Tensor::full({s.back()}, 1.0f).to(dev_);
    in.bb = Tensor::zeros({s.back()}, DType::F32, dev_);
    in.y = ops::layernorm_fwd(in.x, in.g, in.bb, 1e-6f, &in.mean, &in.rstd, ct_);
    in.dg = Tensor::zeros({s.back()}, DType::F32, dev_);
    in.db = in.dg.clone();
    return in;
  }
  double layernorm(const Shape& s, bool fwd) {
    LnInputs in = ln_inputs(s);
    if (fwd)
      return time_it([&] { ops::layernorm_fwd(in.x, in.g, in.bb, 1e-6f, &in.mean, &in.rstd, ct_); },
                     dev_);
    return time_it([&] { ops::layernorm_bwd(in.x, in.g, in.mean, in.rstd, in.y, &in.dg, &in.db); },
                   dev_);
  }
  double linear(int64_t rows, int64_t in, int64_t out, bool fwd, DType out_dtype,
                bool bias_grad = true) {
    const Tensor x = randn({rows, in}, ct_, dev_, 2);
    const Tensor w = randn({out, in}, DType::F32, dev_, 3);
    const Tensor bias = Tensor::zeros({out}, DType::F32, dev_);
    if (fwd) return time_it([&] { ops::linear_fwd(x, w, &bias, out_dtype); }, dev_);
    const Tensor dy = randn({rows, out}, out_dtype, dev_, 4);
    Tensor dw = Tensor::zeros({out, in}, DType::F32, dev_),
           db = Tensor::zeros({out}, DType::F32, dev_);
    return time_it([&] { ops::linear_bwd(x, w, dy, &dw, bias_grad ? &db : nullptr); }, dev_);
  }
  // A forward with the residual add in its epilogue (the weight in the compute dtype, as the
  // block's ComputeCopies hold it).
  double linear_residual(int64_t rows, int64_t in, int64_t out) {
    const Tensor x = randn({rows, in}, ct_, dev_, 2);
    const Tensor w = randn({out, in}, DType::F32, dev_, 3).to(ct_);
    const Tensor bias = Tensor::zeros({out}, DType::F32, dev_);
    const Tensor r = randn({rows, out}, DType::F32, dev_, 4);
    return time_it([&] { ops::linear_fwd_residual(x, w, &bias, r); }, dev_);
  }
  double attention(bool fwd) {
    const Tensor qkv = randn({b_, n_, 3 * dt_}, ct_, dev_, 5);
    Tensor saved;
    const Tensor o = ops::attention_fwd(qkv, heads_, &saved);
    if (fwd) return time_it([&] { ops::attention_fwd(qkv, heads_, &saved); }, dev_);
    Tensor db = Tensor::zeros({3 * dt_}, DType::F32, dev_);
    Tensor* dbp = ops::attention_bwd_sums_bias(saved) ? &db : nullptr;
    return time_it([&] { ops::attention_bwd(qkv, o, saved, o, heads_, dbp); }, dev_);
  }
  // Whether the attention backward sums qkv's bias gradient here (the fused GPU kernel).
  bool attention_sums_bias() {
    const Tensor qkv = randn({1, 2, 3 * dt_}, ct_, dev_, 5);
    Tensor saved;
    ops::attention_fwd(qkv, heads_, &saved);
    return ops::attention_bwd_sums_bias(saved);
  }
  bool dgelu_epilogue() const { return c_.act == "gelu_tanh" && c_.drop_rate == 0; }
  // The block's GELU passes: the backward with fc1's bias gradient in the same pass and, when the
  // block makes the GELU's output again (ViTConfig::gelu_recomputed; 1D layouts), that output.
  double gelu(bool fwd) {
    const auto kind = c_.act == "gelu_tanh" ? ops::Gelu::Tanh : ops::Gelu::Exact;
    const Tensor f = randn({rows_, hid_}, ct_, dev_, 6);
    if (fwd) return time_it([&] { ops::gelu_fwd(f, kind); }, dev_);
    const Tensor dy = randn({rows_, hid_}, ct_, dev_, 8);
    Tensor db = Tensor::zeros({hid_}, DType::F32, dev_), y;
    const bool again = c_.gelu_recomputed(false);
    return time_it([&] { ops::gelu_bwd_bias(f, dy, kind, &db, again ? &y : nullptr); }, dev_);
  }
  double residual(bool fwd) {  // the block's two residual adds (fp32)
    const Tensor x = randn({b_, n_, d_}, DType::F32, dev_, 7);
    Tensor y = x.clone();
    if (fwd)
      return time_it(
          [&] {
            ops::add(x, y);
            ops::add(x, y);
          },
          dev_);
    return time_it(
        [&] {
          ops::add_(y, x);
          ops::add_(y, x);
        },
        dev_);
  }
  double patch_embed(bool fwd) {
    const Tensor img = randn({b_, c_.in_chans, c_.img_size, c_.img_size}, DType::F32, dev_, 8);
    const Tensor w = randn({d_, c_.in_chans, c_.patch_size, c_.patch_size}, DType::F32, dev_, 9);
    const Tensor bias = Tensor::zeros({d_}, DType::F32, dev_);
    Tensor patches;
    const Tensor t = ops::patch_embed_fwd(img, w, bias, &patches, ct_);
    if (fwd) return time_it([&] { ops::patch_embed_fwd(img, w, bias, &patches, ct_); }, dev_);
    Tensor dw = Tensor::zeros(w.shape(), DType::F32, dev_), db = bias.clone();
    return time_it([&] { ops::patch_embed_bwd(patches, w, t, &dw, &db); }, dev_);
  }
  double cls_pos(bool fwd) {
    const Tensor t = randn({b_, c_.num_patches(), d_}, ct_, dev_, 10);
    const Tensor cls = Tensor::zeros({1, 1, d_}, DType::F32, dev_);
    const Tensor pos = Tensor::zeros({1, n_, d_}, DType::F32, dev_);
    const Tensor x = ops::cls_pos_fwd(t, cls, pos);
    if (fwd) return time_it([&] { ops::cls_pos_fwd(t, cls, pos); }, dev_);
    Tensor dc = cls.clone(), dp = pos.clone();
    return time_it([&] { ops::cls_pos_bwd(x, &dc, &dp, ct_); }, dev_);
  }
  double cross_entropy(bool fwd) {
    const Tensor logits = randn({b_, c_.num_classes}, DType::F32, dev_, 12);
    std::vector<int32_t> l(b_);
    for (int64_t i = 0; i < b_; ++i) l[i] = static_cast<int32_t>(i % c_.num_classes);
    const Tensor y = Tensor::from_vector(l, {b_}).to(dev_);
    if (fwd) return time_it([&] { ops::cross_entropy_fwd(logits, y, 0.1f); }, dev_);
    return time_it([&] { ops::cross_entropy_bwd(logits, y, 0.1f, 1.0f); }, dev_);
  }

  nn::ViTConfig c_;
  int64_t b_;
  int T_;
  DType ct_;
  Device dev_;
  int64_t n_, d_, dt_, heads_, hid_, rows_;
  double bwd_add_s_ = -1, residual_ct_s_ = -1;  // timed once (layernorm_bwd_add, residual_fwd_ct)
};

// Clipping, AdamW and zero_grad over `elements` parameters (in tensors of about 1M elements, as
// a model's are).
double time_optimizer(int64_t elements, Device dev) {
  std::vector<nn::Parameter> ps;
  const int64_t chunk = 1 << 20;
  for (int64_t off = 0, i = 0; off < elements; off += chunk, ++i) {
    const int64_t n = std::min(chunk, elements - off);
    nn::Parameter p = nn::make_parameter(fmt::format("p{}", i), {n}, true);
    p.value = p.value.to(dev);
    p.grad = randn({n}, DType::F32, dev, 20 + i);
    ps.push_back(std::move(p));
  }
  std::vector<nn::Parameter*> ptrs;
  for (auto& p : ps) ptrs.push_back(&p);
  optim::AdamW opt(optim::weight_decay_groups(ptrs, 1e-3, 0.05));
  return time_it(
      [&] {
        optim::clip_grad_norm_async(ptrs, 1.0);
        opt.step();
        for (nn::Parameter* p : ptrs) p->grad.zero_();
      },
      dev);
}

// Seconds per call of the data-parallel plugin's smallest device operation: a copy of 64
// elements between two spans (parallel/data_parallel.cpp's copy_span), 256 of them back to back,
// as the plugin packs and unpacks a bucket one parameter at a time. On a GPU this is the launch
// rate of small copies (their kernels take less than their launches); the simulator charges a
// plugin op of k such calls at least k times this ("copy|call").
double time_copy_call(Device dev) {
  const int64_t n = 64, calls = 256;
  const Tensor src = randn({n * calls}, DType::F32, dev, 40);
  const Tensor dst = Tensor::zeros({n * calls}, DType::F32, dev);
  return time_it(
             [&] {
               for (int64_t k = 0; k < calls; ++k)
                 dst.narrow(k * n, n).copy_from(src.narrow((calls - 1 - k) * n, n));
             },
             dev) /
         static_cast<double>(calls);
}

// The real layers' forward and backward (T = 1) as a training step runs them: the whole model's
// forward, layer after layer, then its backward, repeated back to back for about half a second;
// each layer timed in place (CUDA: events between the layers on the compute stream, so the
// kernels queue as in a step; CPU: the host clock). In place, a layer finds its weights and
// inputs where the previous layer left them (not in a cache warmed by repeating it alone), with
// the launch gaps between its kernels and the clocks of a GPU under sustained load (warmup_s
// seconds of the same steps before the timed ones: --calibrate-warmup on GPUs). Seconds per
// {layer, phase} for micro-batch b: embedding, blocks.0 (the mean over the blocks, which are
// alike), head.
std::map<std::string, double> time_layers(nn::ViT& m, int64_t b, Device dev, double warmup_s) {
  const nn::ViTConfig& c = m.config();
  const Tensor img = randn({b, c.in_chans, c.img_size, c.img_size}, DType::F32, dev, 30);
  nn::ForwardCtx ctx{true, 1, 0, 0};
  auto& layers = m.layers();
  const size_t L = layers.size();
  const bool cuda = dev.is_cuda();
  // Marks between the layers: forward 0..L, backward L..2L (shared at L).
  std::vector<void*> ev;
  std::vector<Clock::time_point> host(2 * L + 1);
  if (cuda)
    for (size_t k = 0; k <= 2 * L; ++k) ev.push_back(kernels::cuda::event_create_timed());
  auto mark = [&](size_t k) {
    if (cuda)
      kernels::cuda::event_record(ev[k], nullptr);
    else
      host[k] = Clock::now();
  };
  Tensor dlogits;
  std::vector<double> sum(2 * L, 0.0);
  auto step = [&](bool timed) {
    std::vector<std::unique_ptr<nn::Cache>> caches(L);
    Tensor x = img;
    if (timed) mark(0);
    for (size_t i = 0; i < L; ++i) {
      x = layers[i]->forward(x, caches[i], ctx);
      if (timed) mark(i + 1);
    }
    if (!dlogits.defined()) dlogits = randn(x.shape(), x.dtype(), dev, 32);
    Tensor dy = dlogits;
    for (size_t i = L; i-- > 0;) {
      dy = layers[i]->backward(dy, caches[i], ctx);
      if (timed) mark(L + (L - i));
    }
    if (!timed) return;
    if (cuda) kernels::cuda::event_synchronize(ev[2 * L]);
    for (size_t k = 0; k < 2 * L; ++k)
      sum[k] += cuda ? 1e-3 * kernels::cuda::event_elapsed_ms(ev[k], ev[k + 1])
                     : std::chrono::duration<double>(host[k + 1] - host[k]).count();
  };
  step(false);  // warm: workspaces, allocator
  if (cuda) kernels::cuda::synchronize();
  // Sustained load first (GPU): the same steps for warmup_s seconds, so that the layers are
  // timed at the clocks of a GPU that has trained for a while (power cap, temperature), not of a
  // cool one (1 H200, three calls: 6 s made the simulated one-GPU steps 1-2.5% slower, mean
  // |error| against vit_train 1.7% -> 1.6%, max 3.2% -> 2.7%; docs/SIM_VALIDATION.md).
  for (const auto tw = Clock::now(); seconds_since(tw) < warmup_s;) {
    step(false);
    if (cuda) kernels::cuda::synchronize();
  }
  const auto t0 = Clock::now();
  int reps = 0;
  do {
    step(true);
    ++reps;
  } while ((seconds_since(t0) < 0.5 || reps < 3) && reps < 50);
  for (void* e : ev) kernels::cuda::event_destroy(e);
  // Forward of layer i: mark i .. i + 1; its backward: mark L + (L - 1 - i) .. L + (L - i).
  auto fwd = [&](size_t i) { return sum[i] / reps; };
  auto bwd = [&](size_t i) { return std::max(sum[L + (L - 1 - i)] / reps, 1e-9); };
  double bf = 0, bb = 0;
  for (size_t i = 1; i + 1 < L; ++i) bf += fwd(i), bb += bwd(i);
  const double blocks = static_cast<double>(L - 2);
  return {{"embedding|fwd", fwd(0)},     {"embedding|bwd", bwd(0)}, {"blocks.0|fwd", bf / blocks},
          {"blocks.0|bwd", bb / blocks}, {"head|fwd", fwd(L - 1)},  {"head|bwd", bwd(L - 1)}};
}

const char* phase_key(plan::Phase p) {
  return p == plan::Phase::Backward ? "bwd" : "fwd";
}

}  // namespace

// A barrier whose waiting ranks test it every 20 ms and sleep in between. Rank 0 times kernels
// for minutes while the others wait here: a wait that polls (MpiWork::wait naps only 50 µs)
// took cores from rank 0 where processes share them (4 on 2 cores: a calibration 10-14% slower
// than the trainer's own steps, in some runs and not others).
void quiet_barrier(dist::Communicator& c) {
  Tensor t = Tensor::zeros({1}, DType::F32, Device::cpu());
  auto w = c.all_reduce_async(t, dist::ReduceOp::Sum);
  const auto deadline = Clock::now() + std::chrono::duration<double>(c.timeout());
  while (!w->test()) {
    if (Clock::now() > deadline)
      throw Error(fmt::format(
          "[calibrate] rank {} of {} waited {} s for rank 0's kernel timings: rank 0 died or hung",
          c.rank(), c.name(), c.timeout()));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

int run_calibrate_ranks(const BenchmarkOptions& o) {
  CAI_CHECK(!o.config.empty(),
            "[benchmark] --calibrate needs --config (a vit_train TOML whose model it times)");
  const dist::LaunchInfo li = dist::launch_from_env();
  dist::MpiEnvironment env(nullptr, nullptr);
  auto world = env.world();
  CAI_CHECK(world->size() == o.gpus, "[benchmark] --gpus {} but {} ranks were started", o.gpus,
            world->size());
  const config::TrainConfig cfg = config::load_config(o.config, o.overrides);
  const nn::ViTConfig vc = cfg.vit();
  BenchmarkOptions opts = o;
  if (opts.device.empty()) opts.device = kernels::cuda::device_count() > 0 ? "cuda" : "cpu";
  const bool cuda = opts.device == "cuda";
  int device = 0;
  std::unique_ptr<dist::Communicator> nccl;  // destroyed before `world`, which it uses
  if (cuda) {
    CAI_CHECK(kernels::cuda::device_count() > 0, "[benchmark] --device cuda but no GPU: {}",
              kernels::cuda::runtime_info().device_error);
    device = dist::select_cuda_device(li.local_rank, li.local_world_size);
    nccl = dist::make_nccl(*world, device);
  }
  dist::Communicator& comm = nccl ? *nccl : *world;  // what the trainer uses
  const double act = static_cast<double>(cfg.batch_size) * (vc.num_patches() + 1) * vc.embed_dim;
  const std::vector<double> sizes =
      calibration_message_sizes(static_cast<double>(vc.num_parameters()), act);
  if (world->rank() == 0)
    std::cerr << fmt::format(
        "[calibrate] collectives on {} {} ranks ({}), {} message sizes from {} to {} bytes\n",
        world->size(), opts.device, comm.name(), sizes.size(), sizes.front(), sizes.back());
  // The pipeline's send/receive channels as vit_train builds them (parallel.p2p_max_ctas).
  const dist::P2POptions p2p{static_cast<int>(cfg.p2p_max_ctas)};
  const std::vector<CollectiveTiming> coll = time_collectives(comm, sizes, cuda, device, p2p);
  OverlapTiming overlap;
  if (!cuda) keep_freed_host_memory();  // as vit_train on CPUs
  ContentionTiming contention;
  if (cuda) {
    // The posted receive as the config's pipelines run it: their channels, their GEMMs' margin.
    config::TrainConfig piped = cfg;
    piped.pipeline = std::max<int64_t>(2, cfg.pipeline);
    overlap = time_overlap(comm, vc, cfg.batch_size, dtype_from_name(opts.precision), device, p2p,
                           config::gemm_sm_margin_for(piped));
  } else {
    contention = time_contention(comm, vc, cfg.batch_size);
  }
  // Rank 0 times the kernels alone while the others wait (minutes on a large model).
  world->set_timeout(std::max(world->timeout(), 3600.0));
  int rc = 0;
  std::string error;
  if (world->rank() == 0) {
    try {
      rc = run_calibrate(opts, coll, device, overlap, contention);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  quiet_barrier(*world);
  if (!error.empty()) throw Error(error);
  return rc;
}

int run_calibrate(const BenchmarkOptions& o, const std::vector<CollectiveTiming>& collectives,
                  int cuda_device, const OverlapTiming& overlap,
                  const ContentionTiming& contention) {
  CAI_CHECK(!o.config.empty(),
            "[benchmark] --calibrate needs --config (a vit_train TOML whose model it times)");
  const config::TrainConfig cfg = config::load_config(o.config, o.overrides);
  const nn::ViTConfig vc = cfg.vit();
  std::string device = o.device;
  if (device.empty()) device = kernels::cuda::device_count() > 0 ? "cuda" : "cpu";
  const Device dev = device == "cuda" ? Device::cuda(cuda_device) : Device::cpu();
  // On CPUs, time the kernels with the host allocator vit_train runs with.
  if (!dev.is_cuda()) keep_freed_host_memory();
  if (dev.is_cuda())
    CAI_CHECK(kernels::cuda::device_count() > 0, "[benchmark] --device cuda but no GPU: {}",
              kernels::cuda::runtime_info().device_error);
  const DType ct = dtype_from_name(o.precision);
  std::string name = "cpu";
  if (dev.is_cuda()) name = kernels::cuda::runtime_info().devices.at(cuda_device).name;

  std::vector<int64_t> batches;
  for (int64_t b = 1; b < cfg.batch_size; b *= 2) batches.push_back(b);
  batches.push_back(cfg.batch_size);
  std::vector<int> tps;
  for (int T : {1, 2, 4, 8}) {
    try {
      if (T > 1) vc.validate_tensor_parallel(T, false);
      tps.push_back(T);
    } catch (const Error&) {
    }
  }
  const auto t0 = Clock::now();
  nn::ViT model(vc);  // the real layers, timed whole per batch size
  model.init(5);
  if (dev.is_cuda()) model.to(dev);
  model.set_compute_dtype(ct);
  std::map<std::string, std::vector<std::array<double, 3>>> samples;
  std::map<std::string, std::set<double>> seen;
  int timed = 0;
  // Per batch size: the real layers' times over the sum of their ops' isolated times (T = 1),
  // which scales every op of the layer at that batch size (allocation, caches and dispatch
  // inside a real layer; no whole-step figure).
  std::map<std::pair<int64_t, std::string>, double> layer_scale;
  // The GEMM algorithms as the executor picks them: timed per shape (unless CAI_GEMM_TUNE=0)
  // without tensor parallelism, the heuristic's first under it (nn::TensorParallel).
  const bool gemm_timing = kernels::cuda::gemm_timing();
  for (int T : tps) {
    kernels::cuda::set_gemm_timing(gemm_timing && T == 1);
    for (int64_t b : batches) {
      std::map<std::string, double> layer_s, ops_s;  // {layer|phase}
      plan::Layout l;
      l.world = T, l.tp = T, l.batch = b;
      l.precision = ct;
      l.gpu = dev.is_cuda();
      const plan::StepPlan p = plan::make_plan(vc, l);
      OpTimer timer(vc, b, T, ct, dev);
      if (T == 1) layer_s = time_layers(model, b, dev, dev.is_cuda() ? o.calibrate_warmup_s : 0.0);
      struct Timed {
        std::string key, layer;
        double flops, bytes, seconds;
      };
      std::vector<Timed> these;
      for (const plan::LayerPlan& lp : p.stages.at(0).layer_plans) {
        if (lp.name.rfind("blocks.", 0) == 0 && lp.name != "blocks.0") continue;  // alike
        for (const plan::OpCost& op : lp.ops) {
          if (op.phase != plan::Phase::Forward && op.phase != plan::Phase::Backward) continue;
          const std::string key = op.op + "|" + phase_key(op.phase);
          const std::string layer =
              (op.layer == "loss" ? "loss" : lp.name) + "|" + phase_key(op.phase);
          const bool fresh = seen[key].insert(op.flops).second;
          if (!fresh && T > 1) continue;
          const double s = timer.time(op.op, op.phase);
          if (s < 0) continue;
          const double bytes = static_cast<double>(op.bytes_read + op.bytes_written);
          // The residual stream's ops as the 1D block runs them, under keys of their own
          // (sim/from_config.cpp takes them where a profile has them, the plain ones where not):
          // the LayerNorm backwards with the residual gradient's add ("normN|bwd_add"; the
          // "residual" backward is inside them), the unfused residual adds in the compute dtype
          // ("residual|fwd_ct"). The layer's sum (its scale) counts the ops as timed that way.
          double in_layer = s;
          const bool bwd = op.phase == plan::Phase::Backward;
          std::string extra;
          if ((op.op == "norm1" || op.op == "norm2") && bwd) {
            extra = op.op + "|bwd_add";
            in_layer = timer.layernorm_bwd_add();
          } else if (op.op == "residual" && bwd) {
            in_layer = 0;
          } else if (op.op == "residual") {
            extra = "residual|fwd_ct";
            in_layer = timer.residual_fwd_ct();
          }
          ops_s[layer] += in_layer;
          if (fresh) these.push_back({key, layer, op.flops, bytes, s});
          if (!extra.empty() && seen[extra].insert(op.flops).second)
            these.push_back({extra, layer, op.flops, bytes, in_layer});
        }
      }
      if (T == 1)
        for (const auto& [layer, s] : layer_s)
          if (ops_s[layer] > 0) layer_scale[{b, layer}] = s / ops_s[layer];
      if (T == 4) {
        // The 2D layout of these 4 ranks (q = 2; 2.5D and 3D on 8 cut a block alike): its split
        // LayerNorm at the rank's block, keyed by the plan's norm op (its FLOPs: the block's
        // elements), scaled as the whole block's ops at the batch of as many rows.
        plan::Layout l2 = l;
        l2.tp_mode = "2d";
        try {
          const plan::StepPlan p2 = plan::make_plan(vc, l2);
          const int64_t F = vc.embed_dim, f = F / 2;
          for (const plan::LayerPlan& lp : p2.stages.at(0).layer_plans) {
            if (lp.name != "blocks.0") continue;
            for (const plan::OpCost& op : lp.ops) {
              if (op.op != "norm1" ||
                  (op.phase != plan::Phase::Forward && op.phase != plan::Phase::Backward))
                continue;
              const std::string key =
                  std::string(plan::kNdNormCalibration) + "|" + phase_key(op.phase);
              if (!seen[key].insert(op.flops).second) continue;
              const int64_t rows = static_cast<int64_t>(op.flops / 8.0) / f;
              if (rows <= 0) continue;
              const double s = nd_layernorm(rows, f, F, op.phase == plan::Phase::Forward, ct, dev);
              const auto it = layer_scale.find(
                  {rows / (vc.num_patches() + 1), std::string("blocks.0|") + phase_key(op.phase)});
              const double scale = it == layer_scale.end() ? 1.0 : it->second;
              these.push_back({key, "", op.flops,
                               static_cast<double>(op.bytes_read + op.bytes_written), s * scale});
            }
          }
        } catch (const Error&) {  // no 2D layout of this model (heads or features do not split)
        }
      }
      for (const Timed& t : these) {
        const auto it = layer_scale.find({b, t.layer});
        const double scale = it == layer_scale.end() ? 1.0 : it->second;
        samples[t.key].push_back({t.flops, t.bytes, t.seconds * scale});
        ++timed;
      }
      std::cerr << fmt::format("[calibrate] tp {} batch {}: {} kernels timed so far\n", T, b,
                               timed);
    }
  }
  kernels::cuda::set_gemm_timing(gemm_timing);
  const int64_t params = vc.num_parameters();
  for (int64_t n = 10000; n < params; n *= 10)
    samples["optimizer|step"].push_back({double(n), 36.0 * n, time_optimizer(n, dev)});
  samples["optimizer|step"].push_back({double(params), 36.0 * params, time_optimizer(params, dev)});
  samples["copy|call"].push_back({1.0, 8.0 * 64, time_copy_call(dev)});
  const HostRates host = time_host_offload(dev);

  nlohmann::json j;
  nlohmann::json scales = nlohmann::json::object();
  for (const auto& [k, v] : layer_scale) scales[fmt::format("{} b{}", k.second, k.first)] = v;
  j["layer_scale"] = scales;
  j["layer_warmup_s"] = dev.is_cuda() ? o.calibrate_warmup_s : 0.0;
  j["device"] = fmt::format("{} ({}, {}), measured by colossalai benchmark --calibrate", name,
                            device, o.precision);
  nlohmann::json js = nlohmann::json::object();
  for (auto& [k, v] : samples) {
    std::sort(v.begin(), v.end());
    js[k] = v;
  }
  j["samples"] = js;
  if (!collectives.empty()) {
    nlohmann::json jc = nlohmann::json::array();
    for (const CollectiveTiming& c : collectives) {
      nlohmann::json e = {
          {"op", c.op}, {"group", c.group}, {"bytes", c.bytes}, {"seconds", c.seconds}};
      if (!c.layout.empty()) e["layout"] = c.layout;
      jc.push_back(e);
    }
    j["collectives"] = jc;
  }
  if (overlap.group > 0)
    j["overlap"] = {{"op", "all_reduce"},
                    {"group", overlap.group},
                    {"bytes", overlap.bytes},
                    {"alone_seconds", overlap.alone_s},
                    {"beside_seconds", overlap.beside_s}};
  if (!overlap.gpu_block_s.empty())
    j["gpu_speeds"] = {{"sustained_seconds", overlap.gpu_sustain_s},
                       {"block_seconds", overlap.gpu_block_s}};
  if (!overlap.posted.empty()) {
    nlohmann::json jp = nlohmann::json::array();
    for (const OverlapTiming::Posted& p : overlap.posted)
      jp.push_back({{"op", "p2p"},
                    {"bytes", overlap.bytes},
                    {"batch", p.batch},
                    {"max_ctas", overlap.p2p_max_ctas},
                    {"gemm_sm_margin", overlap.gemm_sm_margin},
                    {"alone_seconds", p.alone_s},
                    {"beside_seconds", p.beside_s}});
    j["posted"] = jp;
  }
  if (contention.group > 1)
    j["contention"] = {{"group", contention.group},
                       {"alone_seconds", contention.alone_s},
                       {"together_seconds", contention.together_s}};
  if (contention.wake_group > 1 && contention.poll_s > 0 && contention.late_s > 0)
    j["wake"] = {{"group", contention.wake_group},
                 {"poll_seconds", contention.poll_s},
                 {"base_seconds", contention.base_s},
                 {"late_seconds", contention.late_s}};
  // ZeRO-Offload's host side (the simulator's host copies and host ops); a CPU has no copies.
  j["host"] = {{"adam_elements_per_s", host.adam_elements_per_s},
               {"add_bytes_per_s", host.add_bytes_per_s}};
  if (host.h2d_bytes_per_s > 0) {
    j["host"]["h2d_bytes_per_s"] = host.h2d_bytes_per_s;
    j["host"]["d2h_bytes_per_s"] = host.d2h_bytes_per_s;
  }
  std::ofstream f(o.calibrate);
  CAI_CHECK(f.good(), "[benchmark] cannot write {}", o.calibrate);
  f << j.dump(1) << "\n";
  std::cout << fmt::format(
      "calibration: {} kernels of {} ({} batch sizes × tp {}), {} optimizer sizes and {} "
      "collective timings on {}; host (offload): Adam {:.3g} elements/s, add {:.3g} GB/s{} in "
      "{:.1f} s -> {}\n",
      timed, o.config, batches.size(), fmt::join(tps, "/"), samples["optimizer|step"].size(),
      collectives.size(), name, host.adam_elements_per_s, host.add_bytes_per_s / 1e9,
      host.h2d_bytes_per_s > 0 ? fmt::format(", pinned copies {:.3g} GB/s to the device and {:.3g} "
                                             "GB/s back",
                                             host.h2d_bytes_per_s / 1e9, host.d2h_bytes_per_s / 1e9)
                               : std::string(),
      std::chrono::duration<double>(Clock::now() - t0).count(), o.calibrate);
  return 0;
}

}  // namespace cai::app
