// Run under mpirun: what ZeRO saves, measured with the tensor allocator's accounting
// (cai::memory_in_use / peak_memory: every live tensor storage of this process, i.e. this rank).
//   mpirun -np W test_zero_memory [--prefetch K] [--inflight B]
// One warm-up step (optimizer state created), then one measured step per stage 0..3 on the same
// model and local batch, the model, plugin and optimizer built afresh per stage. Memory is read
// after every layer hook, and at the end of backward once the activations are dropped. Stage 0
// is the reference: its parameters, gradients and buckets are persistent, so what its hook
// readings vary by is the activations, which are the same for every stage; another stage's
// reading minus stage 0's is what that stage holds on top of its persistent shards.
// Asserts, with N = parameter bytes, d = ranks, B_i = the largest buckets, L_i = the largest
// layers (elements):
//  - ZeRO-2/3, end of backward: full-size gradient bytes (beyond the N/d shard) ≤ the in-flight
//    buckets' buffers, Σ_{i<B} 4·B_i·(1 + 1/d);
//  - ZeRO-3, forward: parameter bytes beyond the N/d shard ≤ the current layer plus the
//    prefetched ones' gather buffers, and (prefetch ≥ 1) more than one layer: a gather is in
//    flight while a layer runs; backward: the same plus the current layer's gradients and
//    the in-flight buckets;
//  - ZeRO-1/2: the after-step all-gather allocates no more than the in-flight bucket window;
//  - the peak of every stage is below stage 0's by the persistent bytes the stage drops
//    (theory: DDP holds parameters and gradients in full, the gradients being views into its
//    fp32 buckets, and Adam's two moments in full), less that stage's window.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

#include "cai/core/error.h"
#include "cai/core/rng.h"
#include "cai/dist/communicator.h"
#include "cai/nn/vit.h"
#include "cai/ops/ops.h"
#include "cai/optim/optimizer.h"
#include "cai/parallel/data_parallel.h"
#include "cai/train/trainer.h"

using namespace cai;

namespace {

struct Figures {
  int64_t persistent = 0;         // memory at the start of the measured step (over the baseline)
  int64_t peak = 0;               // peak of the measured step (over the baseline)
  int64_t end_backward = 0;       // at the end of backward, activations dropped, minus start
  int64_t step_transient = 0;     // peak during optimizer_step minus the memory before it
  std::vector<int64_t> fwd, bwd;  // after each hook, minus start
  std::vector<int64_t> buckets, layers;  // elements
  int64_t numel = 0, shard = 0;          // parameter elements: all, this rank's chunks
};

nn::ViTConfig model_config() {
  nn::ViTConfig c;
  c.img_size = 28, c.patch_size = 7, c.in_chans = 1, c.num_classes = 10, c.embed_dim = 64;
  c.depth = 6, c.num_heads = 4, c.mlp_ratio = 4.0, c.drop_rate = 0.0f, c.drop_path_rate = 0.0f;
  return c;
}

Figures measure(dist::Communicator& comm, int zero, int prefetch, int inflight) {
  const int64_t base = memory_in_use();
  const int64_t batch = 2;
  Tensor images = Tensor::empty({batch, 1, 28, 28});
  rng::normal_(images, 3, 11 + comm.rank(), 0.0f, 1.0f);
  const Tensor labels = Tensor::from_vector(std::vector<int32_t>{3, 7}, {batch});

  nn::ViT model(model_config());
  model.init(7);
  parallel::DataParallelConfig dc;
  dc.zero_stage = zero;
  dc.ddp_bucket_cap_mb = 0.08;      // ≈ 21k elements: several buckets
  dc.zero_bucket_size_in_m = 0.02;  // 20k elements
  dc.zero_max_inflight_buckets = inflight;
  dc.zero3_prefetch = prefetch;
  parallel::DataParallelPlugin plugin(comm, dc);
  plugin.setup(model);
  optim::OptimizerOptions oo;
  oo.name = "adam";
  auto opt = optim::make_optimizer(
      oo, optim::weight_decay_groups(plugin.optimizer_parameters(model), 0.0, 0.0));

  Figures f;
  f.buckets = plugin.bucket_numels();
  // Layer sizes from a fresh model's shapes (ZeRO-3 has released the values).
  {
    nn::ViT shapes(model_config());
    for (auto& l : shapes.layers()) {
      std::vector<nn::Parameter*> ps;
      l->collect(ps);
      int64_t n = 0;
      for (nn::Parameter* p : ps) {
        const int64_t e = p->value.numel();
        n += e;
        f.shard += e * (comm.rank() + 1) / comm.size() - e * comm.rank() / comm.size();
      }
      f.numel += n;
      f.layers.push_back(n);
    }
  }

  int64_t start = 0, peak = 0;
  // One training step as the trainer runs it; `record`: read memory after every hook, at the end
  // of backward (activations dropped), the step's peak and the optimizer step's transient.
  auto step = [&](bool record) {
    const nn::LayerHooks* inner = plugin.train_hooks(true);
    CAI_CHECK(inner, "[zero_memory] the plugin gave no hooks");
    auto wrap = [&](const std::function<void(nn::Layer&)>& h, bool backward) {
      return [&, h, backward](nn::Layer& l) {
        if (h) h(l);
        if (record) (backward ? f.bwd : f.fwd).push_back(memory_in_use() - start);
      };
    };
    nn::LayerHooks hooks{wrap(inner->before_forward, false), wrap(inner->after_forward, false),
                         wrap(inner->before_backward, true), wrap(inner->after_backward, true),
                         inner->overlap_point};
    nn::ForwardCtx ctx;
    ctx.training = true;
    {
      std::vector<std::unique_ptr<nn::Cache>> caches;
      Tensor logits = model.forward(images, caches, ctx, &hooks);
      Tensor dl = ops::cross_entropy_bwd(logits, labels, 0.0f, 1.0f / (batch * comm.size()));
      logits = Tensor();
      model.backward(dl, caches, ctx, &hooks);
    }
    if (record) f.end_backward = memory_in_use() - start;
    plugin.sync_gradients(model);
    peak = peak_memory();
    const int64_t before_step = memory_in_use();
    reset_peak_memory();
    plugin.optimizer_step(*opt);
    if (record) f.step_transient = peak_memory() - before_step;
    peak = std::max(peak, peak_memory());
    plugin.zero_grad(model, *opt);
  };
  step(false);  // the optimizer state now exists
  start = memory_in_use();
  f.persistent = start - base;
  reset_peak_memory();
  step(true);
  f.peak = peak - base;
  return f;
}

// The k largest of v, summed.
int64_t largest(std::vector<int64_t> v, int k) {
  std::sort(v.rbegin(), v.rend());
  int64_t s = 0;
  for (int i = 0; i < k && i < static_cast<int>(v.size()); ++i) s += v[i];
  return s;
}

double kib(int64_t b) {
  return static_cast<double>(b) / 1024.0;
}

}  // namespace

