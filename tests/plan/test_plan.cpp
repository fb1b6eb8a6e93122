// The step model against hand-computed numbers for a tiny ViT, and against the code it models
// (parameter shapes of the tensor-parallel layers, the executor's buckets).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "cai/core/error.h"
#include "cai/dist/communicator.h"
#include "cai/nn/vit.h"
#include "cai/plan/plan.h"
#include "cai/schedule/buckets.h"
#include "cai/schedule/offload.h"

using namespace cai;

namespace {

nn::ViTConfig tiny() {
  nn::ViTConfig c;
  c.img_size = 8, c.patch_size = 4, c.in_chans = 1, c.num_classes = 10, c.embed_dim = 8;
  c.depth = 2, c.num_heads = 2, c.mlp_ratio = 4.0;
  return c;
}

const plan::LayerPlan& layer(const plan::RankPlan& r, const std::string& name) {
  for (const auto& l : r.layer_plans)
    if (l.name == name) return l;
  throw Error("no layer " + name);
}

// The copy-engine options (`flag`: parallel.ddp_copy_engine, parallel.ddp_exchange, set in `on`)
// add no region where they do not apply: on the CPU, with one rank, with bf16 buckets, with ZeRO
// stage `zero`: the same buffers with and without them.
void expect_no_region_where_it_does_not_apply(const nn::ViTConfig& c, const plan::Layout& on,
                                              bool plan::Layout::*flag, int zero) {
  for (int k = 0; k < 4; ++k) {
    plan::Layout o = on;
    if (k == 0) o.gpu = false;
    if (k == 1) o.world = 1;
    if (k == 2) o.bucket_dtype = DType::BF16;
    if (k == 3) o.zero_stage = zero;
    plan::Layout off = o;
    off.*flag = false;
    EXPECT_EQ(plan::plan_rank(plan::make_plan(c, o), 0).memory.buffers,
              plan::plan_rank(plan::make_plan(c, off), 0).memory.buffers)
        << "case " << k;
  }
}
}  // namespace

TEST(Plan, BlockFlopsAre24ND2Plus4N2D) {
  const nn::ViTConfig c = tiny();  // N = 5 tokens, D = 8
  plan::Layout l;
  l.batch = 3;
  const auto p = plan::make_plan(c, l);
  double gemm = 0;
  for (const auto& o : layer(p.stages[0], "blocks.0").ops)
    if (o.phase == plan::Phase::Forward &&
        (o.op.rfind("attn", 0) == 0 || o.op.rfind("mlp.fc", 0) == 0))
      gemm += o.flops;
  const double N = 5, D = 8;
  EXPECT_DOUBLE_EQ(gemm, 3 * (24 * N * D * D + 4 * N * N * D));
  // Tensor parallel 2: half of it per rank.
  l.world = 2, l.tp = 2;
  const auto q = plan::make_plan(c, l);
  double half = 0;
  for (const auto& o : layer(q.stages[0], "blocks.0").ops)
    if (o.phase == plan::Phase::Forward &&
        (o.op.rfind("attn", 0) == 0 || o.op.rfind("mlp.fc", 0) == 0))
      half += o.flops;
  EXPECT_DOUBLE_EQ(half, gemm / 2);
}

TEST(Plan, ParametersPerRankMatchTheTensorParallelModel) {
  const nn::ViTConfig c = tiny();
  // Hand count (D = 8, hidden 32, 4 patches of 16 pixels, 10 classes): embedding 8 + 5·8 +
  // 8·16 + 8 = 184; block 2·8 + 24·8 + 24 + 64 + 8 + 2·8 + 32·8 + 32 + 8·32 + 8 = 872; head
  // 2·8 + 80 + 10 = 106.
  plan::Layout l;
  auto p = plan::make_plan(c, l);
  EXPECT_EQ(p.stages[0].parameter_elements, 184 + 2 * 872 + 106);
  EXPECT_EQ(p.stages[0].parameter_elements, nn::ViT(c).num_parameters());
  // tp 2: qkv, proj, fc1, fc2 and the head's weight halve; LayerNorms, row biases and the
  // embedding stay whole. Against the model built split over a fake 2-rank group.
  l.world = 2, l.tp = 2;
  p = plan::make_plan(c, l);
  const int64_t block_tp = 2 * 8 + 12 * 8 + 12 + 32 + 8 + 2 * 8 + 16 * 8 + 16 + 8 * 16 + 8;
  EXPECT_EQ(p.stages[0].parameter_elements, 184 + 2 * block_tp + 16 + 40 + 10);
  auto comms = dist::make_fake_group(2);
  auto tp = std::make_shared<nn::TensorParallel>(*comms[1]);
  nn::ViT split(c, tp);
  EXPECT_EQ(plan::plan_rank(p, 1).parameter_elements, split.num_parameters());
}

