// A benchmark, not a test: training-step throughput of a ViT (forward, backward, AdamW) on one
// device with synthetic data. Prints img/s, achieved TFLOP/s, MFU against a peak, and peak memory.
//   vit_step_bench [--model vit_base_patch16_224] [--batch 256] [--steps 10] [--warmup 3]
//                  [--device cuda|cpu] [--precision bf16|fp16|fp32] [--act gelu|gelu_tanh]
//                  [--zero 0..3] [--bucket-dtype fp32|bf16] [--tp T [--sp 1]]
//                  [--peak-tflops 989] [--lockstep 1] [--step-times 1] [--copy-engine 1]
//                  [--exchange 1] [--bucket-hold F]
//                  [--kernel-profile FILE.md [--profile-steps 3] [--profile-ranks 0|all]]
// Mixed precision as the trainer runs it: bf16/fp16 compute, fp32 master weights and gradients
// (no loss scaling here: the timing does not depend on it). The phases (forward, backward,
// optimizer) are timed separately on extra steps, each followed by a device synchronisation.
// Under mpirun / colossalai run with several processes: data parallel over NCCL, one GPU per
// process (local rank), batch per GPU, DDP (--zero 0, bucketed all-reduce overlapped with
// backward; --bucket-dtype bf16: the buckets reduced in bf16, parallel.gradient_comm_dtype;
// --copy-engine 1: fp32 buckets all-reduced by the copy engines, parallel.ddp_copy_engine;
// --exchange 1: the buckets copied whole by the copy engines and summed once after the backward,
// parallel.ddp_exchange; --bucket-hold F: stage 0/1 buckets wait until the share F of the
// gradients is final, then launch together, parallel.ddp_bucket_hold) or
// ZeRO 1-3; rank 0 prints the total img/s of all GPUs. --tp T: 1D tensor parallelism
// over T consecutive ranks (--sp 1: with sequence parallelism) through the HybridParallelPlugin,
// data parallel over the rest; --batch is per data-parallel rank. tp_comm_share: the time the
// tensor-parallel collectives take when each is timed alone (profiled steps), over the step time.
// --kernel-profile: after the timed steps, CUPTI records every kernel of --profile-steps more steps
// (rank 0) and FILE.md gets the per-kernel table, FILE.md.csv one step's kernels in order;
// --profile-ranks all: every rank records, rank r > 0 into FILE.rankR.md (and its .csv), so the
// ranks' NCCL kernels can be set side by side (the early rank's wait for the other is inside
// its all-reduce's time).
// The JSON line has each timed step's min, median and max; --step-times 1 prints them all in order
// (stderr). --lockstep 1 (several processes, an experiment): no data parallelism; each rank runs
// the one-GPU step on its own and the ranks all-reduce one float at the end of each step, so they
// keep in step as DDP's ranks do, without the gradients' traffic: what coupling the ranks costs
// by itself (each step waits for the slower rank).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cai/core/error.h"
#include "cai/core/kernel_profile.h"
#include "cai/core/rng.h"
#include "cai/dist/communicator.h"
#include "cai/dist/launch.h"
#include "cai/dist/nccl.h"
#include "cai/nn/vit.h"
#include "cai/ops/ops.h"
#include "cai/optim/optimizer.h"
#include "cai/parallel/data_parallel.h"
#include "cai/parallel/hybrid.h"
#include "kernels/device.h"

using namespace cai;

