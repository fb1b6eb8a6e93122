// The analytic model's tensor-parallel collectives against what the communicator moved: for
// every mode (1d with and without sequence parallelism, 2d, 2.5d, 3d; with checkpointing and in
// bf16), T threads over the in-process communicator run one forward and backward of a ViT, and
// each rank's operations and bytes per sub-group (nn::TensorParallel::comm_by_group) equal the
// sum of plan::plan_rank's collectives per sub-group for that rank; so do the parameter
// elements each rank holds. The same for colossalai benchmark's models (plan::Body): blocks alone
// on a token count of their own, and a stack of nn::ParallelLinear (1d column / row, 2d/2.5d/3d
// with the input layout alternating), run as its worker runs them.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <thread>

#include <fmt/format.h>

#include "cai/dist/communicator.h"
#include "cai/nn/tensor_parallel.h"
#include "cai/nn/vit.h"
#include "cai/ops/ops.h"
#include "cai/plan/plan.h"

using namespace cai;

namespace {

struct Case {
  std::string mode;
  int tp = 1, depth = 1;
  bool sp = false, checkpoint = false;
  DType dtype = DType::F32;
  plan::Body body = plan::Body::ViT;
};

constexpr int64_t kTokens = 5;  // Blocks and Linears

nn::ViTConfig model(bool checkpoint) {
  nn::ViTConfig c;
  c.img_size = 12, c.patch_size = 4, c.in_chans = 2, c.num_classes = 5, c.embed_dim = 12;
  c.depth = 2, c.num_heads = 6, c.mlp_ratio = 2.0, c.drop_rate = 0.1f;
  c.checkpoint = checkpoint;
  return c;
}

constexpr int64_t kBatch = 4;

nn::ViTConfig model_of(const Case& k) {
  nn::ViTConfig c = model(k.checkpoint);
  if (k.body == plan::Body::Linears) c.depth = 3;  // 1d ends on a column-parallel Linear
  return c;
}

using Counts = std::map<std::string, nn::TensorParallel::CommCount>;

// Blocks and Linears, as colossalai benchmark's worker builds and steps them
// (apps/colossalai/cmd_benchmark_worker.cpp): the layers on [batch, tokens, d] (this rank's chunk
// under 2d/2.5d/3d), forward, then the backward of mean(output).
Counts measured_body(const Case& k, const std::shared_ptr<nn::TensorParallel>& tp) {
  const nn::ViTConfig c = model_of(k);
  const int64_t d = c.embed_dim;
  std::vector<std::unique_ptr<nn::Layer>> layers;
  for (int64_t i = 0; i < c.depth; ++i) {
    if (k.body == plan::Body::Blocks) {
      layers.push_back(std::make_unique<nn::Block>(c, i, 0.0f, tp.get()));
      continue;
    }
    const auto kind = tp->nd()     ? nn::ParallelLinear::Kind::Nd
                      : i % 2 == 0 ? nn::ParallelLinear::Kind::Column
                                   : nn::ParallelLinear::Kind::Row;
    layers.push_back(std::make_unique<nn::ParallelLinear>(fmt::format("layers.{}", i), d, d, kind,
                                                          tp.get(), static_cast<int>(i % 2)));
  }
  std::vector<nn::Parameter*> ps;
  for (auto& l : layers) {
    l->collect(ps);
    l->compute_dtype = k.dtype;
  }
  int64_t numel = 0;
  for (nn::Parameter* p : ps) {
    nn::init_parameter(*p, 17, nn::ViTConfig{});
    numel += p->value.numel();
  }
  std::vector<float> v(kBatch * kTokens * d);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.3f * static_cast<float>(i));
  Tensor x = Tensor::from_vector(v, {kBatch, kTokens, d});
  if (tp->nd()) {
    const auto [s0, s1] = tp->batch_range(kBatch, 0);
    const auto [f0, f1] = tp->feature_slice(d, 0);
    const int64_t rows = (s1 - s0) * kTokens;
    Tensor part = Tensor::empty({rows, f1 - f0, 1});
    ops::copy_tokens_(part, 0, x.narrow(s0, s1 - s0).reshape({rows, d, 1}), f0, f1 - f0);
    x = part.reshape({s1 - s0, kTokens, f1 - f0});
  }
  if (k.body == plan::Body::Linears) x = x.to(k.dtype);  // a block's residual stream is fp32
  nn::ForwardCtx ctx{true, 1, 0, 0};
  std::vector<std::unique_ptr<nn::Cache>> caches(layers.size());
  tp->reset_comm_bytes();
  for (size_t i = 0; i < layers.size(); ++i) x = layers[i]->forward(x, caches[i], ctx);
  Tensor g = Tensor::full(x.shape(), 1.0f / static_cast<float>(x.numel()), x.device());
  if (x.dtype() != DType::F32) g = g.to(x.dtype());
  for (size_t i = layers.size(); i-- > 0;) g = layers[i]->backward(g, caches[i], ctx);
  tp->drain();
  Counts out = tp->comm_by_group();
  out["parameters"] = {0, numel};
  return out;
}