TEST(Plan, ZeroShardsAndMemoryByStage) {
  const nn::ViTConfig c = tiny();
  plan::Layout l;
  l.world = 2;
  l.optimizer = "adam";
  const int64_t n = nn::ViT(c).num_parameters();
  int64_t shard = 0;  // rank 1's chunks
  for (auto* p : nn::ViT(c).parameters())
    shard += schedule::zero_chunk_size(p->value.numel(), 1, 2);
  for (int z = 0; z <= 3; ++z) {
    l.zero_stage = z;
    const auto m = plan::plan_rank(plan::make_plan(c, l), 1).memory;
    const int64_t params = z == 3 ? 0 : 4 * n, grads = z >= 2 ? 0 : 4 * n;
    EXPECT_EQ(m.parameters, params) << "zero " << z;
    EXPECT_EQ(m.gradients, grads) << "zero " << z;
    // Stage 1's shard gradients are views of the full gradients' chunks: the values alone.
    EXPECT_EQ(m.shards, z == 0 ? 0 : z == 1 ? 4 * shard : 8 * shard) << "zero " << z;
    EXPECT_EQ(m.optimizer_state, 8 * (z == 0 ? n : shard)) << "zero " << z;
    // Stage 0/1 fp32 buckets hold the gradients themselves: only the 64-element (256-byte)
    // alignment of each view, less than 64 elements a parameter.
    int64_t pad = 0, count = 0;
    for (auto* p : nn::ViT(c).parameters())
      pad += schedule::bucket_view_numel(p->value.numel()) - p->value.numel(), ++count;
    EXPECT_EQ(m.buffers, z <= 1 ? 4 * pad : 0) << "zero " << z;
    EXPECT_LE(m.buffers, 4 * 63 * count) << "zero " << z;
    EXPECT_GT(m.peak, m.persistent() + m.activations);
  }
  // Offload on a GPU: the shard's optimizer state goes to the host.
  l.zero_stage = 2, l.cpu_offload = true, l.gpu = true;
  const auto off = plan::make_plan(c, l).stages[0].memory;
  EXPECT_EQ(off.optimizer_state, 0);
  EXPECT_GT(off.host, 0);
}

// The plan's parameter list says which parameters decay as the model does (ZeRO-Offload keeps
// exactly those in the compute dtype on the device).
TEST(Plan, ParameterDecaysAreTheModels) {
  const nn::ViTConfig c = tiny();
  plan::Layout l;
  const auto r = plan::make_plan(c, l).stages[0];
  std::vector<char> planned;
  for (const auto& lp : r.layer_plans) {
    ASSERT_EQ(lp.parameter_decays.size(), lp.parameter_numels.size()) << lp.name;
    planned.insert(planned.end(), lp.parameter_decays.begin(), lp.parameter_decays.end());
  }
  std::vector<char> model;
  for (auto* p : nn::ViT(c).parameters()) model.push_back(p->weight_decay ? 1 : 0);
  EXPECT_EQ(planned, model);
  EXPECT_GT(std::count(model.begin(), model.end(), 1), 0);
}

// ZeRO-Offload (cai/schedule/offload.h, as DataParallelPlugin lays it out): the device keeps
// the shard's values (the decaying weights in the compute dtype, the rest fp32) and, stage 1
// only, its fp32 gradients: stages 2/3 have no gradient term of the shard's size on the GPU.
// The host holds fp32 values, gradients, two Adam slots and four staging slots of the largest
// bucket chunk.
TEST(Plan, OffloadDeviceAndHostMemory) {
  const nn::ViTConfig c = tiny();
  nn::ViT model(c);
  std::vector<int64_t> numels;
  std::vector<int> layer_of;
  int64_t shard = 0, rounded = 0;  // rank 1 of 2
  int layer = -1;
  for (auto* p : model.parameters()) {
    const int64_t k = schedule::zero_chunk_size(p->value.numel(), 1, 2);
    shard += k;
    if (p->weight_decay) rounded += k;
    numels.push_back(p->value.numel());
  }
  const auto r0 = plan::make_plan(c, plan::Layout{}).stages[0];
  for (const auto& lp : r0.layer_plans) {
    ++layer;
    for (size_t k = 0; k < lp.parameter_numels.size(); ++k) layer_of.push_back(layer);
  }
  ASSERT_EQ(layer_of.size(), numels.size());
  for (DType prec : {DType::BF16, DType::F32})
    for (int z = 1; z <= 3; ++z) {
      plan::Layout l;
      l.world = 2, l.gpu = true, l.precision = prec, l.zero_stage = z, l.optimizer = "adamw";
      l.zero_bucket_size_in_m = 0.0002;  // several buckets (200 elements)
      l.ddp_bucket_cap_mb = 0.001;
      const auto base = plan::plan_rank(plan::make_plan(c, l), 1).memory;
      l.cpu_offload = true;
      const auto m = plan::plan_rank(plan::make_plan(c, l), 1).memory;
      const std::string what = fmt::format("zero {} {}", z, dtype_name(prec));
      const int64_t e = static_cast<int64_t>(dtype_size(prec));
      const int64_t value = e * rounded + 4 * (shard - rounded);
      EXPECT_EQ(m.shards, value + (z == 1 ? 4 * shard : 0)) << what;
      EXPECT_EQ(m.optimizer_state, 0) << what;
      EXPECT_EQ(m.parameters, base.parameters) << what;
      EXPECT_EQ(m.gradients, base.gradients) << what;
      int64_t most = 1;
      for (const auto& b : schedule::gradient_buckets(numels, layer_of, z, l.ddp_bucket_cap_mb,
                                                      l.zero_bucket_size_in_m)) {
        int64_t k = 0;
        for (int i : b) k += schedule::zero_chunk_size(numels[i], 1, 2);
        most = std::max(most, k);
      }
      EXPECT_GT(most, 1) << what;
      EXPECT_EQ(m.host, 4 * (2 + 2) * shard + 4 * most * 4) << what;
      // Without offload the device held 8 S of fp32 values and gradients (4 S of values at stage
      // 1, whose shard gradients are views) and 8 S of Adam state; the lane holds at most two
      // reduced chunks beyond the reduction window.
      EXPECT_LE(m.peak, base.peak - (z == 1 ? 12 : 16) * shard + m.shards + 8 * most) << what;
      EXPECT_LT(m.peak, base.peak) << what;
    }
  // The CPU keeps everything in one memory: no host figure.
  plan::Layout cpu;
  cpu.world = 2, cpu.zero_stage = 2, cpu.cpu_offload = true;
  EXPECT_EQ(plan::plan_rank(plan::make_plan(c, cpu), 1).memory.host, 0);
}

