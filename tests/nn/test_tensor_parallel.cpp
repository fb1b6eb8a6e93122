// Tensor parallelism (1D, with and without sequence parallelism) in one process: T threads over
// the in-process fake communicator each build their shard of the ViT; the forward, the loss and
// every gradient (gathered back to timm's full shapes) equal the single-process model's. The
// GPU cases run the same on one GPU (the fake communicator stages CUDA tensors through the host),
// so every tensor-parallel kernel path (token copies, strided masks, split weight and input
// gradients, half precision) is checked against the single-GPU model where no 2-GPU host exists.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>
#include <tuple>

#include "cai/core/error.h"
#include "cai/core/rng.h"
#include "cai/dist/communicator.h"
#include "cai/nn/tensor_parallel.h"
#include "cai/nn/vit.h"
#include "cai/ops/ops.h"
#include "kernels/device.h"

using namespace cai;
using namespace cai::nn;

namespace {

ViTConfig tp_config() {
  ViTConfig c;
  c.img_size = 12, c.patch_size = 4, c.in_chans = 2, c.num_classes = 5, c.embed_dim = 12;
  c.depth = 2, c.num_heads = 6, c.mlp_ratio = 2.0;  // 10 tokens: uneven over 3 and 4 ranks
  c.drop_rate = 0.2f, c.drop_path_rate = 0.3f;
  return c;
}

struct StepResult {
  std::vector<float> logits;
  double loss = 0;
  std::map<std::string, Tensor> grads;   // full shapes (gathered)
  std::map<std::string, Tensor> values;  // full shapes
};

Tensor images(const ViTConfig& c, int64_t b) {
  std::vector<float> v(b * c.in_chans * c.img_size * c.img_size);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37f * static_cast<float>(i));
  return Tensor::from_vector(v, {b, c.in_chans, c.img_size, c.img_size});
}

Tensor labels(int64_t b) {
  std::vector<int32_t> v(b);
  for (int64_t i = 0; i < b; ++i) v[i] = static_cast<int32_t>((i * 3) % 5);
  return Tensor::from_vector(v, {b});
}

// One forward and backward at step 3, sample offset 6 (masks keyed by global positions), of a
// batch of 4 (2d/2.5d/3d split it into 2 or 4 chunks).
// split: every layer's backward_input (B, with the collectives), then every backward_weight (W).
StepResult step(ViT& m, DType dtype, Device dev, bool split = false) {
  const ViTConfig& c = m.config();
  m.init(11);
  if (dev.is_cuda()) m.to(dev);
  m.set_compute_dtype(dtype);
  ForwardCtx ctx{true, 5, 3, 6};
  std::vector<std::unique_ptr<Cache>> caches;
  const int64_t b = 4;
  Tensor logits = m.forward(images(c, b).to(dev), caches, ctx);
  StepResult r;
  r.logits = logits.to_vector();
  const Tensor y = labels(b).to(dev);
  for (float l : ops::cross_entropy_fwd(logits, y, 0.1f).to_vector()) r.loss += l / b;
  Tensor g = ops::cross_entropy_bwd(logits, y, 0.1f, 1.0f / b);
  if (!split) {
    m.backward(g, caches, ctx);
    return r;
  }
  auto& layers = m.layers();
  for (size_t i = layers.size(); i-- > 0;) g = layers[i]->backward_input(g, caches[i], ctx);
  for (size_t i = layers.size(); i-- > 0;) layers[i]->backward_weight(caches[i]);
  for (auto& c : caches) EXPECT_EQ(c, nullptr);
  return r;
}

StepResult single(DType dtype = DType::F32, bool checkpoint = false, Device dev = Device::cpu()) {
  ViTConfig c = tp_config();
  c.checkpoint = checkpoint;
  ViT m(c);
  StepResult r = step(m, dtype, dev);
  for (Parameter* p : m.parameters()) {
    r.grads[p->name] = p->grad.to(Device::cpu());
    r.values[p->name] = p->value.to(Device::cpu());
  }
  return r;
}

