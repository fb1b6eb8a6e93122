// ZeRO-1/2's deferred parameter all-gathers in one process (two ranks on threads over the fake
// communicator): the optimizer step issues only the first zero_max_inflight_buckets gathers and
// leaves the later buckets' full values stale; every layer's forward (train and eval hooks) sees
// its parameters current, equal bit for bit to every rank's stepped shards; some gathers are
// completed inside later layers' hooks, i.e. in flight while earlier layers computed; and
// materialize_parameters() makes everything current for other readers.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "cai/core/error.h"
#include "cai/core/rng.h"
#include "cai/dist/communicator.h"
#include "cai/nn/vit.h"
#include "cai/ops/ops.h"
#include "cai/optim/optimizer.h"
#include "cai/parallel/data_parallel.h"

using namespace cai;
using Action = schedule::ParamGatherQueue::Action;

namespace {

nn::ViTConfig tiny() {
  nn::ViTConfig c;
  c.img_size = 28, c.patch_size = 7, c.in_chans = 1, c.num_classes = 10, c.embed_dim = 64;
  c.depth = 4, c.num_heads = 4, c.mlp_ratio = 4.0, c.drop_rate = 0.0f, c.drop_path_rate = 0.0f;
  return c;
}

struct Outcome {
  std::vector<std::string> failures;
  int buckets = 0;
  std::vector<int> issued_by_step;      // issue actions in each optimizer_step
  std::vector<int> completed_by_step;   // complete actions in each optimizer_step
  int completed_after_first_layer = 0;  // completes inside the hooks of layers after the first
  int stale_after_step = 0;             // parameters whose own chunk was stale after a step
  bool stale_flag_after_materialize = true;
};

// Every parameter of `ps` holds, in its own chunk, exactly its shard's value.
int stale_count(const std::vector<nn::Parameter*>& ps, const std::vector<nn::Parameter*>& shards,
                size_t first, int rank, int size) {
  int stale = 0;
  for (size_t k = 0; k < ps.size(); ++k) {
    const int64_t n = ps[k]->value.numel();
    const auto [b, e] = parallel::DataParallelPlugin::shard_range(n, rank, size);
    const std::vector<float> full = ps[k]->value.to_vector();
    const std::vector<float> mine = shards[first + k]->value.to_vector();
    if (!std::equal(mine.begin(), mine.end(), full.begin() + b)) ++stale;
  }
  return stale;
}

Outcome run(dist::Communicator& comm, int zero, int inflight) {
  Outcome o;
  auto fail = [&](const std::string& s) { o.failures.push_back(s); };
  nn::ViT model(tiny());
  model.init(7);
  parallel::DataParallelConfig dc;
  dc.zero_stage = zero;
  dc.ddp_bucket_cap_mb = 0.08;      // ≈ 21k elements: several buckets
  dc.zero_bucket_size_in_m = 0.02;  // 20k elements
  dc.zero_max_inflight_buckets = inflight;
  parallel::DataParallelPlugin plugin(comm, dc);
  plugin.setup(model);
  o.buckets = plugin.num_buckets();
  const std::vector<nn::Parameter*> shards = plugin.optimizer_parameters(model);
  optim::OptimizerOptions oo;
  oo.name = "adam";
  auto opt = optim::make_optimizer(oo, optim::weight_decay_groups(shards, 1e-2, 0.0));
  std::vector<std::vector<nn::Parameter*>> layer_ps;
  std::vector<size_t> first;  // index of each layer's first parameter among the shards
  size_t at = 0;
  for (auto& l : model.layers()) {
    std::vector<nn::Parameter*> ps;
    l->collect(ps);
    first.push_back(at);
    at += ps.size();
    layer_ps.push_back(ps);
  }
  const int64_t batch = 2;
  Tensor images = Tensor::empty({batch, 1, 28, 28});
  rng::normal_(images, 3, 11 + comm.rank(), 0.0f, 1.0f);
  const Tensor labels = Tensor::from_vector(std::vector<int32_t>{3, 7}, {batch});

  // before_forward wrapped: after the plugin's hook the layer's parameters must be current.
  int pos_of_first_layer_run = -1;
  auto checked = [&](const nn::LayerHooks* inner, const std::string& what) {
    nn::LayerHooks h = *inner;
    h.before_forward = [&, inner, what](nn::Layer& l) {
      if (inner->before_forward) inner->before_forward(l);
      int pos = 0;
      while (model.layers()[pos].get() != &l) ++pos;
      for (const Action& a : plugin.take_param_gather_log())
        if (!a.issue && pos_of_first_layer_run >= 0 && pos > pos_of_first_layer_run)
          ++o.completed_after_first_layer;
      if (pos_of_first_layer_run < 0) pos_of_first_layer_run = pos;
      const int s = stale_count(layer_ps[pos], shards, first[pos], comm.rank(), comm.size());
      if (s > 0)
        fail(what + ": layer " + std::to_string(pos) + " ran with " + std::to_string(s) +
             " stale parameters");
    };
    return h;
  };
  auto all_stale = [&] {
    int s = 0;
    for (size_t l = 0; l < layer_ps.size(); ++l)
      s += stale_count(layer_ps[l], shards, first[l], comm.rank(), comm.size());
    return s;
  };
  for (int step = 0; step < 3; ++step) {
    pos_of_first_layer_run = -1;
    const nn::LayerHooks hooks =
        checked(plugin.train_hooks(true), "train step " + std::to_string(step));
    nn::ForwardCtx ctx;
    ctx.training = true;
    std::vector<std::unique_ptr<nn::Cache>> caches;
    Tensor logits = model.forward(images, caches, ctx, &hooks);
    Tensor dl = ops::cross_entropy_bwd(logits, labels, 0.0f, 1.0f / (batch * comm.size()));
    model.backward(dl, caches, ctx, &hooks);
    plugin.sync_gradients(model);
    plugin.take_param_gather_log();
    plugin.optimizer_step(*opt);
    int issued = 0, completed = 0;
    for (const Action& a : plugin.take_param_gather_log()) (a.issue ? issued : completed)++;
    o.issued_by_step.push_back(issued);
    o.completed_by_step.push_back(completed);
    if (!plugin.parameters_stale()) fail("nothing stale after the step");
    o.stale_after_step = std::max(o.stale_after_step, all_stale());
    plugin.zero_grad(model, *opt);
  }
  // Evaluation through the eval hooks completes the gathers as its layers run.
  {
    pos_of_first_layer_run = -1;
    const nn::LayerHooks* eh = plugin.eval_hooks();
    if (!eh) {
      fail("no eval hooks for ZeRO-1/2");
    } else {
      const nn::LayerHooks hooks = checked(eh, "eval");
      std::vector<std::unique_ptr<nn::Cache>> caches;
      model.forward(images, caches, nn::ForwardCtx{}, &hooks);
    }
  }
  // A step more, then materialize: every value current without a forward.
  {
    nn::ForwardCtx ctx;
    ctx.training = true;
    std::vector<std::unique_ptr<nn::Cache>> caches;
    Tensor logits = model.forward(images, caches, ctx, plugin.train_hooks(true));
    model.backward(ops::cross_entropy_bwd(logits, labels, 0.0f, 0.25f), caches, ctx,
                   plugin.train_hooks(true));
    plugin.sync_gradients(model);
    plugin.optimizer_step(*opt);
    plugin.materialize_parameters();
    o.stale_flag_after_materialize = plugin.parameters_stale();
    const int s = all_stale();
    if (s > 0) fail(std::to_string(s) + " parameters stale after materialize_parameters()");
  }
  return o;
}

void check(int zero, int inflight) {
  auto comms = dist::make_fake_group(2);
  std::vector<Outcome> out(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        out[r] = run(*comms[r], zero, inflight);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("zero " + std::to_string(zero) + " inflight " + std::to_string(inflight) +
                 " rank " + std::to_string(r));
    ASSERT_EQ(errors[r], "");
    const Outcome& o = out[r];
    for (const std::string& f : o.failures) ADD_FAILURE() << f;
    ASSERT_GE(o.buckets, 3) << "the test needs several buckets";
    ASSERT_EQ(o.issued_by_step.size(), 3u);
    for (size_t s = 0; s < 3; ++s) {
      EXPECT_EQ(o.issued_by_step[s], std::min(inflight, o.buckets)) << "step " << s;
      EXPECT_EQ(o.completed_by_step[s], 0) << "step " << s << ": the step completed gathers";
    }
    EXPECT_GT(o.stale_after_step, 0) << "the step left no parameter stale: nothing deferred";
    EXPECT_GT(o.completed_after_first_layer, 0)
        << "no gather completed after the first layer ran: nothing overlapped the forward";
    EXPECT_FALSE(o.stale_flag_after_materialize);
  }
}

TEST(ZeroGatherOrder, Stage1) {
  check(1, 2);
}
TEST(ZeroGatherOrder, Stage2WindowOfOne) {
  check(2, 1);
}
TEST(ZeroGatherOrder, Stage2) {
  check(2, 3);
}

}  // namespace