// The shared description's transfers: stage 2/3 one download per bucket of its chunk, stage 1
// one of the whole gradient shard; the upload cut in copies of the largest chunk, the rounded
// part (compute dtype) first; under bf16 (step_casts) the fp32 part stepped and cast first,
// then one copy per weight, written by the host step itself, in model order.
TEST(Plan, OffloadTransfers) {
  auto field = [](const schedule::OffloadLayout& o, auto get) {
    std::vector<int64_t> v;
    for (const auto& u : o.upload) v.push_back(get(u));
    return v;
  };
  auto numel = [](const auto& u) { return u.numel; };
  auto bytes = [](const auto& u) { return u.bytes; };
  auto step = [](const auto& u) { return u.step; };
  auto cast = [](const auto& u) { return static_cast<int64_t>(u.cast); };
  auto param = [](const auto& u) { return static_cast<int64_t>(u.param); };
  const std::vector<int64_t> numels = {100, 10, 300, 7};
  const std::vector<char> rounded = {1, 0, 1, 0};
  const std::vector<std::vector<int>> buckets = {{3, 2}, {1, 0}};
  const auto o2 = schedule::offload_layout(numels, rounded, buckets, 2, 0, 1, 2, 2);
  EXPECT_EQ(o2.shard, 417);
  EXPECT_EQ(o2.rounded, 400);
  EXPECT_EQ(o2.largest_chunk, 307);
  EXPECT_EQ(o2.bucket_download, (std::vector<int64_t>{4 * 307, 4 * 110}));
  EXPECT_EQ(o2.step_download, 0);
  EXPECT_EQ(field(o2, bytes), (std::vector<int64_t>{2 * 307, 2 * 93, 4 * 17}));
  EXPECT_EQ(field(o2, numel), (std::vector<int64_t>{307, 93, 17}));
  EXPECT_EQ(field(o2, step), (std::vector<int64_t>{0, 0, 0}));  // the step comes before
  EXPECT_EQ(field(o2, cast), (std::vector<int64_t>{1, 1, 1}));
  const auto fused = schedule::offload_layout(numels, rounded, buckets, 2, 0, 1, 2, 2, true);
  EXPECT_EQ(fused.host_offset, o2.host_offset);
  EXPECT_EQ(schedule::offload_step_order(fused.host_offset, fused.host_rounded_elements),
            (std::vector<size_t>{1, 3, 0, 2}));
  EXPECT_EQ(field(fused, numel), (std::vector<int64_t>{17, 100, 300}));
  EXPECT_EQ(field(fused, bytes), (std::vector<int64_t>{4 * 17, 2 * 100, 2 * 300}));
  EXPECT_EQ(field(fused, step), (std::vector<int64_t>{17, 100, 300}));
  EXPECT_EQ(field(fused, cast), (std::vector<int64_t>{1, 0, 0}));
  EXPECT_EQ(field(fused, param), (std::vector<int64_t>{-1, 0, 2}));
  EXPECT_EQ(o2.device_value_bytes, 2 * 400 + 4 * 17);
  EXPECT_EQ(o2.device_grad_bytes, 0);
  EXPECT_EQ(o2.host_bytes(), 16 * 417 + 16 * 307);
  const auto o1 = schedule::offload_layout(numels, rounded, buckets, 1, 1, 2, 4, 2);
  EXPECT_TRUE(o1.bucket_download.empty());
  EXPECT_EQ(o1.step_download, 4 * o1.shard);
  EXPECT_EQ(o1.device_grad_bytes, 4 * o1.shard);
  EXPECT_EQ(o1.device_value_bytes, 4 * o1.shard);
  EXPECT_THROW(schedule::offload_layout(numels, {1, 0}, buckets, 2, 0, 1, 2, 2), Error);
  EXPECT_THROW(schedule::offload_layout(numels, rounded, buckets, 0, 0, 1, 2, 2), Error);
  // No buckets (the executor's call, made before its buckets exist): the host layout alone, no
  // transfer lists (they were cut in copies of one element: a 6.4B model's setup took minutes).
  const std::vector<int64_t> big = {int64_t{3} << 20, 10, int64_t{5} << 20};
  const auto o0 = schedule::offload_layout(big, {1, 0, 1}, {}, 3, 0, 1, 2, 2);
  EXPECT_EQ(o0.shard, (int64_t{8} << 20) + 10);
  EXPECT_EQ(o0.host_offset, (std::vector<int64_t>{0, int64_t{8} << 20, int64_t{3} << 20}));
  EXPECT_TRUE(o0.upload.empty());
  EXPECT_EQ(o0.staging_bytes, 0);
}