// T threads, one shard each; rank 0's logits and loss, gradients and values unsharded.
StepResult parallel(int T, bool sp, DType dtype = DType::F32, bool checkpoint = false,
                    Device dev = Device::cpu(), const std::string& mode = "1d", int depth = 1,
                    bool split = false, bool pad_staging = false) {
  auto comms = dist::make_fake_group(T);
  std::vector<StepResult> rs(T);
  std::vector<std::vector<std::pair<Parameter, int>>> params(T);  // copies (value, grad, shard)
  std::vector<std::string> errors(T);
  std::vector<std::thread> threads;
  for (int r = 0; r < T; ++r)
    threads.emplace_back([&, r] {
      try {
        auto tp = std::make_shared<TensorParallel>(*comms[r], mode, sp, depth);
        tp->set_pad_staging(pad_staging);
        ViTConfig c = tp_config();
        c.checkpoint = checkpoint;
        ViT m(c, tp);
        rs[r] = step(m, dtype, dev, split);
        tp->drain();
        for (Parameter* p : m.parameters()) {
          Parameter host = *p;
          host.value = p->value.to(Device::cpu());
          host.grad = p->grad.to(Device::cpu());
          params[r].push_back({host, r});
        }
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < T; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  StepResult out = rs[0];
  for (size_t i = 0; i < params[0].size(); ++i) {
    const Parameter& p0 = params[0][i].first;
    if (p0.shard.sharded()) {
      std::vector<Tensor> g, v;
      for (int r = 0; r < T; ++r) {
        g.push_back(params[r][i].first.grad);
        v.push_back(params[r][i].first.value);
      }
      out.grads[p0.name] = unshard(g, p0.shard);
      out.values[p0.name] = unshard(v, p0.shard);
      // Ranks holding copies of a part (2.5d depth, features-only cuts) hold the same gradient.
      for (int r = 1; r < T; ++r)
        for (int q = 0; q < r; ++q)
          if (p0.shard.same_part(q, r)) {
            const auto a = g[q].to_vector(), b = g[r].to_vector();
            for (size_t k = 0; k < a.size(); ++k)
              EXPECT_NEAR(a[k], b[k], 1e-6 * (1 + std::abs(a[k])))
                  << p0.name << " ranks " << q << ", " << r;
          }
    } else {
      // Whole parameters: every rank must hold the same gradient.
      for (int r = 1; r < T; ++r) {
        const auto a = p0.grad.to_vector(), b = params[r][i].first.grad.to_vector();
        for (size_t k = 0; k < a.size(); ++k)
          EXPECT_NEAR(a[k], b[k], 1e-6 * (1 + std::abs(a[k]))) << p0.name << " rank " << r;
      }
      out.grads[p0.name] = p0.grad;
      out.values[p0.name] = p0.value;
    }
    // Every rank's logits are the same.
  }
  for (int r = 1; r < T; ++r) EXPECT_EQ(rs[r].logits, rs[0].logits) << "rank " << r;
  return out;
}

double rel_err(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector(), y = b.to_vector();
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    den += double(x[i]) * x[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

void expect_same(const StepResult& ref, const StepResult& got, double tol) {
  ASSERT_EQ(ref.logits.size(), got.logits.size());
  EXPECT_LE(rel_err(Tensor::from_vector(ref.logits, {int64_t(ref.logits.size())}),
                    Tensor::from_vector(got.logits, {int64_t(got.logits.size())})),
            tol);
  EXPECT_NEAR(ref.loss, got.loss, tol * std::abs(ref.loss));
  ASSERT_EQ(ref.grads.size(), got.grads.size());
  for (const auto& [name, g] : ref.grads) {
    ASSERT_TRUE(got.grads.count(name)) << name;
    ASSERT_EQ(g.shape(), got.grads.at(name).shape()) << name;
    EXPECT_LE(rel_err(g, got.grads.at(name)), tol) << name;
    EXPECT_LE(rel_err(ref.values.at(name), got.values.at(name)), 0.0) << name << " (init)";
  }
}

}  // namespace

TEST(TensorParallel, ShardAndUnshardAreInverse) {
  std::vector<float> v(6 * 4);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  const Tensor full = Tensor::from_vector(v, {6, 4});
  // qkv-like: 3 groups of 2 rows, split in 2 parts: part 1 holds rows 1, 3, 5.
  ShardSpec s = ShardSpec::split({6, 4}, 0, 3, 1, 2);
  const Tensor p1 = shard_of(full, s);
  EXPECT_EQ(p1.shape(), (Shape{3, 4}));
  EXPECT_EQ(p1.to_vector()[0], 4.0f);   // row 1
  EXPECT_EQ(p1.to_vector()[4], 12.0f);  // row 3
  s.rank = 0;
  const Tensor p0 = shard_of(full, s);
  EXPECT_EQ(unshard({p0, p1}, s).to_vector(), v);
  // Columns: dim 1 in 2 parts.
  ShardSpec c = ShardSpec::split({6, 4}, 1, 1, 1, 2);
  const Tensor c1 = shard_of(full, c);
  EXPECT_EQ(c1.shape(), (Shape{6, 2}));
  EXPECT_EQ(c1.to_vector()[0], 2.0f);
  c.rank = 0;
  EXPECT_EQ(unshard({shard_of(full, c), c1}, c).to_vector(), v);
  EXPECT_THROW(unshard({p0}, s), Error);
  // 2d-like blocks over 8 ranks (q 2, depth 2): rows by r % 2, columns by (r / 2) % 2, copies
  // over r / 4. Rank 3 holds rows 3..5, columns 2..3; rank 7 the same.
  ShardSpec b;
  b.full = {6, 4};
  b.size = 8;
  b.cuts = {ShardCut{0, 1, 2, 1}, ShardCut{1, 1, 2, 2}};
  std::vector<Tensor> parts;
  for (int r = 0; r < 8; ++r) {
    b.rank = r;
    parts.push_back(shard_of(full, b));
  }
  EXPECT_EQ(parts[3].to_vector(), (std::vector<float>{14, 15, 18, 19, 22, 23}));
  EXPECT_EQ(parts[7].to_vector(), parts[3].to_vector());
  EXPECT_TRUE(b.same_part(3, 7));
  b.rank = 7;
  EXPECT_FALSE(b.primary());
  b.rank = 3;
  EXPECT_TRUE(b.primary());
  EXPECT_EQ(unshard(parts, b).to_vector(), v);
  // 3d-like: the same dimension cut twice (by stride 4, then by stride 1).
  ShardSpec t;
  t.full = {2, 8};
  t.size = 8;
  t.cuts = {ShardCut{1, 1, 2, 4}, ShardCut{1, 1, 2, 1}};
  const Tensor f2 = Tensor::from_vector(std::vector<float>(v.begin(), v.begin() + 16), {2, 8});
  parts.clear();
  for (int r = 0; r < 8; ++r) {
    t.rank = r;
    parts.push_back(shard_of(f2, t));
  }
  EXPECT_EQ(parts[5].to_vector(), (std::vector<float>{6, 7, 14, 15}));  // (r/4)=1, r%2=1
  EXPECT_EQ(unshard(parts, t).to_vector(), f2.to_vector());
}

TEST(TensorParallel, SplitsThatDoNotDivideAreErrorsNamingBoth) {
  ViTConfig c = tp_config();
  try {
    c.validate_tensor_parallel(4, false);
    FAIL() << "heads 6 over 4 ranks accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_heads 6"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("size 4"), std::string::npos) << e.what();
  }
  c.num_heads = 4, c.embed_dim = 12, c.mlp_ratio = 1.5;  // hidden 18 over 4
  EXPECT_THROW(c.validate_tensor_parallel(4, false), Error);
  auto comms = dist::make_fake_group(1);
  EXPECT_THROW(TensorParallel(*comms[0], "2d"), Error);  // one rank is not a q × q grid
  EXPECT_THROW(TensorParallel(*comms[0], "4d"), Error);
  for (const auto& [mode, size, depth, valid] :
       std::vector<std::tuple<std::string, int, int, std::string>>{
           {"2d", 8, 1, "4, 9, 16"}, {"3d", 9, 1, "8, 27, 64"}, {"2.5d", 8, 3, "12, 27"}}) {
    try {
      TensorParallel::validate_size(mode, size, depth);
      ADD_FAILURE() << mode << " size " << size << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("valid sizes are " + valid), std::string::npos)
          << e.what();
    }
  }
  ViTConfig d = tp_config();  // hidden 12: 3d with q 3 cuts inputs in 9 parts
  EXPECT_THROW(d.validate_tensor_parallel("3d", 27, 1, false), Error);
  EXPECT_NO_THROW(d.validate_tensor_parallel("3d", 8, 1, false));
  EXPECT_NO_THROW(d.validate_tensor_parallel("2.5d", 8, 2, false));
}

TEST(TensorParallel, ModesForASizeAreColossalAIs) {
  auto names = [](int n) {
    std::vector<std::string> out;
    for (const auto& m : TensorParallel::modes_for(n))
      out.push_back(m.mode == "2.5d" ? fmt::format("2.5d/{}", m.depth) : m.mode);
    return out;
  };
  EXPECT_EQ(names(4), (std::vector<std::string>{"1d", "2d", "2.5d/1"}));
  EXPECT_EQ(names(8), (std::vector<std::string>{"1d", "2.5d/2", "3d"}));
  EXPECT_EQ(names(64), (std::vector<std::string>{"1d", "2d", "2.5d/1", "2.5d/4", "2.5d/16", "3d"}));
  EXPECT_TRUE(names(1).empty());
}

TEST(TensorParallel, TwoDimensionalModesMatchTheSingleProcess) {
  const StepResult ref = single();
  SCOPED_TRACE("2d, 4 ranks");
  expect_same(ref, parallel(4, false, DType::F32, false, Device::cpu(), "2d"), 1e-5);
  SCOPED_TRACE("2.5d, 8 ranks, depth 2");
  expect_same(ref, parallel(8, false, DType::F32, false, Device::cpu(), "2.5d", 2), 1e-5);
  SCOPED_TRACE("3d, 8 ranks");
  expect_same(ref, parallel(8, false, DType::F32, false, Device::cpu(), "3d"), 1e-5);
}

TEST(TensorParallel, TwoDimensionalModesWithCheckpointingAndHalfPrecision) {
  const StepResult ref_ck = single(DType::F32, true);
  expect_same(ref_ck, parallel(4, false, DType::F32, true, Device::cpu(), "2d"), 1e-5);
  expect_same(ref_ck, parallel(8, false, DType::F32, true, Device::cpu(), "3d"), 1e-5);
  const StepResult ref = single(DType::BF16);
  expect_same(ref, parallel(4, false, DType::BF16, false, Device::cpu(), "2d"), 2e-2);
  expect_same(ref, parallel(8, false, DType::BF16, false, Device::cpu(), "3d"), 2e-2);
}

TEST(TensorParallel, OneDimensionalMatchesTheSingleProcess) {
  const StepResult ref = single();
  for (int T : {2, 3}) {
    SCOPED_TRACE("tp " + std::to_string(T));
    expect_same(ref, parallel(T, false), 1e-5);
  }
}

TEST(TensorParallel, SequenceParallelMatchesTheSingleProcess) {
  const StepResult ref = single();
  // A batch of 4: cut by samples over 2 ranks (2/2), by tokens over 3 (10 tokens: 3/3/4).
  for (int T : {2, 3}) {
    SCOPED_TRACE("tp " + std::to_string(T) + " + sp");
    expect_same(ref, parallel(T, true), 1e-5);
  }
}

// The GPU's staging on the CPU: every rank's token block padded to the largest (even-count
// collectives, the gather's short parts copied into a padded buffer, the reduce-scatter's result
// the head of a padded one): over 3 ranks (by tokens, 3/3/4; over 2 the batch of 4 is cut by
// samples); with checkpointing (the recompute keeps the gathered inputs) and the split backward
// (the re-gathers finished in B).
TEST(TensorParallel, SequenceParallelPaddedStagingMatchesTheSingleProcess) {
  const StepResult ref = single();
  const Device cpu = Device::cpu();
  for (int T : {2, 3}) {
    SCOPED_TRACE("tp " + std::to_string(T) + " + sp, padded staging");
    expect_same(ref, parallel(T, true, DType::F32, false, cpu, "1d", 1, false, true), 1e-5);
    expect_same(ref, parallel(T, true, DType::F32, false, cpu, "1d", 1, true, true), 1e-5);
  }
  expect_same(single(DType::F32, true),
              parallel(3, true, DType::F32, true, cpu, "1d", 1, false, true), 1e-5);
}

// Split backward (zero-bubble): the collectives stay in B (1D: the input gradients' all-reduce
// or reduce-scatter, the sequence-parallel LayerNorm and embedding sums); 2d keeps a combined
// backward in B.
TEST(TensorParallel, SplitBackwardMatchesTheSingleProcess) {
  const StepResult ref = single();
  const Device cpu = Device::cpu();
  expect_same(ref, parallel(2, false, DType::F32, false, cpu, "1d", 1, true), 1e-5);
  expect_same(ref, parallel(3, true, DType::F32, false, cpu, "1d", 1, true), 1e-5);
  expect_same(ref, parallel(4, false, DType::F32, false, cpu, "2d", 1, true), 1e-5);
  const StepResult ref_ckpt = single(DType::F32, true);
  expect_same(ref_ckpt, parallel(2, true, DType::F32, true, cpu, "1d", 1, true), 1e-5);
}

TEST(TensorParallel, CheckpointingRecomputesTheSameCollectives) {
  const StepResult ref = single(DType::F32, true);
  expect_same(ref, parallel(2, true, DType::F32, true), 1e-5);
  expect_same(ref, parallel(2, false, DType::F32, true), 1e-5);
}

TEST(TensorParallel, HalfPrecisionStaysWithinTheHalfBounds) {
  // bf16: partial sums are rounded before they are added, so tp differs from the single bf16
  // run by rounding only (the model-level bf16 bound: 2e-2).
  const StepResult ref = single(DType::BF16);
  expect_same(ref, parallel(2, true, DType::BF16), 2e-2);
  expect_same(ref, parallel(2, false, DType::BF16), 2e-2);
}

// The same on one GPU: two threads, each a tensor-parallel rank on the same device.
class TensorParallelGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kernels::cuda::device_count() == 0)
      GTEST_SKIP() << "no GPU: " << kernels::cuda::runtime_info().device_error;
  }
};