// Per rank: what its TensorParallel counted over one forward and backward.
std::vector<Counts> measured(const Case& k) {
  auto comms = dist::make_fake_group(k.tp);
  std::vector<Counts> out(k.tp);
  std::vector<std::string> errors(k.tp);
  std::vector<std::thread> threads;
  for (int r = 0; r < k.tp; ++r)
    threads.emplace_back([&, r] {
      try {
        auto tp = std::make_shared<nn::TensorParallel>(*comms[r], k.mode, k.sp, k.depth);
        if (k.body != plan::Body::ViT) {
          out[r] = measured_body(k, tp);
          return;
        }
        const nn::ViTConfig c = model(k.checkpoint);
        nn::ViT m(c, tp);
        m.init(3);
        m.set_compute_dtype(k.dtype);
        std::vector<float> px(kBatch * c.in_chans * c.img_size * c.img_size);
        for (size_t i = 0; i < px.size(); ++i) px[i] = std::sin(0.1f * static_cast<float>(i));
        const Tensor img = Tensor::from_vector(px, {kBatch, c.in_chans, c.img_size, c.img_size});
        const Tensor y = Tensor::from_vector(std::vector<int32_t>{0, 1, 2, 3}, {kBatch});
        nn::ForwardCtx ctx{true, 1, 0, 0};
        std::vector<std::unique_ptr<nn::Cache>> caches;
        tp->reset_comm_bytes();
        const Tensor logits = m.forward(img, caches, ctx);
        m.backward(ops::cross_entropy_bwd(logits, y, 0.0f, 1.0f / kBatch), caches, ctx);
        tp->drain();
        out[r] = tp->comm_by_group();
        out[r]["parameters"] = {0, m.num_parameters()};
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < k.tp; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return out;
}

// Per rank: the plan's collectives of the tensor-parallel group summed per sub-group.
std::vector<Counts> planned(const Case& k) {
  plan::Layout l;
  l.world = k.tp, l.tp = k.tp;
  l.tp_mode = k.mode, l.tp_depth = k.depth;
  l.sequence_parallel = k.sp;
  l.batch = kBatch;
  l.precision = k.dtype;
  l.body = k.body;
  if (k.body != plan::Body::ViT) {
    l.tokens = kTokens;
    l.data_parallel_plugin = false;
  }
  const plan::StepPlan p = plan::make_plan(model_of(k), l);
  std::vector<Counts> out(k.tp);
  for (int r = 0; r < k.tp; ++r) {
    out[r]["parameters"] = {0, plan::plan_rank(p, r).parameter_elements};
    for (const plan::LayerPlan& lp : plan::plan_rank(p, r).layer_plans)
      for (const plan::Collective& c : lp.collectives) {
        if (c.group != plan::Group::Tp) continue;
        auto& n = out[r][c.subgroup];
        n.ops += c.count;
        n.bytes += c.count * c.bytes;
      }
  }
  return out;
}

std::string describe(const Counts& c) {
  std::string s;
  for (const auto& [g, n] : c) s += fmt::format("{}: {} ops {} B; ", g, n.ops, n.bytes);
  return s;
}

}  // namespace

TEST(PlanCollectives, EqualWhatTheCommunicatorMovedInEveryMode) {
  const std::vector<Case> cases = {
      {"1d", 2},
      {"1d", 3, 1, true},
      {"1d", 2, 1, true, true},
      {"2d", 4},
      {"2.5d", 4, 1},
      {"2.5d", 8, 2},
      {"3d", 8},
      {"2d", 4, 1, false, true},
      {"3d", 8, 1, false, true},
      {"2.5d", 8, 2, false, false, DType::BF16},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(fmt::format("{} tp {} depth {}{}{} {}", k.mode, k.tp, k.depth, k.sp ? " sp" : "",
                             k.checkpoint ? " checkpoint" : "", dtype_name(k.dtype)));
    const auto got = measured(k);
    const auto want = planned(k);
    for (int r = 0; r < k.tp; ++r) {
      EXPECT_FALSE(got[r].empty()) << "rank " << r << " moved nothing";
      EXPECT_EQ(describe(got[r]), describe(want[r])) << "rank " << r;
    }
  }
}

// colossalai benchmark --model block / mlp: the plan of the blocks alone and of the Linear stack
// (3 layers: 1d ends on a column-parallel one) against what the worker's layers moved.
TEST(PlanCollectives, BenchmarkBlocksAndLinearsEqualWhatTheLayersMoved) {
  std::vector<Case> cases;
  for (plan::Body b : {plan::Body::Blocks, plan::Body::Linears}) {
    const bool blocks = b == plan::Body::Blocks;
    cases.push_back({"1d", 2, 1, false, false, DType::F32, b});
    cases.push_back({"1d", 3, 1, false, false, DType::BF16, b});
    cases.push_back({"2d", 4, 1, false, false, DType::F32, b});
    cases.push_back({"2.5d", 4, 1, false, false, DType::F32, b});
    cases.push_back({"2.5d", 8, 2, false, false, DType::BF16, b});
    cases.push_back({"3d", 8, 1, false, false, DType::F32, b});
    if (blocks) cases.push_back({"2d", 4, 1, false, true, DType::F32, b});
  }
  for (const Case& k : cases) {
    SCOPED_TRACE(fmt::format("{} {} tp {} depth {}{} {}", plan::body_name(k.body), k.mode, k.tp,
                             k.depth, k.checkpoint ? " checkpoint" : "", dtype_name(k.dtype)));
    const auto got = measured(k);
    const auto want = planned(k);
    for (int r = 0; r < k.tp; ++r) {
      EXPECT_FALSE(got[r].empty()) << "rank " << r << " moved nothing";
      EXPECT_EQ(describe(got[r]), describe(want[r])) << "rank " << r;
    }
  }
}