// parallel.ddp_copy_engine: each rank's staging region for the copy-engine all-reduce (256 bytes
// of flags, one chunk slot per rank and its own chunk of the sum, chunks of the largest bucket
// cut in dp parts and rounded up to 64 elements) joins the buffers, on GPUs with dp > 1 and fp32
// stage 0/1 buckets only.
TEST(Plan, CopyEngineAllReduceStagingRegionInTheBuffers) {
  const nn::ViTConfig c = tiny();
  plan::Layout l;
  l.world = 2;
  l.gpu = true;
  l.ddp_bucket_cap_mb = 0.001;  // several buckets
  const auto base = plan::plan_rank(plan::make_plan(c, l), 0).memory;
  l.ddp_copy_engine = true;
  const auto ce = plan::plan_rank(plan::make_plan(c, l), 0).memory;
  // The largest bucket, as the plugin lays it out (views padded to 64 elements).
  std::vector<int64_t> numels;
  std::vector<int> layer_of;
  const auto r0 = plan::plan_rank(plan::make_plan(c, l), 0);
  for (size_t i = 0; i < r0.layer_plans.size(); ++i)
    for (int64_t v : r0.layer_plans[i].parameter_numels)
      numels.push_back(v), layer_of.push_back(static_cast<int>(i));
  EXPECT_EQ(std::accumulate(numels.begin(), numels.end(), int64_t{0}), nn::ViT(c).num_parameters());
  int64_t most = 0;
  const auto buckets = schedule::gradient_buckets(numels, layer_of, 0, l.ddp_bucket_cap_mb, 12.0);
  EXPECT_GT(buckets.size(), 2u);
  for (const auto& b : buckets) {
    int64_t v = 0;
    for (int i : b) v += schedule::bucket_view_numel(numels[i]);
    most = std::max(most, v);
  }
  const int64_t chunk = ((most + 1) / 2 + 63) / 64 * 64;
  EXPECT_EQ(schedule::copy_engine_chunk(most, 2), chunk);
  EXPECT_EQ(ce.buffers - base.buffers, 256 + 4 * chunk * 3);
  EXPECT_EQ(ce.peak - base.peak, ce.buffers - base.buffers + (ce.allocator - base.allocator));
  // Not on the CPU, not with one rank, not with bf16 buckets or ZeRO-2.
  expect_no_region_where_it_does_not_apply(c, l, &plan::Layout::ddp_copy_engine, 2);
}

// parallel.ddp_exchange: each rank's receive slots for the copy-engine gradient exchange (256
// bytes of flags and every bucket, padded as the plugin lays them out, for each other rank) join
// the buffers, on GPUs with dp > 1 and fp32 stage 0 buckets only.
TEST(Plan, CopyEngineExchangeSlotsInTheBuffers) {
  const nn::ViTConfig c = tiny();
  plan::Layout l;
  l.gpu = true;
  l.ddp_bucket_cap_mb = 0.001;
  int64_t padded = 0;
  for (const auto& lp : plan::plan_rank(plan::make_plan(c, l), 0).layer_plans)
    for (int64_t v : lp.parameter_numels) padded += schedule::bucket_view_numel(v);
  EXPECT_GT(padded, nn::ViT(c).num_parameters());
  for (int d : {2, 4}) {
    l.world = d;
    l.ddp_exchange = false;
    const auto base = plan::plan_rank(plan::make_plan(c, l), 0);
    l.ddp_exchange = true;
    const auto ex = plan::plan_rank(plan::make_plan(c, l), 0);
    EXPECT_EQ(ex.memory.buffers - base.memory.buffers, 256 + 4 * padded * (d - 1)) << d;
    // The buckets' collectives: every rank gathers every other's whole bucket.
    const auto& ca = base.collectives;
    const auto& cb = ex.collectives;
    ASSERT_EQ(ca.size(), cb.size());
    for (size_t i = 0; i < ca.size(); ++i) {
      if (ca[i].op.rfind("bucket ", 0) != 0) continue;
      EXPECT_EQ(ca[i].kind, plan::CollectiveKind::AllReduce);
      EXPECT_EQ(cb[i].kind, plan::CollectiveKind::AllGather) << cb[i].op;
      EXPECT_EQ(cb[i].bytes, d * ca[i].bytes) << cb[i].op;
    }
    EXPECT_EQ(schedule::copy_engine_exchange_region_bytes(padded, d), 256 + 4 * padded * (d - 1));
  }
  l.world = 2;
  // Not on the CPU, not with one rank, not with bf16 buckets or ZeRO-1.
  expect_no_region_where_it_does_not_apply(c, l, &plan::Layout::ddp_exchange, 1);
}

// parallel.gradient_comm_dtype = "bf16": DDP's and ZeRO-1's flat buckets are a bf16 copy of the
// gradients (fp32 buckets are the gradients themselves, padded to 16 elements per parameter),
// and the bytes their all-reduces move are half of fp32's; the gradients themselves stay fp32.
TEST(Plan, Bf16GradientBucketsHalveTheBuffersAndTheWire) {
  const nn::ViTConfig c = tiny();
  for (int z : {0, 1}) {
    plan::Layout l;
    l.world = 2, l.zero_stage = z, l.ddp_bucket_cap_mb = 0.01;
    const auto f = plan::plan_rank(plan::make_plan(c, l), 0);
    l.bucket_dtype = DType::BF16;
    const auto h = plan::plan_rank(plan::make_plan(c, l), 0);
    int64_t n = 0, padded = 0;
    for (auto* p : nn::ViT(c).parameters()) {
      n += p->value.numel();
      padded += schedule::bucket_view_numel(p->value.numel());
    }
    EXPECT_EQ(h.memory.buffers, 2 * n) << "zero " << z;
    EXPECT_EQ(f.memory.buffers, 4 * (padded - n)) << "zero " << z;
    EXPECT_EQ(h.memory.gradients, f.memory.gradients) << "zero " << z;
    int64_t fb = 0, hb = 0;
    for (const auto& k : f.collectives)
      if (k.kind == plan::CollectiveKind::AllReduce) fb += k.bytes;
    for (const auto& k : h.collectives)
      if (k.kind == plan::CollectiveKind::AllReduce) hb += k.bytes;
    EXPECT_GT(fb, 0) << "zero " << z;
    EXPECT_EQ(hb, 2 * n) << "zero " << z;
    EXPECT_EQ(fb, 4 * padded) << "zero " << z;
  }
}

