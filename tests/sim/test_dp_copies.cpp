// The simulator's copies of the data-parallel plugin are the plugin's own: for DDP with bf16
// buckets and ZeRO 1, 2 and 3 on two CPU ranks (offload needs a GPU: not here), the copy ops of one
// simulated step (packs, unpacks, shard adds, bucket casts: sim/from_config.cpp's dp_copy) have the
// calls and bytes that the executor's plugin runs in one steady-state step
// (DataParallelPlugin::take_copy_stats: two ranks on threads over the fake communicator, the
// config's model and buckets). A change to what the plugin copies that the simulator does not
// follow fails here.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cai/config/config.h"
#include "cai/core/rng.h"
#include "cai/core/tensor.h"
#include "cai/dist/communicator.h"
#include "cai/nn/vit.h"
#include "cai/ops/ops.h"
#include "cai/optim/optimizer.h"
#include "cai/parallel/data_parallel.h"
#include "cluster.h"
#include "from_config.h"
#include "sim_test_inputs.h"

using namespace cai;
using cai::sim::test::fmnist;

namespace {

struct Copies {
  int64_t calls = 0, bytes = 0;
};

// The plugin's copy ops in rank 0's simulated step (sim's dp_copy: an elementwise op counting
// device calls).
Copies simulated(const config::TrainConfig& cfg) {
  const sim::Cluster cpu = sim::test::cluster("cpu-2");
  const sim::ConfigWorkload cw = sim::workload_from_config(cfg, 2, cpu, false);
  Copies c;
  for (const sim::Op& o : cw.workload.ranks[0].ops)
    if (o.calls > 0 && o.op_kind == "elementwise") {
      c.calls += o.calls;
      c.bytes += static_cast<int64_t>(o.mem_bytes);
    }
  return c;
}

// The plugin's copies in the third of three steps on rank `comm.rank()` (the second and later
// steps are alike: ZeRO-1/2's forward completes the last step's gathers).
Copies executed(const config::TrainConfig& cfg, dist::Communicator& comm) {
  nn::ViT model(cfg.vit());
  model.init(7);
  parallel::DataParallelConfig dc;
  dc.zero_stage = static_cast<int>(cfg.zero_stage);
  dc.ddp_bucket_cap_mb = cfg.ddp_bucket_cap_mb;
  dc.bucket_dtype = dtype_from_name(cfg.gradient_comm_dtype);
  dc.zero_bucket_size_in_m = cfg.zero_bucket_size_in_m;
  dc.zero3_prefetch = static_cast<int>(cfg.zero3_prefetch);
  dc.zero_max_inflight_buckets = static_cast<int>(cfg.zero_max_inflight_buckets);
  parallel::DataParallelPlugin plugin(comm, dc);
  plugin.setup(model);
  optim::OptimizerOptions oo;
  oo.name = "adamw";
  auto opt = optim::make_optimizer(
      oo, optim::weight_decay_groups(plugin.optimizer_parameters(model), 1e-3, 0.05));
  const nn::ViTConfig v = cfg.vit();
  const int64_t batch = 2;
  Tensor images = Tensor::empty({batch, v.in_chans, v.img_size, v.img_size});
  rng::normal_(images, 3, 11 + comm.rank(), 0.0f, 1.0f);
  const Tensor labels = Tensor::from_vector(std::vector<int32_t>{3, 7}, {batch});
  Copies last;
  for (int step = 0; step < 3; ++step) {
    plugin.take_copy_stats();
    nn::ForwardCtx ctx;
    ctx.training = true;
    std::vector<std::unique_ptr<nn::Cache>> caches;
    const nn::LayerHooks* hooks = plugin.train_hooks(true);
    Tensor logits = model.forward(images, caches, ctx, hooks);
    model.backward(ops::cross_entropy_bwd(logits, labels, 0.0f, 0.25f), caches, ctx, hooks);
    plugin.sync_gradients(model);
    plugin.optimizer_step(*opt);
    plugin.zero_grad(model, *opt);
    const auto s = plugin.take_copy_stats();
    last = Copies{s.launches, s.bytes};
  }
  return last;
}

void check(const std::vector<std::string>& sets) {
  const config::TrainConfig cfg = fmnist(sets);
  const Copies sim = simulated(cfg);
  auto comms = dist::make_fake_group(2);
  std::vector<Copies> out(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        out[r] = executed(cfg, *comms[r]);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  std::string what;
  for (const std::string& s : sets) what += s + " ";
  ASSERT_EQ(errors[0], "") << what;
  ASSERT_EQ(errors[1], "") << what;
  EXPECT_GT(out[0].calls, 0) << what << ": the plugin copied nothing";
  EXPECT_EQ(sim.calls, out[0].calls) << what << ": copy calls, simulated against executed";
  EXPECT_EQ(sim.bytes, out[0].bytes) << what << ": copied bytes, simulated against executed";
}

TEST(DataParallelCopies, DdpBf16Buckets) {
  check({"parallel.zero_stage=0", "parallel.gradient_comm_dtype=\"bf16\"",
         "parallel.ddp_bucket_cap_mb=0.02"});
}
TEST(DataParallelCopies, Zero1) {
  check({"parallel.zero_stage=1", "parallel.zero_bucket_size_in_m=0.01",
         "parallel.ddp_bucket_cap_mb=0.02"});
}
TEST(DataParallelCopies, Zero2) {
  check({"parallel.zero_stage=2", "parallel.zero_bucket_size_in_m=0.01"});
}
TEST(DataParallelCopies, Zero3) {
  check({"parallel.zero_stage=3"});
}

}  // namespace
