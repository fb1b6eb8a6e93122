// Vision Transformer as timm builds it (pre-LN blocks, class token, learned position embedding,
// LayerNorm eps 1e-6, qkv bias), split into layers so a pipeline stage can own a contiguous range:
//   layer 0: Embedding (patch embedding, class token, position embedding, dropout)
//   layers 1..depth: Block i-1
//   layer depth+1: Head (final norm on the class token, classifier)
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cai/nn/module.h"
#include "cai/nn/tensor_parallel.h"

namespace cai::nn {

struct ViTConfig {
  int64_t img_size = 224;
  int64_t patch_size = 16;
  int64_t in_chans = 3;
  int64_t num_classes = 1000;
  int64_t embed_dim = 768;
  int64_t depth = 12;
  int64_t num_heads = 12;
  double mlp_ratio = 4.0;
  float drop_rate = 0.0f;       // dropout after position embedding, attention proj and MLP
  float drop_path_rate = 0.0f;  // stochastic depth, linearly increasing over blocks
  bool checkpoint = false;      // activation checkpointing of every block (recompute in backward)
  // The MLP's activation: "gelu" (exact erf, timm's default) or "gelu_tanh" (nn.GELU(approximate=
  // "tanh"), timm's act_layer="gelu_tanh"), which the GPU fuses into the fc1 GEMM's epilogue and,
  // without MLP dropout, its backward into the fc2 input-gradient GEMM.
  std::string act = "gelu";
  // Keep only fc1's output from the forward and make the GELU's output again in the backward
  // (fused into the GELU's backward pass), as torch.compile's partitioner does: the MLP's
  // largest activation (4·D per token) is not kept, for one extra write of it in the backward;
  // and release each of a block's backward tensors once consumed. On by default: on one H200
  // ViT-B/16 b256 peaks at 15.05 GiB instead of 18.73 (torch.compile 17.36) for 0.5-3.3% of its
  // img/s by host, ViT-L/16 b128 at 22.20 instead of 26.97 (25.26) for 1.4%; dp 2 on 2 H200
  // 0.4-1.6% (docs/bench/h200-gelu-table).
  bool recompute_gelu = true;

  int64_t num_patches() const { return (img_size / patch_size) * (img_size / patch_size); }
  int64_t mlp_hidden() const { return static_cast<int64_t>(embed_dim * mlp_ratio); }
  // Block i's drop-path rate (timm: linspace(0, drop_path_rate, depth)).
  float block_drop_path(int64_t i) const {
    return depth > 1 ? drop_path_rate * static_cast<float>(i) / static_cast<float>(depth - 1)
                     : drop_path_rate * 0.0f;
  }
  // Whether block i draws dropout or drop-path masks in training.
  bool block_masked(int64_t i) const { return drop_rate > 0 || block_drop_path(i) > 0; }
  // Whether a block's backward makes the GELU's output again instead of keeping it (ViT::Block):
  // recompute_gelu, the exact GELU (gelu_tanh's output comes from fc1's GEMM epilogue), no MLP
  // dropout, not checkpointed (the recompute makes it anyway) and not 2d/2.5d/3d (`nd`).
  bool gelu_recomputed(bool nd) const {
    return recompute_gelu && act != "gelu_tanh" && drop_rate == 0 && !checkpoint && !nd;
  }
  // Whether block i's residual adds ride its proj and fc2 GEMMs (ops::linear_fwd_residual): no
  // tensor parallelism (tp_size 1) and, in training, nothing (dropout, drop-path) between those
  // linears and the adds.
  bool fused_residual(int64_t i, int tp_size, bool training) const {
    return tp_size == 1 && !(training && block_masked(i));
  }
  // The parameter count of the whole (unsplit) model, without building it.
  int64_t num_parameters() const;
  // Model FLOPs of one image's forward (2 per multiply-add): the patch embedding, per block the
  // four projections and the MLP (2·N·(4·D² + 2·D·hidden)) and the attention's two products
  // (4·N²·D), the head. A training step's model FLOPs are 3× these (recompute not counted): the
  // numerator of MFU, as Megatron and PaLM count it.
  double forward_flops() const;
  void validate() const;  // throws naming the bad value
  // Whether the model splits over `tp` ranks (heads, hidden and MLP sizes divisible; with
  // sequence parallelism at least tp tokens): throws naming both numbers.
  void validate_tensor_parallel(int tp, bool sequence_parallel) const;
  // The same for a mode of TensorParallel ("1d", "2d", "2.5d", "3d"): 2d/2.5d need heads, hidden
  // and MLP sizes divisible by q, 3d the input features of every linear by q².
  void validate_tensor_parallel(const std::string& mode, int tp, int depth,
                                bool sequence_parallel) const;
  // timm names: vit_tiny_patch16_224, vit_small_patch16_224, vit_base_patch16_224,
  // vit_large_patch16_224, vit_huge_patch14_224 (and vit_huge_patch16_224 as an alias).
  static ViTConfig named(const std::string& name);
  static std::vector<std::string> names();
};

// Every layer takes the tensor-parallel group it is split over (null: none); see
// cai/nn/tensor_parallel.h for what 1D splits and what it keeps whole.
class Embedding : public Layer {
 public:
  explicit Embedding(const ViTConfig& c, TensorParallel* tp = nullptr);
  Tensor forward(const Tensor& img, std::unique_ptr<Cache>& cache, const ForwardCtx& ctx) override;
  Tensor backward(const Tensor& dy, std::unique_ptr<Cache>& cache, const ForwardCtx& ctx) override;
  void collect(std::vector<Parameter*>& out) override;
  std::string name() const override { return "embedding"; }