TEST(Plan, ActivationsFollowCheckpointingAndThePipeline) {
  nn::ViTConfig c = tiny();
  c.recompute_gelu = false;  // the GELU's output kept first (the default makes it again)
  plan::Layout l;
  l.batch = 4;
  const auto full = plan::make_plan(c, l).stages[0];
  // Block::Acts for 4 samples, N = 5, D = 8, 2 heads, hidden 32 (fp32): x, h (N·D each),
  // 4 statistics (N each), a, b (N·D), qkv (3·N·D), probs (2·N²), o (N·D), f, m (N·32 each); m
  // not with model.recompute_gelu (the backward makes it again).
  const int64_t per = 4 * 4 * (2 * 40 + 4 * 5 + 2 * 40 + 120 + 2 * 25 + 40 + 2 * 160);
  EXPECT_EQ(layer(full, "blocks.0").saved, per);
  c.recompute_gelu = true;
  EXPECT_EQ(layer(plan::make_plan(c, l).stages[0], "blocks.0").saved, per - 4 * 4 * 160);
  c.recompute_gelu = false;
  c.checkpoint = true;
  EXPECT_EQ(layer(plan::make_plan(c, l).stages[0], "blocks.0").saved, 4 * 4 * 40);
  c.checkpoint = false;
  // 1F1B on 2 stages, 4 micro-batches: stage 0 holds 2 in flight, stage 1 one (the validator's).
  l.world = 2, l.pp = 2, l.num_microbatches = 4;
  const auto pp = plan::make_plan(c, l);
  EXPECT_EQ(pp.peak_micro_batches, (std::vector<int>{2, 1}));
  EXPECT_EQ(pp.stages[0].memory.micro_batches_in_flight, 2);
  EXPECT_EQ(pp.stages[1].memory.micro_batches_in_flight, 1);
  l.pp_style = "gpipe";
  EXPECT_EQ(plan::make_plan(c, l).stages[0].memory.micro_batches_in_flight, 4);
}

// Zero-bubble schedules: a BackwardInput keeps what the weight gradients read (the layers'
// caches and output gradients) until its BackwardWeight, so ZB-H1's last stage holds as many
// micro-batches as the first (the validator's peaks); ZB-V places stage 0's chunks at both ends.
TEST(Plan, ZeroBubbleHoldsWeightInputsAndPlacesChunksInAV) {
  const nn::ViTConfig c = tiny();  // 4 layers: embedding, 2 blocks, head
  plan::Layout l;
  l.batch = 4, l.world = 2, l.pp = 2, l.num_microbatches = 4;
  const auto one = plan::make_plan(c, l);
  l.pp_style = "zbh1";
  const auto h1 = plan::make_plan(c, l);
  EXPECT_EQ(h1.schedule.name, "zbh1");
  EXPECT_EQ(h1.peak_micro_batches, (std::vector<int>{2, 2}));
  EXPECT_EQ(h1.stages[1].memory.micro_batches_in_flight, 2);
  EXPECT_EQ(one.stages[1].memory.micro_batches_in_flight, 1);
  // Stage 1 holds a second micro-batch's caches for its pending W: more activations, a higher
  // peak; stage 0 (1F1B's two in flight either way) no less than 1F1B's.
  EXPECT_GT(h1.stages[1].memory.activations, one.stages[1].memory.activations);
  EXPECT_GT(h1.stages[1].memory.peak, one.stages[1].memory.peak);
  EXPECT_GE(h1.stages[0].memory.peak, one.stages[0].memory.peak);
  EXPECT_EQ(h1.stages[0].memory.micro_batches_in_flight, 2);
  l.pp_style = "zbv", l.chunks = 2;
  const auto zv = plan::make_plan(c, l);
  EXPECT_EQ(zv.stages[0].layers, (std::vector<int>{0, 3}));  // virtual stages 0 and 3
  EXPECT_EQ(zv.stages[1].layers, (std::vector<int>{1, 2}));
  for (int s = 0; s < 2; ++s) {
    EXPECT_LE(zv.peak_micro_batches[s], 4) << s;  // 2p chunks
    EXPECT_GT(zv.stages[s].memory.peak, 0) << s;
  }
}

