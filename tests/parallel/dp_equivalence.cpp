// Run under mpirun: N training steps with data parallelism / ZeRO / pipeline parallelism on W
// ranks give the losses and parameters of one process with the same global batch (fp32, ≤ 1e-5
// relative), and per-rank optimizer state (ZeRO ≥ 1) and parameter bytes (ZeRO 3) shrink to
// ≈ 1/dp.
//   mpirun -np W test_dp_equivalence --zero S [--accum A] [--steps N] [--no-overlap]
//            [--pp P --style gpipe|1f1b|interleaved|zbh1|zbv --chunks V --microbatches M
//             [--split-backward]]
//            [--tp T [--sp] [--tp-mode 1d|2d|2.5d|3d [--tp-depth D]]] [--device cpu|cuda]
//            [--cpu-offload] [--bucket-dtype fp32|bf16] [--copy-engine] [--exchange]
//            [--data DIR]
// --copy-engine (DDP / ZeRO-1 on GPUs): the buckets all-reduced by the copy engines
// (DataParallelConfig::copy_engine_all_reduce); fails unless the plugin could enable it.
// --exchange (DDP on GPUs): the copy-engine gradient exchange
// (DataParallelConfig::copy_engine_exchange); fails unless the plugin could enable it.
// --tp T: tensor parallelism (1D, --sp: with sequence parallelism) through the
// HybridParallelPlugin (with --pp and data parallelism over the remaining ranks); the parameters
// compared are its full_state(): the shards of every rank gathered back to timm's shapes.
// --grad-check: one step of plain SGD (lr 100; no momentum, weight decay or clipping): each
// parameter's change (-lr x its full gradient, gathered from the shards and stages) against the
// single run's, <= 1e-5 relative per parameter, printing the worst; with tensor parallelism also
// each rank's own part of every sharded parameter against the single run's slice (a replica of a
// part is not in the gathered state). A gradient scaled by 1.01 on one rank's shard, or a zeroed
// shard, fails it (checked once by hand: docs/TENSOR_PARALLEL.md).
// --cpu-offload (ZeRO >= 1): ZeRO-Offload; the distributed run steps its host shards with
// HybridAdam (for --optimizer adamw, the default) and must keep no optimizer state on the GPU
// and 1/dp of the single run's state in host memory.
// --device cuda: one GPU per rank (local rank), the ranks talk over NCCL, and the reference is
// the single-process run on one GPU; exits 77 (skipped, saying why) without CUDA or enough GPUs.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "../dist/gpu_env.h"
#include "cai/core/error.h"
#include "cai/data/data.h"
#include "cai/dist/communicator.h"
#include "cai/dist/launch.h"
#include "cai/dist/mesh.h"
#include "cai/nn/tensor_parallel.h"
#include "cai/nn/vit.h"
#include "cai/optim/optimizer.h"
#include "cai/parallel/data_parallel.h"
#include "cai/parallel/hybrid.h"
#include "cai/parallel/pipeline.h"
#include "cai/train/trainer.h"

using namespace cai;

namespace {

// A tensor-parallel rank's own part of a sharded parameter after the step (--grad-check): the
// gathered full_state() keeps the lowest rank's copy of a part several ranks hold (2D/2.5D/3D
// replicas), so each rank's copy is compared with the single run's slice as well.
struct LocalPart {
  std::string name;
  nn::ShardSpec shard;
  std::vector<float> value;
};

struct Result {
  std::vector<double> losses;
  train::EvalResult eval;  // after training, on held-out images
  std::vector<float> params;
  std::vector<float> initial;                          // the single run's, before training
  std::vector<std::pair<std::string, int64_t>> sizes;  // the single run's parameters, in order
  std::vector<Shape> full_shapes;                      // the single run's, in the same order
  std::vector<LocalPart> parts;                        // tensor parallel: this rank's shards
  int64_t state_bytes = 0, param_bytes = 0;
  int64_t state_gpu_bytes = 0, state_host_bytes = 0;
};

class RecordLoss : public train::Hook {
 public:
  explicit RecordLoss(std::vector<double>& out) : out_(out) {}
  void after_step(train::Trainer&, const train::StepInfo& s) override { out_.push_back(s.loss); }