  Linear proj;  // patch_embed.proj: weight [D, C, p, p] (Conv2d layout), bias [D]
  Parameter cls_token, pos_embed;

 private:
  ViTConfig c_;
  TensorParallel* tp_;
};

class Block : public Layer {
 public:
  Block(const ViTConfig& c, int64_t index, float drop_path, TensorParallel* tp = nullptr);
  Tensor forward(const Tensor& x, std::unique_ptr<Cache>& cache, const ForwardCtx& ctx) override;
  Tensor backward(const Tensor& dy, std::unique_ptr<Cache>& cache, const ForwardCtx& ctx) override;
  void collect(std::vector<Parameter*>& out) override;
  std::string name() const override { return prefix_; }

  LayerNorm norm1, norm2;
  Linear qkv, proj, fc1, fc2;
  bool checkpoint = false;
  // The block after this one in the model (set by ViT): its backward's input gradient is this
  // block's output gradient, which it can round to the compute dtype in the pass that makes it
  // (the rounded copy fc2's backward here takes; see half_dy).
  Block* next = nullptr;

 private:
  struct Acts;
  // keep_gathered: keep the sequence-parallel gathered LayerNorm outputs whole (the recompute
  // inside backward, which needs them at once); otherwise only this rank's tokens are kept and
  // backward gathers them again.
  void run_forward(const Tensor& x, Acts& a, const ForwardCtx& ctx, bool keep_gathered = false);
  // The mask keys of the residual stream `local` (with sequence parallelism: this rank's part)
  // and of the MLP hidden layer (with tensor parallelism: this rank's units). part_ctx: ctx with
  // the sample offset of this rank's part when sequence parallelism cuts it by samples.
  ops::RngKey resid_key(const ForwardCtx& ctx, const std::string& site, const Tensor& local) const;
  ForwardCtx part_ctx(const ForwardCtx& ctx, const Tensor& local) const;
  ops::RngKey hidden_key(const ForwardCtx& ctx, const std::string& site) const;
  bool sp() const { return tp_ && tp_->size() > 1 && tp_->sequence_parallel(); }
  bool nd() const { return tp_ && tp_->nd(); }
  // Whether the residual adds ride proj's and fc2's GEMMs (ops::linear_fwd_residual): no tensor
  // parallelism and nothing (dropout, drop-path) between the linear and the add.
  bool fused_residual(const ForwardCtx& ctx) const {
    return !(tp_ && tp_->size() > 1) && !masked(ctx);
  }
  // Whether this pass draws dropout or drop-path masks.
  bool masked(const ForwardCtx& ctx) const {
    return ctx.training && (c_.drop_rate > 0 || drop_path_ > 0);
  }
  int tp_rank() const { return tp_ ? tp_->rank() : 0; }
  // Whether fc2's backward takes the output gradient as it comes (1d, no sequence parallelism,
  // no dropout or drop-path on it), so a rounded copy of it saves fc2 its own rounding pass.
  bool takes_dy_as_is(const ForwardCtx& ctx) const { return !nd() && !sp() && !masked(ctx); }
  // Takes the next block's copy of dy rounded to `t` when it made one for this very tensor
  // (undefined otherwise) and, in *sum, the column sums of what fc2's backward then takes (the
  // copy, or dy itself when t is fp32) when it made those: fc2's bias gradient. The stash is
  // cleared either way.
  Tensor half_dy(const Tensor& dy, DType t, Tensor* sum);
  // Set by the block before this one when its forward ran here and it takes dy as is: this
  // block's backward then also writes its input gradient rounded to the compute dtype, and its
  // column sums (the block before's fc2 bias gradient), from the LayerNorm pass that makes it.
  bool send_half_dx_ = false, send_dx_sum_ = false;
  // The last input gradient returned, its rounded copy and column sums.
  Tensor dx_, dx_half_, dx_sum_;
  // 2d/2.5d/3d: the forward and backward with the nd layers, and the mask key of this rank's
  // part (batch chunk and features) of a [batch, tokens, features] site in layout `orient`.
  void run_forward_nd(const Tensor& x, Acts& a, const ForwardCtx& ctx);
  Tensor backward_nd(const Tensor& dy, Acts& a, const ForwardCtx& ctx);
  ops::RngKey nd_key(const ForwardCtx& ctx, const std::string& site, int orient, int64_t samples,
                     int64_t features) const;
  ForwardCtx chunk_ctx(const ForwardCtx& ctx, int orient, int64_t samples) const;
  ViTConfig c_;
  std::string prefix_;
  float drop_path_;
  TensorParallel* tp_;
  int64_t heads_, hidden_;  // this rank's heads and MLP units
};

class Head : public Layer {
 public:
  explicit Head(const ViTConfig& c, TensorParallel* tp = nullptr);
  Tensor forward(const Tensor& x, std::unique_ptr<Cache>& cache, const ForwardCtx& ctx) override;
  Tensor backward(const Tensor& dy, std::unique_ptr<Cache>& cache, const ForwardCtx& ctx) override;
  void collect(std::vector<Parameter*>& out) override;
  std::string name() const override { return "head"; }