// What a split backward's BackwardInput leaves for the BackwardWeight (nn::Block::backward with
// WeightGrads deferred): each linear's input and output gradient as its weight-gradient step
// captured them, and the fp32 partial sums of the fused passes; not the rest of the cache or dy.
TEST(Plan, SplitBackwardHoldsWhatTheWeightStepsCaptured) {
  nn::ViTConfig c = tiny();  // d 8, MLP 32, 5 tokens, attention not fused (head dim 4)
  c.recompute_gelu = true;   // the lean backward (the default)
  plan::Layout l;
  l.batch = 2;
  const int64_t R = 2 * 5, d = 8, h = 32;
  const auto cpu = plan::make_plan(c, l);
  // fp32: fc2's g is dy itself, proj's gy is gh; m (made again by the GELU's backward), b, gf,
  // o, a, gq; the LayerNorms', fc1's and proj's bias partial sums.
  const int64_t partials = 4 * (4 * d + h + d);
  for (const char* name : {"blocks.0", "blocks.1"})
    EXPECT_EQ(layer(cpu.stages[0], name).weight_held,
              4 * (R * h + R * d + R * d + R * h + R * d + R * d + R * d + 3 * R * d) + partials)
        << name;
  EXPECT_EQ(layer(cpu.stages[0], "head").weight_held, 2 * d * 4 + 2 * d * 4);  // z, partials
  const auto& emb = layer(cpu.stages[0], "embedding");
  EXPECT_EQ(emb.weight_held, emb.saved + emb.output);  // the patches and dy: all of it in W
  EXPECT_EQ(emb.split_backward_extra, 0);
  // bf16 on a GPU: g is the next block's rounded copy (blocks.0) or dy rounded once (blocks.1),
  // gy proj's rounded copy of gh: all in bf16.
  l.gpu = true;
  l.precision = DType::BF16;
  const auto gpu = plan::make_plan(c, l);
  for (const char* name : {"blocks.0", "blocks.1"}) {
    const auto& b = layer(gpu.stages[0], name);
    EXPECT_EQ(b.weight_held,
              2 * (R * h + R * d + R * d + R * h + R * d + R * d + R * d + 3 * R * d) + partials)
        << name;
    // Less than the cache and dy the BackwardInput releases (the weight copies included).
    EXPECT_LT(b.weight_held, b.saved + b.output) << name;
    EXPECT_GE(b.split_backward_extra, b.backward_extra) << name;
  }
}

TEST(Plan, CollectivesOfATensorParallelBlock) {
  const nn::ViTConfig c = tiny();
  plan::Layout l;
  l.world = 2, l.tp = 2, l.batch = 3;
  const auto p = plan::make_plan(c, l);
  const auto& b = layer(p.stages[0], "blocks.0");
  ASSERT_EQ(b.collectives.size(), 4u);  // proj, fc2 forward; fc1, qkv input grads
  for (const auto& k : b.collectives) {
    EXPECT_EQ(k.kind, plan::CollectiveKind::AllReduce);
    EXPECT_EQ(k.bytes, 3 * 5 * 8 * 4);
  }
  l.sequence_parallel = true;
  const auto q = plan::make_plan(c, l);
  const auto& s = layer(q.stages[0], "blocks.0");
  // + 4 token gathers, the LayerNorm gradients, and in backward fc1's and qkv's inputs gathered
  // again (the forward keeps this rank's tokens of them).
  ASSERT_EQ(s.collectives.size(), 11u);
  int again = 0;
  for (const auto& k : s.collectives)
    if (k.phase == plan::Phase::Backward && k.kind == plan::CollectiveKind::AllGather &&
        k.op.find("input again") != std::string::npos)
      ++again;
  EXPECT_EQ(again, 2);
  // Checkpointed, the recompute keeps them whole: no gather again.
  nn::ViTConfig ck = c;
  ck.checkpoint = true;
  const auto r = plan::make_plan(ck, l);
  for (const auto& k : layer(r.stages[0], "blocks.0").collectives)
    EXPECT_EQ(k.op.find("input again"), std::string::npos) << k.op;
}

// The device copies around sequence parallelism's collectives (bytes read + written per block,
// and launches): every gather / reduce-scatter of tokens permutes the whole staging buffer in one
// kernel (TensorParallel, ops::tokens_from_ranks_ / tokens_to_ranks_); on a GPU the buffer is
// padded (5 tokens on 2 ranks: blocks of 3), a rank holding fewer (rank 0: 2) copies its part
// into a padded buffer before a gather, and a reduce-scatter writes the padded buffer; in bf16
// the two fp32 output gradients are cast on the rank's part before they are gathered. Backward
// gathers the normalised inputs again unless checkpointed.
TEST(Plan, SequenceParallelTokenCopies) {
  const nn::ViTConfig c = tiny();
  plan::Layout l;
  l.world = 2, l.tp = 2, l.batch = 3, l.sequence_parallel = true;
  auto sum = [](const plan::LayerPlan& b, const char* op, plan::Phase ph, bool calls = false) {
    int64_t n = 0;
    for (const auto& o : b.ops)
      if (o.op == op && o.phase == ph) {
        EXPECT_EQ(o.flops, 0.0) << op;
        n += calls ? o.calls : o.bytes_read + o.bytes_written;
      }
    return n;
  };
  const int64_t full = 3 * 5 * 8, part = 3 * 2 * 8, most = 3 * 3 * 8;  // rank 0: tokens 0-1 of 5
  {  // CPU, fp32: packed staging, one permutation per collective
    const auto p = plan::make_plan(c, l);
    const auto& b = layer(p.stages[0], "blocks.0");
    EXPECT_EQ(sum(b, "sp.tokens_copy", plan::Phase::Forward), 3 * 2 * full * 4);
    EXPECT_EQ(sum(b, "sp.tokens_copy_out", plan::Phase::Forward), 2 * full * 4);
    EXPECT_EQ(sum(b, "sp.tokens_copy", plan::Phase::Backward), 6 * 2 * full * 4);
    EXPECT_EQ(sum(b, "sp.tokens_copy", plan::Phase::Forward, true), 3);
    EXPECT_EQ(sum(b, "sp.tokens_copy_out", plan::Phase::Forward, true), 1);
    EXPECT_EQ(sum(b, "sp.tokens_copy", plan::Phase::Backward, true), 6);
  }
  l.gpu = true, l.precision = DType::BF16;
  const int64_t e = 2;
  const int64_t gather = 2 * full * e + 2 * part * e, scatter = full * e + 2 * most * e;
  const auto pg = plan::make_plan(c, l);
  const auto& b = layer(pg.stages[0], "blocks.0");
  EXPECT_EQ(sum(b, "sp.tokens_copy", plan::Phase::Forward), 2 * gather + scatter);
  EXPECT_EQ(sum(b, "sp.tokens_copy_out", plan::Phase::Forward), scatter);
  EXPECT_EQ(sum(b, "sp.tokens_copy", plan::Phase::Backward),
            4 * gather + 2 * scatter + 2 * part * (4 + e));
  // Launches: a gather 2 (the part padded, the permutation), a reduce-scatter 1, a cast 1.
  EXPECT_EQ(sum(b, "sp.tokens_copy", plan::Phase::Forward, true), 2 * 2 + 1);
  EXPECT_EQ(sum(b, "sp.tokens_copy_out", plan::Phase::Forward, true), 1);
  EXPECT_EQ(sum(b, "sp.tokens_copy", plan::Phase::Backward, true), 4 * 2 + 2 + 2);
  // Rank 1 holds the largest count (3 tokens): its gathers send the part as it is.
  const plan::RankPlan r1 = plan::plan_rank(pg, 1);
  const auto& b1 = layer(r1, "blocks.0");
  EXPECT_EQ(sum(b1, "sp.tokens_copy", plan::Phase::Forward),
            2 * 2 * full * e + full * e + 2 * most * e);
  EXPECT_EQ(sum(b1, "sp.tokens_copy", plan::Phase::Forward, true), 3);
  // Checkpointed: the recompute runs the gathers and proj's reduce-scatter, not fc2's; backward
  // gathers nothing again.
  nn::ViTConfig cc = c;
  cc.checkpoint = true;
  const auto pc = plan::make_plan(cc, l);
  const auto& r = layer(pc.stages[0], "blocks.0");
  EXPECT_EQ(sum(r, "sp.tokens_copy", plan::Phase::Recompute), 2 * gather + scatter);
  EXPECT_EQ(sum(r, "sp.tokens_copy_out", plan::Phase::Recompute), 0);
  EXPECT_EQ(sum(r, "sp.tokens_copy", plan::Phase::Backward),
            2 * gather + 2 * scatter + 2 * part * (4 + e));
  // Without sequence parallelism: none.
  l.sequence_parallel = false;
  const auto pn = plan::make_plan(c, l);
  const auto& n = layer(pn.stages[0], "blocks.0");
  EXPECT_EQ(sum(n, "sp.tokens_copy", plan::Phase::Forward), 0);
  EXPECT_EQ(sum(n, "sp.tokens_copy", plan::Phase::Backward), 0);
}