 private:
  std::vector<double>& out_;
};

struct PipeArgs {
  int pp = 1, chunks = 1, microbatches = 0, depth = 3;
  std::string style = "1f1b";
  int tp = 1;
  std::string tp_mode = "1d";
  int tp_depth = 1;
  bool sp = false;
  std::string precision = "fp32";
  std::string bucket_dtype = "fp32";  // --bucket-dtype bf16: DDP/ZeRO-1 buckets all-reduced in bf16
  bool copy_engine = false;           // --copy-engine: the buckets' all-reduce on the copy engines
  bool exchange = false;              // --exchange: the copy-engine gradient exchange
  double bucket_hold = 0;             // --bucket-hold F: DataParallelConfig::bucket_hold
  // --grad-check: one step of plain SGD (no momentum, no weight decay, no clipping), so each
  // parameter's change is -lr × its gradient, compared per parameter: a gradient scaled by a
  // constant, or one tensor's wrong, cannot hide in the global error after AdamW and clipping.
  bool grad_check = false;
  // --split-backward: each Backward as BackwardInput + BackwardWeight (Layer::backward_input /
  // backward_weight); zero-bubble styles set it themselves.
  bool split_backward = false;
  int heads = 4;       // --heads: 3 or 6 for grids of q = 3 (2D on 9 ranks, 2.5D q 3)
  int eval_batch = 8;  // --eval-batch: a multiple of the batch chunks (q = 3: 12)
};

Result run(dist::Communicator* comm, int zero, int accum, int steps, bool overlap,
           const std::string& optimizer, const PipeArgs& pa, Device dev, const std::string& data,
           bool cpu_offload = false) {
  const int world_size = comm ? comm->size() : 1;
  const dist::ProcessMesh mesh(world_size, comm ? pa.tp : 1, comm ? pa.pp : 1);
  const int world = mesh.dp_size(), rank = mesh.coord(comm ? comm->rank() : 0).dp;
  const int64_t global_batch = 24;
  auto ds = data::subset(data::load_mnist_dir(data, true, "fashion-mnist"), global_batch * steps);
  data::LoaderConfig lc;
  lc.batch_size = global_batch / accum / world;
  lc.world = world, lc.rank = rank, lc.seed = 9, lc.num_workers = 0;
  lc.transform.normalize = data::normalization_for("fashion_mnist");
  lc.transform.random_crop = 28, lc.transform.crop_padding = 2;
  data::DataLoader loader(ds, lc);
  // Evaluation: 48 test images, batches of 8 per data-parallel rank (4 data-parallel ranks: a
  // short last batch of 4; a pipeline splits each batch into its micro-batches, 3 micro-batches:
  // 3, 3 and 2 rows; 2d/2.5d/3d split a batch into 2 or 4 chunks: multiples of 4).
  auto eval_ds = data::subset(data::load_mnist_dir(data, false, "fashion-mnist"), 48);
  data::LoaderConfig ec;
  ec.batch_size = pa.eval_batch;
  ec.world = world, ec.rank = rank, ec.seed = 9, ec.num_workers = 0, ec.shuffle = false;
  ec.transform.normalize = lc.transform.normalize;
  data::DataLoader eval_loader(eval_ds, ec);

  nn::ViTConfig c;
  c.img_size = 28, c.patch_size = 7, c.in_chans = 1, c.num_classes = 10, c.embed_dim = 24;
  c.depth = pa.depth, c.num_heads = pa.heads, c.mlp_ratio = 2.0, c.drop_rate = 0.1f,
  c.drop_path_rate = 0.1f;
  std::shared_ptr<parallel::HybridParallelPlugin> hybrid;
  if (comm && pa.tp > 1) {
    parallel::HybridParallelConfig hc;
    hc.tp_size = pa.tp;
    hc.pp_size = pa.pp;
    hc.sequence_parallel = pa.sp;
    hc.tp_mode = pa.tp_mode;
    hc.tp_depth = pa.tp_depth;
    hc.pipeline.style = pa.style;
    hc.pipeline.chunks = pa.chunks;
    hc.pipeline.num_microbatches = pa.microbatches;
    hc.pipeline.split_backward = pa.split_backward;
    hc.dp.zero_stage = zero;
    hc.dp.overlap = overlap;
    hc.dp.ddp_bucket_cap_mb = 0.01;
    hc.dp.zero_bucket_size_in_m = 0.003;
    hc.dp.cpu_offload = cpu_offload;
    hc.dp.offload_dtype = dtype_from_name(pa.precision);
    hc.dp.bucket_dtype = dtype_from_name(pa.bucket_dtype);
    hybrid = std::make_shared<parallel::HybridParallelPlugin>(*comm, hc);
  }
  nn::ViT model(c, hybrid ? hybrid->tensor_parallel() : nullptr);
  const int wrank = comm ? comm->rank() : 0;
  // dp ranks start different: the broadcast must fix it.
  model.init(mesh.coord(wrank).dp == 0 || pa.pp > 1 ? 7 : 100 + wrank);
  if (dev.is_cuda()) model.to(dev);
  std::map<std::string, Shape> shapes;
  for (nn::Parameter* p : model.parameters()) shapes[p->name] = p->value.shape();

  std::shared_ptr<train::Plugin> plugin;
  std::shared_ptr<parallel::DataParallelPlugin> dpp;
  std::shared_ptr<parallel::PipelinePlugin> pipe;
  if (hybrid) {
    plugin = hybrid;
  } else if (comm && pa.pp > 1) {
    parallel::PipelineConfig pc;
    pc.style = pa.style;
    pc.chunks = pa.chunks;
    pc.num_microbatches = pa.microbatches;
    pc.split_backward = pa.split_backward;
    pc.dp.zero_stage = zero;
    pc.dp.ddp_bucket_cap_mb = 0.01;
    pc.dp.bucket_dtype = dtype_from_name(pa.bucket_dtype);
    pipe = std::make_shared<parallel::PipelinePlugin>(*comm, mesh, pc);
    plugin = pipe;
  } else if (comm) {
    parallel::DataParallelConfig dc;
    dc.zero_stage = zero;
    dc.overlap = overlap;
    dc.ddp_bucket_cap_mb = 0.01;  // several buckets even for this small model
    dc.zero_bucket_size_in_m = 0.003;
    dc.cpu_offload = cpu_offload;
    dc.offload_dtype = dtype_from_name(pa.precision);
    dc.bucket_dtype = dtype_from_name(pa.bucket_dtype);
    dc.copy_engine_all_reduce = pa.copy_engine;
    dc.copy_engine_exchange = pa.exchange;
    dc.bucket_hold = pa.bucket_hold;
    dpp = std::make_shared<parallel::DataParallelPlugin>(*comm, dc);
    plugin = dpp;
  } else {
    plugin = std::make_shared<train::Plugin>();
  }
  plugin->setup(model);
  CAI_CHECK(!pa.copy_engine || !dpp || dpp->uses_copy_engine_all_reduce(),
            "--copy-engine: the plugin '{}' did not enable the copy-engine all-reduce",
            plugin->name());
  CAI_CHECK(!pa.exchange || !dpp || dpp->uses_copy_engine_exchange(),
            "--exchange: the plugin '{}' did not enable the copy-engine gradient exchange",
            plugin->name());
  optim::OptimizerOptions oo;
  oo.name = cpu_offload && optimizer == "adamw" ? "hybrid_adam" : optimizer;
  if (pa.grad_check) oo.name = "sgd", oo.momentum = 0;
  auto opt =
      // --grad-check: lr 100, so the change (about 0.1) is the gradient's to float precision,
      // not the parameter's rounding (lr 1e-2 moves a weight by ~1e-5, near its ulp).
      optim::make_optimizer(
          oo, optim::weight_decay_groups(plugin->optimizer_parameters(model),
                                         pa.grad_check ? 100.0 : 1e-2, pa.grad_check ? 0.0 : 0.05));
  train::TrainerConfig tc;
  tc.gradient_accumulation = accum;
  tc.clip_grad_norm = pa.grad_check ? 0.0 : 0.5;
  tc.seed = 5;
  tc.precision = dtype_from_name(pa.precision);
  train::Trainer t(model, *opt, train::Criterion{0.1f}, loader, nullptr, plugin, tc);
  Result r;
  if (!comm)  // the single run holds every parameter whole
    for (nn::Parameter* p : model.parameters()) {
      r.sizes.emplace_back(p->name, p->value.numel());
      r.full_shapes.push_back(p->value.shape());
      for (float v : p->value.to_vector()) r.initial.push_back(v);
    }
  t.add_hook(std::make_shared<RecordLoss>(r.losses));
  t.fit();
  // Stage 0/1: where the last step's backward launched its buckets. Overlapped: at several
  // points; --bucket-hold F: the first burst holds at least the share F of the gradients (2%
  // slack for the views' padding in bucket_numels; on a small model one burst may hold all),
  // and F = 1 launches them all at once.
  if (dpp && zero <= 1) {
    const std::vector<int> bursts = dpp->launch_bursts();
    const std::vector<int64_t> numels = dpp->bucket_numels();
    int launched = 0;
    for (int b : bursts) launched += b;
    CAI_CHECK(!bursts.empty() && launched == static_cast<int>(numels.size()),
              "the last step launched {} buckets in {} bursts, expected all {}", launched,
              bursts.size(), numels.size());
    double total = 0, first = 0;
    for (size_t i = 0; i < numels.size(); ++i) {
      total += static_cast<double>(numels[i]);
      if (static_cast<int>(i) < bursts[0]) first += static_cast<double>(numels[i]);
    }
    if (pa.bucket_hold >= 1)
      CAI_CHECK(bursts.size() == 1, "--bucket-hold {}: {} launch bursts, expected 1",
                pa.bucket_hold, bursts.size());
    else if (pa.bucket_hold > 0)
      CAI_CHECK(first >= (pa.bucket_hold - 0.02) * total,
                "--bucket-hold {}: the first of {} bursts launched {} of {} elements",
                pa.bucket_hold, bursts.size(), first, total);
    else if (overlap && numels.size() >= 3)
      CAI_CHECK(bursts.size() >= 3, "overlapped buckets: {} launch bursts for {} buckets",
                bursts.size(), numels.size());
    if (comm->rank() == 0) {
      std::printf("launch bursts (buckets):");
      for (int b : bursts) std::printf(" %d", b);
      std::printf("\n");
    }
  }
  // --cpu-offload: stage 2/3 kept no gradient shard on the device and streamed every
  // micro-batch's reduced chunks (the whole shard each time) to the host; stage 1 copied its
  // device shard instead. Every step (and the setup) uploaded the whole shard.
  if (dpp && cpu_offload) {
    const auto t = dpp->offload_traffic();
    const int64_t S = t.shard_elements;
    const bool streamed = zero >= 2;
    CAI_CHECK(
        S > 0 &&
            (streamed ? t.device_gradient_bytes == 0
                      : t.device_gradient_bytes >= 4 * S && t.device_gradient_bytes <= 5 * S) &&
            t.bytes_down == (streamed ? int64_t{4} * S * steps * accum : 0) &&
            (t.chunks_down > 0) == streamed && t.bytes_up >= 2 * S * (steps + 1) &&
            t.bytes_up <= 5 * S * (steps + 1) &&  // (the host layout's line padding)
            // Streamed, every step's clip took the sums the last micro-batch's adds computed
            // (the comparison above then covers them); fp16's unscale rewrites the gradients.
            t.clips_streamed ==
                (streamed && !pa.grad_check && pa.precision != "fp16" ? steps : 0) &&
            // bf16 device copies: every host step ran beside the next forward (the comparison
            // above then covers the gathers' waits for it, the eval's and the final read's).
            t.steps_overlapped == (pa.precision == "bf16" ? steps : 0),
        "--cpu-offload zero {}: shard {} elements, {} device gradient bytes, {} chunks "
        "({} B) to the host and {} B back over {} steps of {} micro-batches, {} clips from the "
        "streamed sums, {} host steps beside the forward",
        zero, S, t.device_gradient_bytes, t.chunks_down, t.bytes_down, t.bytes_up, steps, accum,
        t.clips_streamed, t.steps_overlapped);
  }
  // --split-backward: the steps ran programs of BackwardInput and BackwardWeight (a run of whole
  // Backwards would pass the comparison without testing the split). The reference is whole.
  if (comm && pa.split_backward) {
    parallel::PipelinePlugin* pp = pipe ? pipe.get() : hybrid ? hybrid->pipeline() : nullptr;
    CAI_CHECK(pp, "--split-backward needs a pipeline (--pp > 1)");
    int b_in = 0, b_w = 0, whole = 0;
    for (const auto& prog : pp->schedule_for(lc.batch_size).programs)
      for (const auto& in : prog) {
        b_in += in.op == schedule::Op::BackwardInput;
        b_w += in.op == schedule::Op::BackwardWeight;
        whole += in.op == schedule::Op::Backward;
      }
    CAI_CHECK(b_in > 0 && b_in == b_w && whole == 0,
              "--split-backward: the schedule has {} BackwardInput, {} BackwardWeight and {} "
              "Backward instructions",
              b_in, b_w, whole);
  }
  r.eval = t.evaluate(eval_loader);
  r.state_bytes = opt->state_bytes();
  r.state_gpu_bytes = opt->state_bytes(true);
  r.state_host_bytes = opt->state_bytes(false);
  r.param_bytes = dpp ? dpp->parameter_bytes() : 0;
  if (dpp) dpp->materialize_parameters();
  if (hybrid) {  // every rank's shards, gathered to timm's shapes
    const auto state = hybrid->full_state(model);
    for (nn::Parameter* p : model.parameters())
      for (float v : state.at(p->name).to_vector()) r.params.push_back(v);
    if (pa.grad_check)  // this rank's parts as they are (ZeRO-3: materialized by full_state)
      for (nn::Parameter* p : model.parameters())
        if (p->shard.sharded() && p->value.defined() && p->value.numel() > 0)
          r.parts.push_back(LocalPart{p->name, p->shard, p->value.to_vector()});
    for (nn::Parameter* p : model.parameters())
      if (p->value.defined()) r.param_bytes += p->value.nbytes();
    return r;
  }
  // A pipeline stage holds only its layers: compare those (NaN marks the others).
  for (nn::Parameter* p : model.parameters()) {
    if (!p->value.defined()) {
      for (int64_t i = 0; i < shape_numel(shapes.at(p->name)); ++i) r.params.push_back(NAN);
      continue;
    }
    for (float v : p->value.to_vector()) r.params.push_back(v);
  }
  if (!dpp) {
    for (nn::Parameter* p : model.parameters()) r.param_bytes += p->value.nbytes();
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  dist::prefer_eager_cuda_module_loading(dist::launch_from_env());  // before MPI and CUDA start
  dist::MpiEnvironment env(&argc, &argv);
  int zero = 0, accum = 1, steps = 4;
  bool overlap = true, cpu_offload = false;
  std::string optimizer = "adamw";
  std::string device = "cpu", data = "/usr/share/datasets/fashion-mnist";
  PipeArgs pa;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--zero" && i + 1 < argc)
      zero = std::atoi(argv[++i]);
    else if (a == "--accum" && i + 1 < argc)
      accum = std::atoi(argv[++i]);
    else if (a == "--steps" && i + 1 < argc)
      steps = std::atoi(argv[++i]);
    else if (a == "--optimizer" && i + 1 < argc)
      optimizer = argv[++i];
    else if (a == "--cpu-offload")
      cpu_offload = true;
    else if (a == "--no-overlap")
      overlap = false;
    else if (a == "--pp" && i + 1 < argc)
      pa.pp = std::atoi(argv[++i]);
    else if (a == "--depth" && i + 1 < argc)
      pa.depth = std::atoi(argv[++i]);
    else if (a == "--chunks" && i + 1 < argc)
      pa.chunks = std::atoi(argv[++i]);
    else if (a == "--microbatches" && i + 1 < argc)
      pa.microbatches = std::atoi(argv[++i]);
    else if (a == "--style" && i + 1 < argc)
      pa.style = argv[++i];
    else if (a == "--tp" && i + 1 < argc)
      pa.tp = std::atoi(argv[++i]);
    else if (a == "--tp-mode" && i + 1 < argc)
      pa.tp_mode = argv[++i];
    else if (a == "--tp-depth" && i + 1 < argc)
      pa.tp_depth = std::atoi(argv[++i]);
    else if (a == "--sp")
      pa.sp = true;
    else if (a == "--bucket-dtype" && i + 1 < argc)
      pa.bucket_dtype = argv[++i];
    else if (a == "--copy-engine")
      pa.copy_engine = true;
    else if (a == "--exchange")
      pa.exchange = true;
    else if (a == "--bucket-hold" && i + 1 < argc)
      pa.bucket_hold = std::atof(argv[++i]);
    else if (a == "--precision" && i + 1 < argc)
      pa.precision = argv[++i];
    else if (a == "--device" && i + 1 < argc)
      device = argv[++i];
    else if (a == "--data" && i + 1 < argc)
      data = argv[++i];
    else if (a == "--heads" && i + 1 < argc)
      pa.heads = std::atoi(argv[++i]);
    else if (a == "--eval-batch" && i + 1 < argc)
      pa.eval_batch = std::atoi(argv[++i]);
    else if (a == "--split-backward")
      pa.split_backward = true;
    else if (a == "--grad-check")
      pa.grad_check = true, steps = 1;
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  // The zero-bubble schedules always split the backward: check that their programs did.
  if (pa.style == "zbh1" || pa.style == "zbv") pa.split_backward = true;
  if (device != "cpu" && device != "cuda") {
    std::fprintf(stderr, "--device %s is not cpu or cuda\n", device.c_str());
    return 2;
  }
  try {
    auto world = env.world(60.0);
    // On GPUs the ranks talk over NCCL (built from the MPI world, which still reduces the
    // verdict below).
    std::unique_ptr<dist::Communicator> nccl;
    Device dev = Device::cpu();
    if (device == "cuda") {
      const std::string why = test::gpu_skip_reason();
      if (!why.empty()) {
        if (world->rank() == 0) std::printf("skipped: %s\n", why.c_str());
        return test::kSkip;
      }
      dev = Device::cuda(test::select_gpu());
      nccl = dist::make_nccl(*world, dev.index);
    }
    dist::Communicator* comm = nccl ? nccl.get() : world.get();
    const Result ref = run(nullptr, 0, accum, steps, overlap, optimizer, pa, dev, data);
    const Result dist =
        run(comm, zero, accum, steps, overlap, optimizer, pa, dev, data, cpu_offload);
    bool ok = ref.losses.size() == dist.losses.size() && ref.params.size() == dist.params.size();
    double loss_err = 0, num = 0, den = 0;
    for (size_t i = 0; ok && i < ref.losses.size(); ++i)
      loss_err =
          std::max(loss_err, std::abs(ref.losses[i] - dist.losses[i]) / std::abs(ref.losses[i]));
    size_t compared = 0;
    for (size_t i = 0; ok && i < ref.params.size(); ++i) {
      if (std::isnan(dist.params[i])) continue;  // another pipeline stage's layer
      num += std::pow(double(ref.params[i]) - dist.params[i], 2), den += std::pow(ref.params[i], 2);
      ++compared;
    }
    ok = ok && compared > 0;
    const double param_err = std::sqrt(num / den);
    // --grad-check: per parameter, the change of one SGD step (-lr × the gradient) against the
    // single run's, ≤ 1e-5 relative (norm-wise, with a floor for all-zero gradients); measured
    // 4e-7 (DDP, ZeRO-3) to 8e-7 (1D + SP, 2D and 2.5D with q = 2 and 3), and each rank's own
    // parts up to 1.2e-6 (2D q = 3, 2.5D q = 2 depth 2).
    double worst_grad = 0, worst_part = 0;
    std::string worst_name = "-", worst_part_name = "-";
    if (pa.grad_check) {
      ok = ok && ref.initial.size() == ref.params.size();
      std::vector<char> checked(ref.sizes.size(), 0);
      size_t at = 0;
      for (size_t k = 0; ok && k < ref.sizes.size(); ++k) {
        double n2 = 0, d2 = 0;
        bool here = false;
        for (int64_t j = 0; j < ref.sizes[k].second; ++j, ++at) {
          if (std::isnan(dist.params[at])) continue;
          here = true;
          const double gr = double(ref.params[at]) - ref.initial[at];
          const double gd = double(dist.params[at]) - ref.initial[at];
          n2 += (gd - gr) * (gd - gr), d2 += gr * gr;
        }
        checked[k] = here;
        if (!here) continue;
        const double e = std::sqrt(n2) / (std::sqrt(d2) + 1e-12);
        if (e > worst_grad) worst_grad = e, worst_name = ref.sizes[k].first;
      }
      // Every parameter checked by some rank (a pipeline stage checks its own layers only).
      for (size_t k = 0; k < ref.sizes.size(); ++k)
        if (world->all_reduce_scalar(checked[k] ? 1.0 : 0.0, dist::ReduceOp::Max) != 1.0) {
          ok = false;
          if (world->rank() == 0)
            std::printf("grad-check: no rank compared %s\n", ref.sizes[k].first.c_str());
        }
      // Tensor parallel: this rank's own part of each sharded parameter against the single
      // run's slice (shard_of), so a replica that the gathered state leaves out (a part two
      // ranks hold, only the lowest one's copy gathered) cannot be wrong unseen.
      std::map<std::string, size_t> index;  // name -> position in ref.sizes
      std::vector<size_t> offset(ref.sizes.size() + 1, 0);
      for (size_t k = 0; k < ref.sizes.size(); ++k)
        index[ref.sizes[k].first] = k, offset[k + 1] = offset[k] + ref.sizes[k].second;
      for (const LocalPart& lp : dist.parts) {
        const auto it = index.find(lp.name);
        ok = ok && it != index.end();
        if (!ok) break;
        const size_t k = it->second;
        auto slice = [&](const std::vector<float>& all) {
          const std::vector<float> v(all.begin() + offset[k], all.begin() + offset[k + 1]);
          return nn::shard_of(Tensor::from_vector(v, ref.full_shapes[k]), lp.shard).to_vector();
        };
        const std::vector<float> after = slice(ref.params), before = slice(ref.initial);
        ok = ok && after.size() == lp.value.size();
        double n2 = 0, d2 = 0;
        for (size_t j = 0; ok && j < after.size(); ++j) {
          const double gr = double(after[j]) - before[j], gd = double(lp.value[j]) - before[j];
          n2 += (gd - gr) * (gd - gr), d2 += gr * gr;
        }
        const double e = std::sqrt(n2) / (std::sqrt(d2) + 1e-12);
        if (e > worst_part) worst_part = e, worst_part_name = lp.name;
      }
      ok = ok && (pa.tp == 1 || !dist.parts.empty()) && worst_grad <= 1e-5 && worst_part <= 1e-5;
      std::printf(
          "[rank %d] grad-check: %zu parameters, worst per-parameter gradient rel err "
          "%.2e (%s); %zu own tensor-parallel parts, worst %.2e (%s)\n",
          world->rank(), ref.sizes.size(), worst_grad, worst_name.c_str(), dist.parts.size(),
          worst_part, worst_part_name.c_str());
    }
    // fp32: the single-process run to 1e-5; bf16/fp16 (GPU): the model-level half bounds. bf16
    // gradient buckets: the half bounds too, and the run must differ from the fp32 one (the
    // gradients really went through bf16).
    const bool half = pa.precision != "fp32" || pa.bucket_dtype != "fp32";
    const double tol = !half ? 1e-5 : pa.precision == "fp16" ? 5e-3 : 2e-2;
    ok = ok && loss_err <= tol && param_err <= tol;
    // The evaluation after training: the same samples, loss and accuracy (one sample's worth).
    const double eval_err = std::abs(ref.eval.loss - dist.eval.loss) / std::abs(ref.eval.loss);
    ok = ok && dist.eval.samples == ref.eval.samples && ref.eval.samples == 48 && eval_err <= tol &&
         std::abs(ref.eval.accuracy - dist.eval.accuracy) * ref.eval.samples <= 1.0 + 1e-9;
    if (pa.bucket_dtype != "fp32") ok = ok && param_err > 1e-7;
    const int W = world->size() / pa.pp / pa.tp;  // data-parallel size
    const double state_ratio = double(dist.state_bytes) / double(ref.state_bytes);
    const double param_ratio = double(dist.param_bytes) / double(ref.param_bytes);
    if (pa.grad_check) {
      // Plain SGD keeps no optimizer state: nothing to compare.
    } else if (pa.tp > 1) {
      ok = ok && state_ratio < 1.0;  // a rank keeps the state of its shards only
    } else if (pa.pp == 1) {
      if (zero >= 1)
        ok = ok && std::abs(state_ratio - 1.0 / W) < 0.02;
      else
        ok = ok && state_ratio == 1.0;
      // (Offload under bf16: the device copy of the weights is bf16, about half of that.)
      if (zero == 3)
        ok = ok && (cpu_offload && pa.precision != "fp32"
                        ? param_ratio < 1.0 / W && param_ratio > 0.45 / W
                        : std::abs(param_ratio - 1.0 / W) < 0.02);
    } else {
      ok = ok && state_ratio < 1.0;  // a stage keeps the state of its layers only
    }
    // ZeRO-Offload: all of this rank's optimizer state in host memory (1/dp of the single run's
    // total), none on the GPU.
    const double host_ratio = double(dist.state_host_bytes) / double(ref.state_bytes);
    if (cpu_offload)
      ok = ok && dist.state_gpu_bytes == 0 && dist.state_host_bytes == dist.state_bytes &&
           std::abs(host_ratio - 1.0 / W) < 0.02;
    // Every rank must agree.
    const double all_ok = world->all_reduce_scalar(ok ? 1.0 : 0.0, dist::ReduceOp::Min);
    std::printf(
        "[rank %d] %s tp %d (%s)%s pp %d (%s%s, %d chunks) zero %d dp %d accum %d %s (%s buckets): "
        "%zu "
        "steps, "
        "losses "
        "%.6f..%.6f, max loss rel err "
        "%.2e, param rel err %.2e, optimizer state %lld B (single %lld B, ratio %.3f), "
        "parameters %lld B (single %lld B, ratio %.3f), eval loss %.6f (single %.6f, rel err "
        "%.2e) accuracy %.3f (single %.3f) on %lld samples: %s\n",
        world->rank(), dev.str().c_str(), pa.tp, pa.tp_mode.c_str(), pa.sp ? " (sp)" : "", pa.pp,
        pa.style.c_str(), pa.split_backward ? ", split backward" : "", pa.chunks, zero, W, accum,
        pa.precision.c_str(), pa.bucket_dtype.c_str(), dist.losses.size(), dist.losses.front(),
        dist.losses.back(), loss_err, param_err, static_cast<long long>(dist.state_bytes),
        static_cast<long long>(ref.state_bytes), state_ratio,
        static_cast<long long>(dist.param_bytes), static_cast<long long>(ref.param_bytes),
        param_ratio, dist.eval.loss, ref.eval.loss, eval_err, dist.eval.accuracy, ref.eval.accuracy,
        static_cast<long long>(dist.eval.samples), ok ? "OK" : "MISMATCH");
    if (cpu_offload)
      std::printf(
          "[rank %d] cpu_offload: optimizer state on the GPU %lld B, on the host %lld B "
          "(single run %lld B, ratio %.3f)\n",
          world->rank(), static_cast<long long>(dist.state_gpu_bytes),
          static_cast<long long>(dist.state_host_bytes), static_cast<long long>(ref.state_bytes),
          host_ratio);
    return all_ok == 1.0 ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "test_dp_equivalence: %s\n", e.what());
    dist::MpiEnvironment::abort(1);
  }
}