  LayerNorm norm;
  Linear head;  // tensor parallel: split on its input features (Colossal-AI's Classifier1D)

 private:
  ViTConfig c_;
  TensorParallel* tp_;
};

// timm's initialisation of one parameter by its name (what ViT::init does for each): drawn whole
// from (seed, name) and cut when it is a tensor-parallel shard. Also for layers used outside a
// ViT (colossalai benchmark's ParallelLinear and Block models).
void init_parameter(Parameter& p, uint64_t seed, const ViTConfig& c);

// Callbacks around each layer's forward and backward: where data parallelism starts gradient
// reductions as soon as a layer's gradients are final, and ZeRO-3 gathers and frees parameters.
// With a split backward (the pipeline's BackwardInput / BackwardWeight) before_backward comes
// before a layer's backward_input and after_backward after its backward_weight.
struct LayerHooks {
  std::function<void(Layer&)> before_forward, after_forward, before_backward, after_backward;
  // Inside a layer's backward (ForwardCtx::overlap_point): where a collective launched now runs
  // beside kernels of many small thread blocks (a Block's attention backward; the embedding's
  // position and class-token gradients), which give up a few SMs at a proportional cost, rather
  // than beside the GEMMs, whose persistent grids of one block per SM wait for the last SM the
  // collective holds.
  std::function<void()> overlap_point;
};

// The op of a layer's backward that its overlap point comes before (LayerHooks::overlap_point),
// by the plan's op names (plan::OpCost::op; layer_name as plan::LayerPlan::name): a block's
// attention ("attn"), the embedding's position and class-token gradients ("cls_pos"); null for
// other layers and on the 2d/2.5d/3d path (nd). Block::backward and Embedding::backward reach
// their point before that op, and the simulator (sim/from_config.cpp) launches the waiting
// buckets before it: one definition for both.
const char* backward_overlap_op(std::string_view layer_name, bool nd);

class ViT {
 public:
  // tp: the tensor-parallel group the layers are split over (null: none). Its communicator
  // must outlive the model.
  explicit ViT(const ViTConfig& c, std::shared_ptr<TensorParallel> tp = nullptr);
  const ViTConfig& config() const { return c_; }
  TensorParallel* tensor_parallel() const { return tp_.get(); }
  // Shape of the residual stream between blocks on this rank for `batch` samples:
  // [batch, tokens, dim], or with sequence parallelism [batch, this rank's tokens, dim].
  Shape residual_shape(int64_t batch) const;

  // timm's initialisation, drawn per parameter from (seed, parameter name): the same values
  // whatever the layout (a tensor-parallel shard is drawn whole and cut). Linear: trunc_normal(std
  // .02), bias 0; pos_embed trunc_normal(.02); cls_token normal(1e-6); patch projection: PyTorch's
  // Conv2d default U(±1/√fan_in); LayerNorm: 1, 0.
  void init(uint64_t seed);

  std::vector<Parameter*> parameters();
  Parameter& parameter(const std::string& name);  // throws naming the unknown name
  // Moves every parameter and gradient to `dev` (initialise on the CPU first: the RNG fills
  // host tensors). device() is where the parameters live.
  void to(Device dev);
  Device device();
  // fp32 (default), bf16 or fp16 compute for every layer (see Layer::compute_dtype).
  void set_compute_dtype(DType t);
  DType compute_dtype() const;
  int64_t num_parameters();  // held by this process (tensor parallel: its shards)
  void zero_grad();

  // The layers, in order: Embedding, Block × depth, Head.
  std::vector<std::unique_ptr<Layer>>& layers() { return layers_; }

  // Whole-model forward: img [B, C, H, W] -> logits [B, classes]; caches[i] is layer i's.
  Tensor forward(const Tensor& img, std::vector<std::unique_ptr<Cache>>& caches,
                 const ForwardCtx& ctx, const LayerHooks* hooks = nullptr);
  void backward(const Tensor& dlogits, std::vector<std::unique_ptr<Cache>>& caches,
                const ForwardCtx& ctx, const LayerHooks* hooks = nullptr);

 private:
  ViTConfig c_;
  std::shared_ptr<TensorParallel> tp_;
  std::vector<std::unique_ptr<Layer>> layers_;
};

}  // namespace cai::nn