// A micro-batch divisible by the group is cut by samples (TensorParallel::seq_part): the
// collectives move the tensors as they are, so the only copies left are bf16's casts of the two
// fp32 output gradients (this rank's part); the residual stream holds b/T samples of every token.
TEST(Plan, SequenceParallelBySamplesCopiesOnlyTheCasts) {
  const nn::ViTConfig c = tiny();
  plan::Layout l;
  l.world = 2, l.tp = 2, l.batch = 4, l.sequence_parallel = true;
  auto copies = [](const plan::LayerPlan& b, plan::Phase ph) {
    int64_t n = 0, calls = 0;
    for (const auto& o : b.ops)
      if (o.op.rfind("sp.tokens_copy", 0) == 0 && o.phase == ph) {
        n += o.bytes_read + o.bytes_written;
        calls += o.calls;
      }
    return std::make_pair(n, calls);
  };
  const int64_t full = 4 * 5 * 8;
  const auto p = plan::make_plan(c, l);
  const auto& b = layer(p.stages[0], "blocks.0");
  EXPECT_EQ(copies(b, plan::Phase::Forward).first, 0);
  EXPECT_EQ(copies(b, plan::Phase::Backward).first, 0);
  EXPECT_EQ(b.input, 2 * 5 * 8 * 4);  // 2 of the 4 samples, fp32
  l.gpu = true, l.precision = DType::BF16;
  const auto pg = plan::make_plan(c, l);
  const auto& bg = layer(pg.stages[0], "blocks.0");
  EXPECT_EQ(copies(bg, plan::Phase::Forward).first, 0);
  EXPECT_EQ(copies(bg, plan::Phase::Backward), std::make_pair(2 * full / 2 * (4 + 2), int64_t{2}));
  // The class tokens of every rank's samples are gathered, not summed.
  bool gathered = false;
  for (const auto& k : layer(pg.stages[0], "head").collectives)
    if (k.op == "class token") gathered = k.kind == plan::CollectiveKind::AllGather;
  EXPECT_TRUE(gathered);
}

// SUMMA's work beside its GEMMs (nd_linear_fwd / _bwd), bytes read + written per block: forward
// q - 1 fp32 adds of the partial outputs (half: + the fp32 partials, the weight and output
// casts); backward q input-gradient partials staged, q weight-gradient partials zeroed, the
// reduced weight gradient added.
TEST(Plan, SummaLinearsMemoryWork) {
  plan::Layout l;
  l.world = 4, l.tp = 4, l.tp_mode = "2d", l.batch = 4;
  auto bytes = [](const plan::StepPlan& p, plan::Phase ph) {
    int64_t n = 0;
    for (const auto& o : layer(p.stages[0], "blocks.0").ops)
      if (o.op == "nd.copies" && o.phase == ph) n += o.bytes_read + o.bytes_written;
    return n;
  };
  // q = 2: a rank's 2 samples (10 rows), local blocks I x O: qkv 4 x 12, proj 4 x 4, fc1 4 x 16,
  // fc2 16 x 4 (Σ O = 36, Σ rows·I = 280, Σ O·I = 192).
  const auto p = plan::make_plan(tiny(), l);
  EXPECT_EQ(bytes(p, plan::Phase::Forward), 3 * 10 * 36 * 4);
  EXPECT_EQ(bytes(p, plan::Phase::Backward), 2 * 2 * 280 * 4 + (2 + 3) * 192 * 4);
  l.gpu = true, l.precision = DType::BF16;
  const auto h = plan::make_plan(tiny(), l);
  EXPECT_EQ(bytes(h, plan::Phase::Forward),
            192 * 6 + 2 * 10 * 36 * 2 + 3 * 10 * 36 * 4 + 10 * 36 * 6);
  // + the weight casts, the fp32 output gradients of fc2 (10 x 4) and proj (10 x 4) cast.
  EXPECT_EQ(bytes(h, plan::Phase::Backward),
            192 * 6 + 2 * 10 * 4 * 6 + 2 * 2 * 280 * 2 + (2 + 3) * 192 * 4);
}