TEST_F(TensorParallelGpu, MatchesTheSingleGpuModel) {
  const Device gpu = Device::cuda(0);
  const StepResult ref = single(DType::F32, false, gpu);
  expect_same(ref, parallel(2, false, DType::F32, false, gpu), 1e-5);
  expect_same(ref, parallel(2, true, DType::F32, false, gpu), 1e-5);  // sp by samples
  expect_same(ref, parallel(3, true, DType::F32, false, gpu), 1e-5);  // by tokens, padded
  const StepResult ref_ck = single(DType::F32, true, gpu);
  expect_same(ref_ck, parallel(2, true, DType::F32, true, gpu), 1e-5);
  // 2d, 2.5d and 3d: every nd kernel path (split LayerNorm, weight block copies) on the GPU.
  expect_same(ref, parallel(4, false, DType::F32, false, gpu, "2d"), 1e-5);
  expect_same(ref, parallel(8, false, DType::F32, false, gpu, "2.5d", 2), 1e-5);
  expect_same(ref, parallel(8, false, DType::F32, false, gpu, "3d"), 1e-5);
  expect_same(single(DType::BF16, false, gpu), parallel(8, false, DType::BF16, false, gpu, "3d"),
              2e-2);
}

TEST_F(TensorParallelGpu, HalfPrecisionStaysWithinTheHalfBounds) {
  const Device gpu = Device::cuda(0);
  for (DType t : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(t));
    // Against the single-GPU run of the same dtype (bf16 2e-2, fp16 5e-3 model-level bounds).
    const double tol = t == DType::BF16 ? 2e-2 : 5e-3;
    const StepResult ref = single(t, false, gpu);
    expect_same(ref, parallel(2, false, t, false, gpu), tol);
    expect_same(ref, parallel(2, true, t, false, gpu), tol);
  }
}

