// vit_train: the config-driven ViT trainer (Colossal-AI's train.py).
//   vit_train --config FILE [--set section.key=value ...] [--dry-run [--nproc N]]
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <iostream>

#include "cai/checkpoint/checkpoint.h"
#include "cai/config/config.h"
#include "cai/core/error.h"
#include "cai/core/host_memory.h"
#include "cai/core/log.h"
#include "cai/data/data.h"
#include "cai/dist/communicator.h"
#include "cai/dist/launch.h"
#include "cai/dist/mesh.h"
#include "cai/dist/nccl.h"
#include "cai/nn/vit.h"
#include "cai/optim/lr_scheduler.h"
#include "cai/optim/optimizer.h"
#include "cai/parallel/data_parallel.h"
#include "cai/parallel/hybrid.h"
#include "cai/parallel/pipeline.h"
#include "cai/train/trainer.h"
#include "kernels/device.h"

namespace {

// Preemption (SIGTERM: torchrun, SLURM, Kubernetes; SIGUSR1: SLURM's --signal warning): the first
// such signal is remembered and training stops at the next step boundary that every rank agrees
// on, after saving a checkpoint there (TrainerConfig::stop_requested). A signal handler can only
// set a flag, hence this one global of the program.
volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void on_stop_signal(int sig) {
  if (g_stop_signal == 0) g_stop_signal = sig;
}

void catch_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = SA_RESTART;  // reads and writes in flight go on
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGTERM, SIGUSR1}) sigaction(s, &sa, nullptr);
}

// A run stopped on request (SIGTERM, SIGUSR1) that saved exits 0, as the issue of preemption
// asks and a job script expects of a clean stop: the checkpoint and the "preempted" record in
// the metrics file say where it stopped; --resume (or `colossalai run --resume`) continues.