TEST(Plan, BadLayoutsAreNamed) {
  plan::Layout l;
  l.world = 3, l.pp = 2;
  try {
    plan::make_plan(tiny(), l);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 processes are not divisible"), std::string::npos);
  }
  l.world = 2, l.zero_stage = 2;
  EXPECT_THROW(plan::make_plan(tiny(), l), Error);
}

// ZeRO-3's gather window (DataParallelPlugin::fetch, the plan's replay and the simulator use it):
// layer 1 has no parameters; one layer prefetched in the direction of travel.
TEST(GatherWindow, PrefetchesTheNextLayersWithParameters) {
  using cai::schedule::GatherWindow;
  using V = std::vector<int>;
  GatherWindow w({1, 0, 1, 1, 1}, 1);
  EXPECT_EQ(w.fetch(0, false), (V{0, 2}));
  EXPECT_EQ(w.pending(), (V{2}));
  EXPECT_EQ(w.fetch(1, false), V{});  // nothing to gather
  EXPECT_EQ(w.fetch(2, false), (V{3}));
  EXPECT_EQ(w.fetch(3, false), (V{4}));
  EXPECT_EQ(w.fetch(4, false), V{});
  EXPECT_TRUE(w.pending().empty());
  EXPECT_EQ(w.fetch(4, true), (V{4, 3}));  // backward: the preceding layers
  EXPECT_EQ(w.fetch(3, true), (V{2}));
  EXPECT_EQ(w.fetch(2, true), (V{0}));
  EXPECT_EQ(w.fetch(0, true), V{});
  EXPECT_TRUE(w.pending().empty());

  GatherWindow none({1, 1, 1}, 0);  // no prefetch: each layer's own gather, when it is needed
  for (int i = 0; i < 3; ++i) EXPECT_EQ(none.fetch(i, false), (V{i}));

  GatherWindow two({1, 0, 1, 1, 1}, 2);
  EXPECT_EQ(two.fetch(0, false), (V{0, 2, 3}));
  EXPECT_EQ(two.fetch(2, false), (V{4}));
  EXPECT_EQ(two.pending(), (V{3, 4}));
  two.clear();  // the optimizer step drains what was issued ahead
  EXPECT_EQ(two.fetch(3, false), (V{3, 4}));
  EXPECT_THROW(two.fetch(5, false), cai::Error);
  EXPECT_THROW(GatherWindow({1}, -1), cai::Error);
}

// ZeRO-2/3's reductions in flight: a bucket's previous reduction first, then the oldest while the
// window is full.
TEST(InflightWindow, WaitsForTheOldestWhenFull) {
  using cai::schedule::InflightWindow;
  using V = std::vector<int>;
  InflightWindow w(2);
  EXPECT_EQ(w.launch(0), V{});
  EXPECT_EQ(w.launch(1), V{});
  EXPECT_EQ(w.launch(2), (V{0}));
  EXPECT_EQ(w.inflight(), (V{1, 2}));
  w.finish(1);  // found complete early
  w.finish(7);  // not in flight: nothing
  EXPECT_EQ(w.launch(3), V{});
  EXPECT_EQ(w.launch(2), (V{2}));  // the next micro-batch's bucket 2: its previous one first
  EXPECT_EQ(w.inflight(), (V{3, 2}));
  EXPECT_EQ(w.launch(4), (V{3}));
  InflightWindow one(1);
  EXPECT_EQ(one.launch(0), V{});
  EXPECT_EQ(one.launch(1), (V{0}));
  EXPECT_THROW(InflightWindow(0), cai::Error);
}

// nn::backward_overlap_op names an op of the plan: the executor's layers reach their overlap point
// before that op's backward and the simulator launches the waiting buckets there, so the name
// must be one of the layer's backward ops (a block's and the embedding's; none for the head or on
// the 2d/2.5d/3d path).
TEST(Plan, OverlapPointOpIsABackwardOpOfItsLayer) {
  const nn::ViTConfig c = tiny();
  plan::Layout l;
  l.batch = 3;
  const auto p = plan::make_plan(c, l);
  int layers_with_point = 0;
  for (const auto& lp : p.stages[0].layer_plans) {
    const char* at = nn::backward_overlap_op(lp.name, false);
    EXPECT_EQ(nn::backward_overlap_op(lp.name, true), nullptr) << lp.name;
    if (!at) continue;
    ++layers_with_point;
    const auto n = std::count_if(lp.ops.begin(), lp.ops.end(), [&](const plan::OpCost& o) {
      return o.phase == plan::Phase::Backward && o.op == at;
    });
    EXPECT_EQ(n, 1) << lp.name << ": no single backward op " << at;
  }
  EXPECT_EQ(layers_with_point, 1 + c.depth);  // the embedding and every block
}
