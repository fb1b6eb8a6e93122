// Run under mpirun: the step model (cai/plan) against the measured peak of real training steps.
//   mpirun -np 2 test_plan_memory [--zero Z] [--pp P --microbatches M [--style S] [--chunks V]
//                                 [--split-backward]] [--tp T [--sp]]
//                                 [--batch B] [--optimizer adam|sgd|lamb] [--checkpoint]
//                                 [--depth D] [--precision fp32|bf16] [--tolerance F]
// Every layout goes through parallel::HybridParallelPlugin (data parallel / ZeRO over dp,
// the pipeline executor for pp > 1, the tensor-parallel ViT for tp > 1) and the trainer's calls
// (forward_backward, sync_gradients, optimizer_step, zero_grad). One warm-up step creates the
// optimizer state; the second step is measured.
// Baseline: the allocator's bytes in use (cai::memory_in_use, every live CPU tensor of this
// process, i.e. this rank) after the batch is made and before the model is built. So the
// measured figure is everything training holds: parameters, gradients, ZeRO shards, optimizer
// state, buckets, activations, communication buffers and the working tensors of the layers; the
// plan predicts all of it from the config alone (nothing here is fitted to the measurement).
// Asserts, per rank, |measured peak − predicted peak| ≤ F (default 0.05) of the measured peak
// (bf16: the blocks compute in bf16, parameters and gradients stay fp32), and that the
// tensor-parallel bytes the layers sent (TensorParallel::comm_bytes) equal the plan's.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "cai/core/error.h"
#include "cai/core/rng.h"
#include "cai/dist/communicator.h"
#include "cai/nn/vit.h"
#include "cai/optim/optimizer.h"
#include "cai/parallel/hybrid.h"
#include "cai/plan/plan.h"
#include "cai/train/trainer.h"

using namespace cai;

namespace {

nn::ViTConfig model_config(bool checkpoint, int64_t depth) {
  nn::ViTConfig c;
  c.img_size = 28, c.patch_size = 7, c.in_chans = 1, c.num_classes = 10, c.embed_dim = 64;
  c.depth = depth, c.num_heads = 4, c.mlp_ratio = 4.0, c.drop_rate = 0.0f, c.drop_path_rate = 0.0f;
  c.checkpoint = checkpoint;
  return c;
}

double mib(int64_t b) {
  return static_cast<double>(b) / (1 << 20);
}

}  // namespace