std::shared_ptr<cai::data::Dataset> load_dataset(const cai::config::TrainConfig& c, bool train,
                                                 const std::string& path) {
  using namespace cai::data;
  if (c.dataset == "fashion_mnist") return load_mnist_dir(path, train, "fashion-mnist");
  if (c.dataset == "mnist") return load_mnist_dir(path, train, "mnist");
  if (c.dataset == "cifar10") return load_cifar10(path, train);
  if (c.dataset == "synthetic") {
    // Model-sized random images; the evaluation set draws from another seed.
    const cai::nn::ViTConfig v = c.vit();
    const int64_t n = train ? c.synthetic_size : std::max<int64_t>(1, c.synthetic_size / 5);
    const uint64_t seed = static_cast<uint64_t>(c.seed) * 2 + (train ? 0 : 1);
    return synthetic(n, v.in_chans, v.img_size, v.num_classes, seed,
                     train ? "synthetic train" : "synthetic eval");
  }
  const int64_t size = c.image_size > 0 ? c.image_size : c.vit().img_size;
  return load_image_folder(path + (train ? "/train" : "/val"), size);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"vit_train: train a Vision Transformer from a TOML config (Colossal-AI's keys)"};
  std::string config_path;
  std::vector<std::string> overrides;
  bool dry_run = false;
  app.add_option("-c,--config", config_path, "TOML config file (see apps/vit_train/configs)")
      ->required();
  app.add_option("--set", overrides, "Override a key: section.key=value (repeatable)");
  app.footer(
      "Several processes (mpirun, colossalai run): data/pipeline parallelism over MPI on the CPU, "
      "or over NCCL with train.device = \"cuda\" (one GPU per process: local rank mod the "
      "node's GPUs).\n"
      "SIGTERM or SIGUSR1 (preemption, SLURM's warning signal) on any rank: every rank finishes "
      "its step, they stop together at the next step boundary, write a checkpoint there (with "
      "checkpoint.dir) and a \"preempted\" record in train.metrics_file, and exit 0; --resume "
      "continues bit for bit. Exit status: 0 done (or stopped on request and saved), 1 error, 2 "
      "bad config or flags.");
  app.add_flag("--dry-run", dry_run,
               "Print the resolved config, parameter count and the step model's per-process "
               "memory (per pipeline stage), then exit");
  int nproc = 0;
  app.add_option("--nproc", nproc,
                 "With --dry-run: the number of processes to plan for (default: the launcher's "
                 "world size, 1 when not launched)")
      ->check(CLI::PositiveNumber);
  std::string resume, init_from;
  auto* resume_opt =
      app.add_option("--resume", resume,
                     "Continue from a checkpoint: a checkpoint directory, or a checkpoint.dir "
                     "(its newest); without a value, checkpoint.dir. Any layout resumes what any "
                     "layout saved")
          ->expected(0, 1);
  app.add_option("--init-from", init_from,
                 "Start from these weights (a safetensors file or a folder with "
                 "model.safetensors or an index, timm's names); a head of another class count is "
                 "re-initialised");
  std::string export_to;
  app.add_option("--export-to", export_to,
                 "Write the model weights of the checkpoint --resume names (either format) as "
                 "timm-loadable safetensors into this new folder (checkpoint.export_dtype, "
                 "checkpoint.max_shard_mb), then exit");
  std::string trace_path;
  app.add_option("--trace", trace_path,
                 "Record every rank's timed instructions and memory; write one Chrome-trace "
                 "JSON (open in Perfetto) and print the measured bubble fraction per stage");
  CLI11_PARSE(app, argc, argv);

  using namespace cai;
  config::TrainConfig cfg;
  dist::LaunchInfo li;
  try {
    li = dist::launch_from_env();
    dist::prefer_eager_cuda_module_loading(li);  // before the first CUDA call
    cfg = config::load_config(config_path, overrides);
    cfg.path = config::expand_env(cfg.path, "data.path");
    cfg.metrics_file = config::expand_env(cfg.metrics_file, "train.metrics_file");
    CAI_CHECK(nproc == 0 || dry_run, "[vit_train] --nproc {} needs --dry-run", nproc);
    config::validate(cfg, dry_run && nproc > 0 ? nproc : li.world_size);
  } catch (const Error& e) {
    if (li.rank == 0) std::cerr << "vit_train: " << e.what() << "\n";
    return 2;
  }

  // Several processes: MPI carries the collectives (initialised only then, so a single
  // process needs no MPI runtime).
  std::unique_ptr<dist::MpiEnvironment> mpi;
  std::unique_ptr<dist::Communicator> world;
  try {
    log::init(li.rank);
    if (li.world_size > 1 && !dry_run) {
      mpi = std::make_unique<dist::MpiEnvironment>(&argc, &argv);
      world = mpi->world();
      CAI_CHECK(world->size() == li.world_size,
                "[vit_train] MPI sees {} processes but the launcher announced {} ({})",
                world->size(), li.world_size, li.source);
    }
    // From here a stop request waits for the first step boundary (after MPI's setup, which
    // installs handlers of its own).
    if (!dry_run) catch_stop_signals();
    const dist::ProcessMesh mesh(dry_run && nproc > 0 ? nproc : li.world_size,
                                 static_cast<int>(cfg.tensor_size), static_cast<int>(cfg.pipeline));
    const nn::ViTConfig vc = cfg.vit();
    const int64_t nparams = vc.num_parameters();  // counted, not allocated (6B fits a dry run)
    if (!export_to.empty()) {
      if (resume_opt->count() > 0 && resume.empty()) resume = cfg.checkpoint_dir;
      CAI_CHECK(!resume.empty(), "[vit_train] --export-to needs --resume naming the checkpoint");
      if (li.rank == 0) {
        checkpoint::export_consolidated(
            resume, export_to, static_cast<int64_t>(cfg.checkpoint_max_shard_mb * (1 << 20)),
            dtype_from_name(cfg.checkpoint_export_dtype));
        log::info("[checkpoint] exported the weights of {} to {}", resume, export_to);
      }
      return 0;
    }
    if (dry_run) {
      const int world = nproc > 0 ? nproc : li.world_size;
      std::cout << "# resolved configuration\n" << config::to_toml(cfg) << "\n";
      std::cout << fmt::format(
          "# model: ViT img {} patch {} dim {} depth {} heads {} mlp {} classes {}: {} "
          "parameters\n",
          vc.img_size, vc.patch_size, vc.embed_dim, vc.depth, vc.num_heads, vc.mlp_hidden(),
          vc.num_classes, nparams);
      std::cout << plan::summary(plan::make_plan(vc, config::plan_layout(cfg, world)));
      return 0;
    }

    if (resume_opt->count() > 0 && resume.empty()) {
      CAI_CHECK(!cfg.checkpoint_dir.empty(),
                "[vit_train] --resume without a directory needs checkpoint.dir in the config");
      resume = cfg.checkpoint_dir;
    }
    // Rank 0 holds checkpoint.dir for the job (its lock, until exit) and claims it for this run
    // (run.json) before anything is loaded: a new run into another run's directory ends here.
    checkpoint::DirLock dir_lock;
    std::string run_id;
    if (!cfg.checkpoint_dir.empty() && li.rank == 0) {
      dir_lock = checkpoint::DirLock(cfg.checkpoint_dir);
      checkpoint::RunRecord run;
      run.run_id = checkpoint::new_run_id();
      config::TrainConfig canonical = cfg;
      canonical.checkpoint_overwrite = false;  // how the directory is taken, not what runs
      run.config_hash = checkpoint::text_hash(config::to_toml(canonical));
      run.seed = cfg.seed;
      run.model =
          !cfg.model_name.empty()
              ? cfg.model_name
              : fmt::format("custom ViT (img {} patch {} dim {} depth {} heads {})", vc.img_size,
                            vc.patch_size, vc.embed_dim, vc.depth, vc.num_heads);
      run.world_size = mesh.world();
      run.dp = mesh.dp_size();
      run.pp = mesh.pp_size();
      run.tp = mesh.tp_size();
      run.zero_stage = static_cast<int>(cfg.zero_stage);
      run.layout = mesh.describe();
      const checkpoint::RunRecord owner =
          checkpoint::claim_run_dir(cfg.checkpoint_dir, run, resume, cfg.checkpoint_overwrite);
      run_id = owner.run_id;
      log::info("[checkpoint] {}: {}{}", cfg.checkpoint_dir, resume.empty() ? "" : "continuing ",
                checkpoint::describe(owner));
    }

    auto train_set = load_dataset(cfg, true, cfg.path);
    auto eval_set = load_dataset(cfg, false, cfg.path);
    if (cfg.train_subset > 0) train_set = data::subset(train_set, cfg.train_subset);
    if (cfg.eval_subset > 0) eval_set = data::subset(eval_set, cfg.eval_subset);
    CAI_CHECK(train_set->num_classes() <= vc.num_classes,
              "[vit_train] the dataset has {} classes but model.num_classes = {}",
              train_set->num_classes(), vc.num_classes);

    data::LoaderConfig lc;
    lc.batch_size = cfg.batch_size;
    lc.world = mesh.dp_size();
    lc.rank = mesh.coord(li.rank).dp;
    lc.seed = static_cast<uint64_t>(cfg.seed);
    lc.num_workers = static_cast<int>(cfg.num_workers);
    lc.transform.normalize = data::normalization_for(
        cfg.dataset == "image_folder" || cfg.dataset == "synthetic" ? "imagenet" : cfg.dataset);
    if (cfg.dataset == "synthetic" && vc.in_chans != 3) lc.transform.normalize = {};
    if (train_set->height() != vc.img_size || train_set->width() != vc.img_size)
      lc.transform.resize = vc.img_size;
    data::LoaderConfig ec = lc;
    lc.transform.random_crop = cfg.random_crop_padding > 0 ? vc.img_size : 0;
    lc.transform.crop_padding = cfg.random_crop_padding;
    lc.transform.horizontal_flip = cfg.horizontal_flip;
    ec.shuffle = false;
    ec.train = false;
    data::DataLoader train_loader(train_set, lc);
    data::DataLoader eval_loader(eval_set, ec);

    // One GPU per process: local rank mod the GPUs of the node. With several processes the
    // data-parallel and pipeline groups are NCCL communicators built from the MPI world (which
    // still carries the unique ids and the CPU-side metrics).
    std::unique_ptr<dist::Communicator> gpu_world;
    Device device = Device::cpu();
    if (cfg.device == "cuda") {
      CAI_CHECK(kernels::cuda::device_count() > 0,
                "[vit_train] train.device = \"cuda\" but no GPU is visible ({})",
                kernels::cuda::runtime_info().device_error);
      device = Device::cuda(dist::select_cuda_device(li.local_rank, li.local_world_size));
      if (world) gpu_world = dist::make_nccl(*world, device.index);
    } else {
      keep_freed_host_memory();  // the step's buffers stay in the heap (cai/core/host_memory.h)
    }
    // Several processes, or any parallel feature: the hybrid plugin (tp × pp × dp, ZeRO), the
    // one path that also gathers and cuts checkpoints for every layout.
    std::shared_ptr<train::Plugin> plugin = std::make_shared<train::Plugin>();
    std::shared_ptr<parallel::PipelinePlugin> pipe;
    std::shared_ptr<parallel::HybridParallelPlugin> hybrid;
    parallel::DataParallelConfig dc;
    dc.zero_stage = static_cast<int>(cfg.zero_stage);
    dc.ddp_bucket_cap_mb = cfg.ddp_bucket_cap_mb;
    dc.bucket_dtype = dtype_from_name(cfg.gradient_comm_dtype);
    dc.copy_engine_all_reduce = cfg.ddp_copy_engine;
    dc.copy_engine_exchange = cfg.ddp_exchange;
    if (cfg.ddp_exchange && device.is_cuda() && mesh.dp_size() > 2 && li.rank == 0)
      log::warn(
          "[vit_train] parallel.ddp_exchange with {} data-parallel ranks: each GPU receives {} "
          "copies of the gradients, and the clip and the optimizer step read all {}; on 4 H100 "
          "it scaled 93.4% against NCCL's all-reduce's 96.2% (docs/bench/README.md). It is "
          "meant for 2 GPUs; leave it false beyond",
          mesh.dp_size(), mesh.dp_size() - 1, mesh.dp_size());
    dc.bucket_hold = cfg.ddp_bucket_hold;
    dc.zero_bucket_size_in_m = cfg.zero_bucket_size_in_m;
    dc.cpu_offload = cfg.cpu_offload;
    parallel::PipelineConfig pc;
    pc.style = cfg.pp_style;
    pc.num_microbatches = static_cast<int>(cfg.num_microbatches);
    pc.microbatch_size = static_cast<int>(cfg.microbatch_size);
    pc.chunks = static_cast<int>(cfg.num_model_chunks);
    pc.split_backward = cfg.split_backward;
    pc.partition = cfg.partition;
    pc.num_layers_per_stage = cfg.num_layers_per_stage;
    pc.dp = dc;
    if (world || cfg.tensor_size > 1 || cfg.pipeline > 1 || cfg.zero_stage > 0 ||
        !trace_path.empty()) {
      if (!world) world = dist::make_single();
      parallel::HybridParallelConfig hc;
      hc.pipeline_executor = !trace_path.empty();  // it records the spans of a trace
      hc.tp_size = static_cast<int>(cfg.tensor_size);
      hc.pp_size = static_cast<int>(cfg.pipeline);
      hc.tp_mode = cfg.tensor_mode;
      hc.tp_depth = static_cast<int>(cfg.tensor_depth);
      hc.sequence_parallel = cfg.sequence_parallel;
      hc.pipeline = pc;
      hc.dp = dc;
      hybrid =
          std::make_shared<parallel::HybridParallelPlugin>(gpu_world ? *gpu_world : *world, hc);
      plugin = hybrid;
      if (hybrid->pipeline())
        pipe = std::shared_ptr<parallel::PipelinePlugin>(hybrid, hybrid->pipeline());
    }
    // The model, split over the tensor-parallel group when there is one; initialised on the
    // host (the same values whatever the layout), then moved to the process's GPU.
    nn::ViT model(vc, hybrid ? hybrid->tensor_parallel() : nullptr);
    model.init(static_cast<uint64_t>(cfg.seed));
    // Weights before the plugin's setup: each rank cuts its part of the full tensors.
    checkpoint::Checkpoint ck;
    if (!resume.empty()) {
      ck = checkpoint::load_checkpoint(resume);
      checkpoint::load_model_state(model, ck.model, {}, false, ck.path);
      log::info("[checkpoint] resuming {} (epoch {}, step {} of it, global step {}; saved by {})",
                ck.path, ck.state.epoch + 1, ck.state.step_in_epoch, ck.state.global_step,
                ck.state.layout.empty() ? "an unknown layout" : ck.state.layout);
    } else if (!init_from.empty()) {
      auto w = checkpoint::load_weights(init_from);
      std::set<std::string> skip;
      for (const char* h : {"head.weight", "head.bias"}) {
        auto it = w.find(h);
        if (it != w.end() && it->second.shape() != model.parameter(h).full_shape()) skip.insert(h);
      }
      if (!skip.empty())
        log::info(
            "[checkpoint] {}: its head is {} but the model has {} classes: the head is "
            "re-initialised",
            init_from, shape_str(w.at("head.weight").shape()), vc.num_classes);
      checkpoint::load_model_state(model, w, skip, false, init_from);
      log::info("[checkpoint] initialised from {} ({} tensors)", init_from, w.size());
    }
    if (device.is_cuda()) model.to(device);
    plugin->setup(model);
    optim::OptimizerOptions oo;
    oo.name = cfg.optimizer;
    oo.momentum = cfg.momentum;
    oo.nesterov = cfg.nesterov;
    auto opt =
        optim::make_optimizer(oo, optim::weight_decay_groups(plugin->optimizer_parameters(model),
                                                             cfg.learning_rate, cfg.weight_decay));

    train::TrainerConfig tc;
    tc.num_epochs = cfg.num_epochs;
    tc.gradient_accumulation = cfg.gradient_accumulation;
    tc.clip_grad_norm = cfg.clip_grad_norm;
    tc.seed = static_cast<uint64_t>(cfg.seed);
    tc.max_steps_per_epoch = cfg.max_steps_per_epoch;
    tc.precision = dtype_from_name(cfg.precision);
    tc.grad_scaler.initial_scale = cfg.initial_scale;
    tc.grad_scaler.min_scale = cfg.min_scale;
    tc.grad_scaler.growth_factor = cfg.growth_factor;
    tc.grad_scaler.backoff_factor = cfg.backoff_factor;
    tc.grad_scaler.growth_interval = cfg.growth_interval;
    tc.grad_scaler.hysteresis = cfg.hysteresis;
    tc.grad_scaler.max_scale = cfg.max_scale;
    tc.stop_requested = [] { return static_cast<int>(g_stop_signal); };
    const bool by_epoch = cfg.schedule_by == "epoch";
    const int64_t steps_per_epoch = [&] {
      int64_t s =
          (train_loader.num_batches() + tc.gradient_accumulation - 1) / tc.gradient_accumulation;
      return tc.max_steps_per_epoch > 0 ? std::min(s, tc.max_steps_per_epoch) : s;
    }();
    const int64_t total = by_epoch ? cfg.num_epochs : cfg.num_epochs * steps_per_epoch;
    int64_t warmup = static_cast<int64_t>(cfg.warmup_epochs * (by_epoch ? 1 : steps_per_epoch));
    warmup = std::min(warmup, total - 1);
    auto sched = optim::make_scheduler(cfg.lr_schedule, *opt, total, warmup, cfg.min_lr);

    train::Booster booster(plugin);
    train::Criterion crit{static_cast<float>(cfg.label_smoothing)};
    auto trainer =
        booster.boost(model, *opt, crit, train_loader, &eval_loader, sched.get(), by_epoch, tc);
    if (!resume.empty()) {
      plugin->load_optimizer_state(model, *opt, ck.optimizer);
      sched->set_last(ck.state.scheduler_last);
      if (auto* s = trainer->grad_scaler(); s && !ck.state.scaler.empty())
        s->load_state(ck.state.scaler);
      trainer->resume_at(ck.state.epoch, ck.state.step_in_epoch, ck.state.global_step, ck.path);
      if (trainer->steps_left() == 0) {
        // Nothing to run: the hooks (the metrics file) are left alone, and there is no history.
        log::info(
            "[checkpoint] {} (global step {}) already ends the run's {} epochs: training is "
            "complete, nothing left to resume",
            ck.path, ck.state.global_step, cfg.num_epochs);
        return 0;
      }
    }
    std::shared_ptr<checkpoint::CheckpointHook> ck_hook;
    if (!cfg.checkpoint_dir.empty()) {
      checkpoint::CheckpointConfig cc;
      cc.dir = cfg.checkpoint_dir;
      cc.every_steps = cfg.checkpoint_every_steps;
      cc.every_epochs = cfg.checkpoint_every_epochs;
      if (cc.every_steps == 0 && cc.every_epochs == 0) cc.every_epochs = 1;
      cc.keep_last = cfg.checkpoint_keep_last;
      cc.max_shard_bytes = static_cast<int64_t>(cfg.checkpoint_max_shard_mb * (1 << 20));
      cc.export_dtype = dtype_from_name(cfg.checkpoint_export_dtype);
      cc.per_rank = cfg.checkpoint_per_rank;
      cc.layout = mesh.describe();
      cc.run_id = run_id;
      ck_hook = std::make_shared<checkpoint::CheckpointHook>(cc, sched.get());
      trainer->add_hook(ck_hook);
    }
    trainer->add_hook(
        std::make_shared<train::ProgressHook>(train::stdout_is_terminal(), cfg.log_interval));
    trainer->add_hook(std::make_shared<train::LogMetricByEpochHook>());
    if (!cfg.metrics_file.empty())
      trainer->add_hook(std::make_shared<train::MetricsFileHook>(
          cfg.metrics_file, std::max<int64_t>(1, steps_per_epoch / 20)));
    if (!cfg.kernel_profile.empty())
      trainer->add_hook(std::make_shared<train::KernelProfileHook>(
          cfg.kernel_profile, cfg.kernel_profile_start, cfg.kernel_profile_steps,
          fmt::format("vit_train: {} batch {} {} ({}), {}: per-kernel GPU time of a training step",
                      cfg.model_name.empty() ? "custom ViT" : cfg.model_name, cfg.batch_size,
                      cfg.precision, vc.act, mesh.describe())));

    log::info(
        "ViT dim {} depth {} heads {} patch {} ({} parameters), {} ({}), {} {}, {} steps "
        "of global batch {} per epoch, {} epochs, {} process(es): {}, {}",
        vc.embed_dim, vc.depth, vc.num_heads, vc.patch_size, nparams, train_set->describe(),
        eval_set->describe(), opt->name(), sched->name(), steps_per_epoch,
        cfg.batch_size * mesh.dp_size(), cfg.num_epochs, li.world_size, mesh.describe(),
        plugin->name());
    const auto t0 = std::chrono::steady_clock::now();
    trainer->fit();
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (const train::StopPoint* stop = trainer->stopped()) {
      std::string saved = "nothing saved: the config has no checkpoint.dir";
      if (ck_hook)
        saved = fmt::format("checkpoint {}; continue with --resume", ck_hook->last_saved());
      log::info(
          "[vit_train] stopped on request ({}): every rank stopped after global step {} (epoch "
          "{}, step {} of it); {}; exit status {}",
          train::stop_reason_name(stop->reason), stop->global_step, stop->epoch + 1,
          stop->step_in_epoch, saved, 0);
      plugin->barrier();  // every rank is done with the checkpoint before any exits
      return 0;
    }
    const auto& last = trainer->history().back();
    double ips = 0;
    for (const auto& e : trainer->history()) ips += e.images_per_sec;
    ips /= static_cast<double>(trainer->history().size());
    log::info("finished: test accuracy {:.2f}% after {} epochs in {} ({:.0f} img/s training)",
              100 * last.eval_accuracy, cfg.num_epochs, train::format_duration(secs), ips);
    // This process's peak: the bytes of live tensors on its device (what the plan predicts) and,
    // on a GPU, what the caching allocator held.
    const int64_t tensors = peak_memory(device.type);
    log::info("peak memory of this process: {} bytes of tensors ({:.1f} MiB){}", tensors,
              tensors / 1048576.0,
              device.is_cuda()
                  ? fmt::format(", device allocator {:.1f} MiB",
                                kernels::cuda::allocator_stats(device.index).peak / 1048576.0)
                  : std::string());
    if (pipe && !trace_path.empty()) {
      const auto bubbles = pipe->write_trace(trace_path);
      const int m = pipe->micro_batches_for(cfg.batch_size);
      const auto ideal = schedule::validate(pipe->schedule_for(cfg.batch_size)).bubble_fraction;
      log::info(
          "trace written to {} ({} tracks); schedule {} with {} stages × {} micro-batches: "
          "ideal bubble {:.3f} (forward 1, backward 2, no communication)",
          trace_path, bubbles.size(), cfg.pp_style, pipe->stages(), m, ideal);
      // Every rank's peak (each stage holds different layers): what the plan predicts per stage.
      std::vector<int64_t> peaks(bubbles.size());
      for (size_t r = 0; r < bubbles.size(); ++r)
        peaks[r] = static_cast<int64_t>(plugin->all_reduce_sum(
            static_cast<int>(r) == li.rank ? static_cast<double>(tensors) : 0.0));
      for (size_t r = 0; r < bubbles.size(); ++r)
        log::info("  rank {} (stage {}): measured bubble {:.3f}, peak memory {} bytes of tensors",
                  r, mesh.coord(static_cast<int>(r)).pp, bubbles[r], peaks[r]);
    }
  } catch (const Error& e) {
    std::cerr << "vit_train: rank " << li.rank << ": " << e.what() << "\n";
    // One rank cannot go on: end every rank now rather than leaving them waiting.
    if (mpi) dist::MpiEnvironment::abort(1);
    return 1;
  }
  return 0;
}