int main(int argc, char** argv) {
  std::string model = "vit_base_patch16_224", device = "cuda", precision = "bf16";
  int64_t batch = 256, steps = 10, warmup = 3;
  double peak = 989.0;
  int zero = 0, tp = 1, sp = 0;
  std::string act = "gelu", kernel_profile, bucket_dtype = "fp32";
  int64_t profile_steps = 3;
  bool profile_all_ranks = false, lockstep = false, step_times = false, copy_engine = false;
  bool exchange = false;
  double bucket_hold = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--model")
      model = v;
    else if (a == "--batch")
      batch = std::atoll(v.c_str());
    else if (a == "--steps")
      steps = std::atoll(v.c_str());
    else if (a == "--warmup")
      warmup = std::atoll(v.c_str());
    else if (a == "--device")
      device = v;
    else if (a == "--act")
      act = v;
    else if (a == "--zero")
      zero = std::atoi(v.c_str());
    else if (a == "--tp")
      tp = std::atoi(v.c_str());
    else if (a == "--sp")
      sp = std::atoi(v.c_str());
    else if (a == "--precision")
      precision = v;
    else if (a == "--kernel-profile")
      kernel_profile = v;
    else if (a == "--profile-steps")
      profile_steps = std::atoll(v.c_str());
    else if (a == "--profile-ranks" && (v == "0" || v == "all")) {
      profile_all_ranks = v == "all";
    } else if (a == "--profile-ranks") {
      std::fprintf(stderr, "--profile-ranks takes 0 or all, got %s\n", v.c_str());
      return 2;
    } else if (a == "--bucket-dtype")
      bucket_dtype = v;
    else if (a == "--bucket-hold")
      bucket_hold = std::atof(v.c_str());
    else if ((a == "--step-times" || a == "--lockstep" || a == "--copy-engine" ||
              a == "--exchange") &&
             (v == "0" || v == "1"))
      (a == "--lockstep"      ? lockstep
       : a == "--copy-engine" ? copy_engine
       : a == "--exchange"    ? exchange
                              : step_times) = v == "1";
    else if (a == "--step-times" || a == "--lockstep" || a == "--copy-engine" ||
             a == "--exchange") {
      std::fprintf(stderr, "%s takes 0 or 1, got %s\n", a.c_str(), v.c_str());
      return 2;
    } else if (a == "--peak-tflops")
      peak = std::atof(v.c_str());
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (steps < 1 || warmup < 0) {
    std::fprintf(stderr, "--steps takes a count >= 1 and --warmup >= 0, got %lld and %lld\n",
                 static_cast<long long>(steps), static_cast<long long>(warmup));
    return 2;
  }
  try {
    const dist::LaunchInfo li = dist::launch_from_env();
    dist::prefer_eager_cuda_module_loading(li);
    std::unique_ptr<dist::MpiEnvironment> mpi;
    std::unique_ptr<dist::Communicator> world, nccl;
    std::unique_ptr<train::Plugin> dp;
    std::shared_ptr<nn::TensorParallel> tpc;
    dist::Communicator* lockstep_comm = nullptr;  // --lockstep: the ranks' one-float all-reduce
    nn::ViTConfig c = nn::ViTConfig::named(model);
    c.act = act;
    Device dev = Device::cpu();
    if (device == "cuda") {
      CAI_CHECK(kernels::cuda::device_count() > 0, "[bench] no GPU: {}",
                kernels::cuda::runtime_info().device_error);
      dev = Device::cuda(dist::select_cuda_device(li.local_rank, li.local_world_size));
    }
    parallel::DataParallelConfig dc;
    dc.zero_stage = zero;
    dc.bucket_dtype = dtype_from_name(bucket_dtype);
    dc.copy_engine_all_reduce = copy_engine;
    dc.copy_engine_exchange = exchange;
    dc.bucket_hold = bucket_hold;
    if (li.world_size > 1) {
      mpi = std::make_unique<dist::MpiEnvironment>(&argc, &argv);
      world = mpi->world();
      dist::Communicator& comm =
          dev.is_cuda() ? *(nccl = dist::make_nccl(*world, dev.index)) : *world;
      if (lockstep) {
        CAI_CHECK(tp == 1 && zero == 0, "[bench] --lockstep runs without --tp and --zero");
        lockstep_comm = &comm;
      } else if (tp > 1) {
        parallel::HybridParallelConfig hc;
        hc.tp_size = tp;
        hc.sequence_parallel = sp != 0;
        hc.dp = dc;
        auto h = std::make_unique<parallel::HybridParallelPlugin>(comm, hc);
        tpc = h->tensor_parallel();
        dp = std::move(h);
      } else {
        dp = std::make_unique<parallel::DataParallelPlugin>(comm, dc);
      }
    }
    nn::ViT m(c, tpc);
    m.init(0);
    if (dev.is_cuda()) m.to(dev);
    if (dp) dp->setup(m);
    // Data-parallel ranks (with --lockstep: the processes, each running the one-GPU step).
    const int64_t ranks = dp ? dp->world_size() / tp : lockstep_comm ? lockstep_comm->size() : 1;
    Tensor token = Tensor::zeros({1}).to(dev);
    m.set_compute_dtype(dtype_from_name(precision));
    optim::AdamW opt(
        optim::weight_decay_groups(dp ? dp->optimizer_parameters(m) : m.parameters(), 1e-3, 0.05));
    Tensor img = Tensor::empty({batch, c.in_chans, c.img_size, c.img_size});
    rng::normal_(img, 1, 2, 0.0f, 1.0f);
    std::vector<int32_t> lab(batch);
    for (int64_t i = 0; i < batch; ++i) lab[i] = static_cast<int32_t>(i % c.num_classes);
    Tensor images = img.to(dev), labels = Tensor::from_vector(lab, {batch}).to(dev);
    auto sync = [&] {
      if (dev.is_cuda()) kernels::cuda::synchronize();
    };
    using Clock = std::chrono::steady_clock;
    auto since = [](Clock::time_point t) {
      return std::chrono::duration<double>(Clock::now() - t).count();
    };
    double phase[3] = {0, 0, 0};      // forward, backward, optimizer (profiled steps only)
    double tp_comm = 0, tp_step = 0;  // tensor-parallel collectives timed alone, and their steps
    auto step = [&](int64_t s, bool profile) {
      std::vector<std::unique_ptr<nn::Cache>> caches;
      nn::ForwardCtx ctx{true, 0, static_cast<uint64_t>(s), 0};
      auto t = Clock::now();
      const nn::LayerHooks* hooks = dp ? dp->train_hooks(true) : nullptr;
      Tensor logits = m.forward(images, caches, ctx, hooks);
      if (profile) sync(), phase[0] += since(t), t = Clock::now();
      m.backward(ops::cross_entropy_bwd(logits, labels, 0.0f, 1.0f / (batch * ranks)), caches, ctx,
                 hooks);
      if (dp) {
        if (tpc) tpc->drain();
        dp->sync_gradients(m);
      }
      if (lockstep_comm)
        lockstep_comm->all_reduce_async(token, dist::ReduceOp::Sum)->wait_on_device();
      if (profile) sync(), phase[1] += since(t), t = Clock::now();
      if (dp) {
        dp->optimizer_step(opt);
        dp->zero_grad(m, opt);
      } else {
        opt.step();
        opt.zero_grad();
      }
      if (profile) sync(), phase[2] += since(t);
    };
    for (int64_t s = 0; s < warmup; ++s) step(s, false);
    // The timed steps run back to back with no host wait between them, as vit_train's and the
    // PyTorch benchmark's do: the host queues step s+1 while the device runs step s. Each step's
    // device time comes from timed events at the step boundaries on the compute stream.
    sync();
    std::vector<void*> marks;
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<double> step_ms;
    for (int64_t s = 0; s < steps; ++s) {
      if (dev.is_cuda()) {
        marks.push_back(kernels::cuda::event_create_timed());
        kernels::cuda::event_record(marks.back(), nullptr);
      }
      const auto ts = Clock::now();
      step(warmup + s, false);
      if (!dev.is_cuda()) step_ms.push_back(1e3 * since(ts));
    }
    if (dev.is_cuda()) {
      marks.push_back(kernels::cuda::event_create_timed());
      kernels::cuda::event_record(marks.back(), nullptr);
    }
    sync();
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (size_t k = 0; k + 1 < marks.size(); ++k)
      step_ms.push_back(kernels::cuda::event_elapsed_ms(marks[k], marks[k + 1]));
    for (void* e : marks) kernels::cuda::event_destroy(e);
    if (step_times && li.rank == 0) {
      std::string list;
      for (double ms : step_ms) list += fmt::format("{}{:.2f}", list.empty() ? "" : " ", ms);
      std::fprintf(stderr, "vit_step_bench: step ms in order: %s\n", list.c_str());
    }
    std::sort(step_ms.begin(), step_ms.end());
    const double ips = static_cast<double>(batch * ranks * steps) / secs;
    const int64_t profiled = 2;
    for (int64_t s = 0; s < profiled; ++s) step(warmup + steps + s, true);
    if (tpc) {
      tpc->set_profiling(true);
      const auto tt = Clock::now();
      for (int64_t s = 0; s < profiled; ++s) step(warmup + steps + profiled + s, false);
      tp_step = since(tt);
      tp_comm = tpc->comm_seconds();
      tpc->set_profiling(false);
    }
    if (!kernel_profile.empty() && dev.is_cuda()) {
      // Every rank runs the steps (their collectives need all ranks); rank 0 records (every rank
      // with --profile-ranks all).
      const bool records = li.rank == 0 || profile_all_ranks;
      std::string path = kernel_profile;
      if (li.rank > 0) {
        const size_t dot = path.rfind(".md");
        path = dot == std::string::npos
                   ? fmt::format("{}.rank{}", path, li.rank)
                   : fmt::format("{}.rank{}{}", path.substr(0, dot), li.rank, path.substr(dot));
      }
      sync();
      if (records) profile::kernel_profile_start();
      const auto tk = Clock::now();
      for (int64_t s = 0; s < profile_steps; ++s) step(warmup + steps + 2 * profiled + s, false);
      sync();
      const double wall = 1e3 * since(tk) / static_cast<double>(profile_steps);
      if (records) {
        profile::write_kernel_profile(
            path, profile::kernel_profile_stop(), static_cast<int>(profile_steps), wall,
            fmt::format("{} batch {} {} ({}), per-kernel GPU time of a training step{}", model,
                        batch, precision, act,
                        li.world_size > 1 ? fmt::format(", rank {}", li.rank) : ""));
        std::fprintf(stderr, "vit_step_bench: kernel profile in %s\n", path.c_str());
      }
    }
    const double tflops = 3.0 * c.forward_flops() * ips / 1e12;
    const double peak_gib =
        dev.is_cuda() ? kernels::cuda::allocator_stats(dev.index).peak / double(1ull << 30)
                      : peak_memory(DeviceType::CPU) / double(1ull << 30);
    std::string impl = ranks > 1 ? fmt::format("colossalai-cpp {} {}x{}", precision,
                                               zero       ? "zero" + std::to_string(zero)
                                               : lockstep ? "lockstep"
                                                          : "ddp",
                                               ranks)
                                 : "colossalai-cpp " + precision;
    if (tp > 1) impl += fmt::format(" tp{}{}", tp, sp ? "+sp" : "");
    if (ranks > 1 && dc.bucket_dtype != DType::F32) impl += " " + bucket_dtype + "-buckets";
    if (auto* ddp = dynamic_cast<parallel::DataParallelPlugin*>(dp.get());
        ddp && ddp->uses_copy_engine_all_reduce())
      impl += " copy-engine";
    if (auto* ddp = dynamic_cast<parallel::DataParallelPlugin*>(dp.get());
        ddp && ddp->uses_copy_engine_exchange())
      impl += " exchange";
    if (ranks > 1 && bucket_hold > 0) impl += fmt::format(" hold{:g}", bucket_hold);
    const std::string label = act == "gelu" ? impl : impl + " " + act;
    if (li.rank == 0)
      std::printf(
          "{\"impl\": \"%s\", \"gpus\": %lld, \"model\": \"%s\", \"batch\": %lld, \"device\": "
          "\"%s\", \"img_per_s\": %.1f, \"step_ms\": %.1f, \"tflops\": %.1f, \"mfu\": %.4f, "
          "\"peak_mem_gib\": %.2f, \"train_gflop_per_img\": %.1f, \"forward_ms\": %.1f, "
          "\"backward_ms\": %.1f, \"optimizer_ms\": %.1f, \"tp\": %d, \"tp_comm_share\": %.3f, "
          "\"step_ms_min\": %.2f, \"step_ms_median\": %.2f, \"step_ms_max\": %.2f}\n",
          label.c_str(), static_cast<long long>(ranks * tp), model.c_str(),
          static_cast<long long>(batch), device.c_str(), ips,
          1e3 * secs / static_cast<double>(steps), tflops,
          tflops / (peak * static_cast<double>(ranks * tp)), peak_gib,
          3.0 * c.forward_flops() / 1e9, 1e3 * phase[0] / profiled, 1e3 * phase[1] / profiled,
          1e3 * phase[2] / profiled, tp, tp_step > 0 ? tp_comm / tp_step : 0.0, step_ms.front(),
          step_ms[step_ms.size() / 2], step_ms.back());
  } catch (const Error& e) {
    std::fprintf(stderr, "vit_step_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