int main(int argc, char** argv) {
  dist::MpiEnvironment env(&argc, &argv);
  plan::Layout lay;
  lay.batch = 8;
  lay.optimizer = "adam";
  bool checkpoint = false;
  int64_t depth = 4;
  double tolerance = 0.05;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::string(argv[++i]);
    };
    if (a == "--zero")
      lay.zero_stage = std::stoi(next());
    else if (a == "--pp")
      lay.pp = std::stoi(next());
    else if (a == "--microbatches")
      lay.num_microbatches = std::stoi(next());
    else if (a == "--style")
      lay.pp_style = next();
    else if (a == "--chunks")
      lay.chunks = std::stoi(next());
    else if (a == "--split-backward")
      lay.split_backward = true;
    else if (a == "--tp")
      lay.tp = std::stoi(next());
    else if (a == "--sp")
      lay.sequence_parallel = true;
    else if (a == "--batch")
      lay.batch = std::stoll(next());
    else if (a == "--optimizer")
      lay.optimizer = next();
    else if (a == "--checkpoint")
      checkpoint = true;
    else if (a == "--depth")
      depth = std::stoll(next());
    else if (a == "--tolerance")
      tolerance = std::stod(next());
    else if (a == "--precision") {
      const std::string v = next();
      if (v != "fp32" && v != "bf16") {
        std::fprintf(stderr, "--precision %s: expected fp32 or bf16\n", v.c_str());
        return 2;
      }
      lay.precision = v == "bf16" ? DType::BF16 : DType::F32;
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  try {
    auto world = env.world(60.0);
    const int rank = world->rank();
    lay.world = world->size();
    if (lay.world % (lay.tp * lay.pp) != 0) {
      std::printf("skipped: %d ranks do not split into tp %d × pp %d\n", lay.world, lay.tp, lay.pp);
      return 77;
    }
    const nn::ViTConfig vc = model_config(checkpoint, depth);
    const plan::StepPlan sp = plan::make_plan(vc, lay);
    const plan::RankPlan rp = plan::plan_rank(sp, rank);

    // This rank's batch (made before the baseline: the data is not training's).
    const int64_t B = lay.batch;
    data::Batch batch;
    batch.images = Tensor::empty({B, 1, 28, 28});
    rng::normal_(batch.images, 3, 11 + rank / (lay.tp * lay.pp), 0.0f, 1.0f);
    std::vector<int32_t> lab(B);
    for (int64_t i = 0; i < B; ++i) lab[i] = static_cast<int32_t>((i * 7 + rank) % 10);
    batch.labels = Tensor::from_vector(lab, {B});
    batch.global_batch_size = B * lay.dp();
    batch.sample_offset = B * (rank / (lay.tp * lay.pp));
    const int64_t base = memory_in_use();

    parallel::HybridParallelConfig hc;
    hc.tp_size = lay.tp;
    hc.pp_size = lay.pp;
    hc.sequence_parallel = lay.sequence_parallel;
    hc.dp.zero_stage = lay.zero_stage;
    hc.dp.ddp_bucket_cap_mb = lay.ddp_bucket_cap_mb;
    hc.dp.zero_bucket_size_in_m = lay.zero_bucket_size_in_m;
    hc.dp.zero_max_inflight_buckets = lay.zero_max_inflight_buckets;
    hc.dp.zero3_prefetch = lay.zero3_prefetch;
    hc.pipeline.style = lay.pp_style;
    hc.pipeline.num_microbatches = lay.num_microbatches;
    hc.pipeline.chunks = lay.chunks;
    hc.pipeline.split_backward = lay.split_backward;
    int64_t peak = 0, tp_bytes = 0;
    {
      parallel::HybridParallelPlugin plugin(*world, hc);
      nn::ViT model(vc, plugin.tensor_parallel());
      model.init(7);
      model.set_compute_dtype(lay.precision);
      plugin.setup(model);
      optim::OptimizerOptions oo;
      oo.name = lay.optimizer;
      auto opt = optim::make_optimizer(
          oo, optim::weight_decay_groups(plugin.optimizer_parameters(model), 1e-3, 0.0));
      train::Criterion crit;
      auto step = [&](uint64_t s) {
        plugin.forward_backward(model, {batch}, 1.0f / static_cast<float>(B * lay.dp()), crit,
                                nn::ForwardCtx{true, 42, s, 0});
        plugin.sync_gradients(model);
        plugin.optimizer_step(*opt);
        plugin.zero_grad(model, *opt);
      };
      step(0);
      world->barrier();
      if (auto tp = plugin.tensor_parallel()) tp->reset_comm_bytes();
      reset_peak_memory();
      step(1);
      peak = peak_memory() - base;
      if (auto tp = plugin.tensor_parallel()) tp_bytes = tp->comm_bytes();
      world->barrier();
    }
    const int64_t predicted = rp.memory.peak;
    const double err = static_cast<double>(predicted - peak) / static_cast<double>(peak);
    int64_t plan_tp_bytes = 0;
    for (const auto& lp : rp.layer_plans)
      for (const auto& c : lp.collectives) plan_tp_bytes += c.count * c.bytes * sp.micro_batches;
    const std::string name =
        fmt::format("dp {} pp {} tp {}{} zero {}{}{}", lay.dp(), lay.pp, lay.tp,
                    lay.sequence_parallel ? " sp" : "", lay.zero_stage,
                    lay.pp > 1 ? fmt::format(" {} m={}", lay.pp_style, sp.micro_batches) : "",
                    lay.precision == DType::BF16 ? " bf16" : "");
    const auto& m = rp.memory;
    // The table: one line per rank, in rank order.
    for (int r = 0; r < lay.world; ++r) {
      if (r == rank)
        std::printf(
            "| %-28s | rank %d (pp %d, tp %d) | measured %8.3f MiB | predicted %8.3f MiB | "
            "%+6.2f%% | persistent %.3f, activations %.3f (%d mb), comm %.3f, transient %.3f; "
            "peak at %s |\n",
            name.c_str(), rank, rp.pp_rank, rp.tp_rank, mib(peak), mib(predicted), 100 * err,
            mib(m.persistent()), mib(m.activations), m.micro_batches_in_flight, mib(m.window),
            mib(m.transient), m.peak_at.c_str());
      std::fflush(stdout);
      world->barrier();
    }
    bool ok = std::abs(err) <= tolerance;
    if (!ok)
      std::printf("[rank %d] FAILED: predicted peak %lld B is %.2f%% off the measured %lld B\n",
                  rank, static_cast<long long>(predicted), 100 * err, static_cast<long long>(peak));
    if (tp_bytes != plan_tp_bytes) {
      std::printf(
          "[rank %d] FAILED: the layers sent %lld tensor-parallel bytes, the plan says "
          "%lld\n",
          rank, static_cast<long long>(tp_bytes), static_cast<long long>(plan_tp_bytes));
      ok = false;
    }
    const double all_ok = world->all_reduce_scalar(ok ? 1.0 : 0.0, dist::ReduceOp::Min);
    if (rank == 0) std::printf("%s\n", all_ok == 1.0 ? "OK" : "FAILED");
    return all_ok == 1.0 ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "test_plan_memory: %s\n", e.what());
    dist::MpiEnvironment::abort(1);
  }
}