TEST(TensorParallel, ColumnThenRowLinearMatchesTheWholeLinears) {
  // Colossal-AI's benchmark MLP in 1D: Linear(8, 12) column-parallel, Linear(12, 8) row-parallel.
  std::vector<float> xv(5 * 8);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::cos(0.3f * static_cast<float>(i));
  const Tensor x = Tensor::from_vector(xv, {5, 8});
  auto run = [&](ParallelLinear& a, ParallelLinear& b) {
    for (ParallelLinear* l : {&a, &b}) {
      Tensor full = Tensor::zeros(l->lin.weight.full_shape());
      rng::trunc_normal_(full, 3, l->lin.weight.init_stream(), 0.0f, 0.5f, -2.0f, 2.0f);
      l->lin.weight.value.copy_from(shard_of(full, l->lin.weight.shard));
      Tensor bfull = Tensor::zeros(l->lin.bias.full_shape());
      rng::uniform_(bfull, 3, l->lin.bias.init_stream(), -0.5f, 0.5f);
      l->lin.bias.value.copy_from(shard_of(bfull, l->lin.bias.shard));
    }
    std::unique_ptr<Cache> ca, cb;
    ForwardCtx ctx;
    Tensor y = b.forward(a.forward(x, ca, ctx), cb, ctx);
    Tensor dx = a.backward(b.backward(y, cb, ctx), ca, ctx);  // loss = |y|²/2
    return std::make_pair(y, dx);
  };
  ParallelLinear wa("fc1", 8, 12, ParallelLinear::Kind::Whole),
      wb("fc2", 12, 8, ParallelLinear::Kind::Whole);
  const auto [y_ref, dx_ref] = run(wa, wb);
  for (int T : {2, 3}) {
    auto comms = dist::make_fake_group(T);
    std::vector<std::thread> threads;
    std::vector<double> errs(T, 1.0);
    std::vector<int64_t> bytes(T, 0);
    for (int r = 0; r < T; ++r)
      threads.emplace_back([&, r] {
        TensorParallel tp(*comms[r]);
        ParallelLinear a("fc1", 8, 12, ParallelLinear::Kind::Column, &tp),
            b("fc2", 12, 8, ParallelLinear::Kind::Row, &tp);
        const auto [y, dx] = run(a, b);
        tp.drain();
        errs[r] = std::max(rel_err(y_ref, y), rel_err(dx_ref, dx));
        errs[r] = std::max(errs[r], rel_err(wb.lin.bias.grad, b.lin.bias.grad));
        errs[r] = std::max(
            errs[r], rel_err(shard_of(wa.lin.weight.grad, a.lin.weight.shard), a.lin.weight.grad));
        errs[r] = std::max(
            errs[r], rel_err(shard_of(wb.lin.weight.grad, b.lin.weight.shard), b.lin.weight.grad));
        bytes[r] = tp.comm_bytes();
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < T; ++r) {
      EXPECT_LE(errs[r], 1e-6) << "tp " << T << " rank " << r;
      // One all-reduce of the output [5, 8] forward, one of the input gradient [5, 8] backward.
      EXPECT_EQ(bytes[r], 2 * 5 * 8 * 4) << "tp " << T << " rank " << r;
    }
  }
}

// The ranks of a tensor group keep their replicated layers' parameters equal only if equal GEMMs
// give bit-equal results on every rank: a tensor group of more than one rank turns the per-process
// GEMM algorithm timing off (kernels::cuda::set_gemm_timing); one rank leaves it as it was.
TEST(TensorParallel, GroupsTurnTheGemmAlgorithmTimingOff) {
  kernels::cuda::set_gemm_timing(true);
  {
    auto one = dist::make_fake_group(1);
    TensorParallel tp(*one[0], "1d");
    EXPECT_TRUE(kernels::cuda::gemm_timing());
  }
  auto comms = dist::make_fake_group(2);
  TensorParallel tp(*comms[0], "1d");
  EXPECT_FALSE(kernels::cuda::gemm_timing());
  kernels::cuda::set_gemm_timing(true);  // the process's other tests
}