int main(int argc, char** argv) {
  dist::MpiEnvironment env(&argc, &argv);
  int prefetch = 1, inflight = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--prefetch" && i + 1 < argc)
      prefetch = std::atoi(argv[++i]);
    else if (a == "--inflight" && i + 1 < argc)
      inflight = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  try {
    auto world = env.world(60.0);
    const int d = world->size(), rank = world->rank();
    if (d < 2) {
      std::printf("skipped: needs at least 2 ranks (got %d)\n", d);
      return 77;
    }
    Figures fs[4];
    for (int s = 0; s < 4; ++s) fs[s] = measure(*world, s, prefetch, inflight);
    const Figures& f0 = fs[0];
    const int64_t N = 4 * f0.numel, sh = 4 * f0.shard;
    const double inv_d = 1.0 / d;
    bool ok = true;
    auto check = [&](bool cond, const std::string& what) {
      if (!cond) std::printf("[rank %d] FAILED: %s\n", rank, what.c_str());
      ok = ok && cond;
    };
    // In-flight reduction buffers (flat + this rank's chunk), per stage's buckets.
    auto grad_window = [&](const Figures& f) {
      return static_cast<int64_t>(4.0 * largest(f.buckets, inflight) * (1.0 + inv_d)) + 4 * 256;
    };
    // ZeRO-3 parameters beyond the shard: the layer in use plus the prefetched layers' gather
    // buffers (full + this rank's packed chunk).
    const Figures& f3 = fs[3];
    const int64_t L0 = largest(f3.layers, 1);
    const int64_t param_window =
        4 * (L0 + static_cast<int64_t>(largest(f3.layers, prefetch) * (1.0 + inv_d))) + 4 * 256;
    std::printf(
        "[rank %d] dp %d, N = %.1f KiB of parameters (%lld elements, shard %.1f KiB), %zu layers "
        "(largest %lld elements), prefetch %d, in-flight buckets %d\n",
        rank, d, kib(N), static_cast<long long>(f0.numel), kib(sh), f3.layers.size(),
        static_cast<long long>(L0), prefetch, inflight);

    // Persistent bytes by theory (Adam: two moments per optimizer element).
    int64_t theory[4];
    theory[0] = N + N + 2 * N;         // params, grads (= the bucket buffers), moments
    theory[1] = N + N + sh + 2 * sh;   // + shard values (their grads: views), shard moments
    theory[2] = N + sh + sh + 2 * sh;  // full params, shard values/grads/moments
    theory[3] = sh + sh + 2 * sh;      // shards only
    for (int s = 0; s < 4; ++s) {
      const Figures& f = fs[s];
      int64_t fwd_excess = 0, bwd_excess = 0;
      for (size_t i = 0; i < f.fwd.size() && i < f0.fwd.size(); ++i)
        fwd_excess = std::max(fwd_excess, f.fwd[i] - f0.fwd[i]);
      for (size_t i = 0; i < f.bwd.size() && i < f0.bwd.size(); ++i)
        bwd_excess = std::max(bwd_excess, f.bwd[i] - f0.bwd[i]);
      check(f.fwd.size() == f0.fwd.size() && f.bwd.size() == f0.bwd.size(),
            fmt::format("stage {} ran {} / {} hooks, stage 0 {} / {}", s, f.fwd.size(),
                        f.bwd.size(), f0.fwd.size(), f0.bwd.size()));
      const int64_t saving = f0.peak - f.peak, theory_saving = theory[0] - theory[s];
      // Transient bytes of the stage at any point of backward: ZeRO-2, the layer being run's
      // full gradients, a partly filled bucket and the in-flight ones; ZeRO-3, its parameters
      // and prefetched gathers too; ZeRO-1, the last step's parameter all-gathers deferred into
      // the forward (at most the in-flight window), where the peak falls when the backward's
      // working tensors are fewer than the forward's last ones.
      const int64_t bwd_window = 4 * (L0 + largest(f.buckets, 1)) + grad_window(f);
      const int64_t window = s == 3   ? param_window + 4 * L0 + grad_window(f)
                             : s == 2 ? bwd_window
                                      : grad_window(f);
      std::printf(
          "[rank %d] zero %d: persistent %.1f KiB (theory %.1f), peak %.1f KiB, saving vs "
          "stage 0 %.1f KiB (theory %.1f, window %.1f), end-of-backward gradients %.1f KiB "
          "beyond the shard (window %.1f), forward excess %.1f KiB, backward excess %.1f KiB, "
          "after-step transient %.1f KiB\n",
          rank, s, kib(f.persistent), kib(theory[s]), kib(f.peak), kib(saving), kib(theory_saving),
          kib(window), kib(f.end_backward), kib(grad_window(f)), kib(fwd_excess), kib(bwd_excess),
          kib(f.step_transient));
      if (s >= 2)
        check(f.end_backward <= grad_window(f),
              fmt::format("zero {}: {} B of full-size gradients alive at the end of backward, "
                          "more than the {} in-flight buckets' {} B",
                          s, f.end_backward, inflight, grad_window(f)));
      if (s == 2)
        check(bwd_excess <= bwd_window,
              fmt::format("zero 2: {} B of full-size gradients at a point of backward, more than "
                          "the layer in use, a partly filled bucket and the in-flight ones: {} B",
                          bwd_excess, bwd_window));
      if (s == 3) {
        // Prefetch: some layer ran while the next one's gather was in flight (its buffers
        // alive beside the layer's values).
        check(prefetch == 0 || fwd_excess > 4 * L0,
              fmt::format("zero 3, prefetch {}: at most {} B of gathered parameters in forward: "
                          "no all-gather was in flight while a layer ran",
                          prefetch, fwd_excess));
        check(fwd_excess <= param_window,
              fmt::format("zero 3: {} B of gathered parameters in forward beyond the shard, "
                          "more than the window's {} B (layer in use + {} prefetched)",
                          fwd_excess, param_window, prefetch));
        check(bwd_excess <= param_window + 4 * L0 + grad_window(f),
              fmt::format("zero 3: {} B of gathered parameters and gradients in backward, more "
                          "than {} B",
                          bwd_excess, param_window + 4 * L0 + grad_window(f)));
        check(f.step_transient <= 4 * 256,
              fmt::format("zero 3: the optimizer step allocated {} B", f.step_transient));
      }
      if (s == 1 || s == 2)
        check(f.step_transient <= grad_window(f),
              fmt::format("zero {}: the after-step all-gather allocated {} B, more than the "
                          "in-flight window's {} B",
                          s, f.step_transient, grad_window(f)));
      if (s > 0)
        check(saving >= theory_saving - window - N / 50 && saving <= theory_saving + N / 50,
              fmt::format("zero {}: the peak is {} B below stage 0's, theory says {} B (window "
                          "{} B)",
                          s, saving, theory_saving, window));
    }
    const double all_ok = world->all_reduce_scalar(ok ? 1.0 : 0.0, dist::ReduceOp::Min);
    std::printf("[rank %d] %s\n", rank, all_ok == 1.0 ? "OK" : "FAILED");
    return all_ok == 1.0 ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "test_zero_memory: %s\n", e.what());
    dist::MpiEnvironment::abort(1);
  }
}
