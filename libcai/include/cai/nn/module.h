// Parameters, per-micro-batch activation caches and the Layer interface that pipeline stages
// and the trainer drive. A layer keeps no activations itself: forward fills a Cache the caller
// owns and backward consumes it, so a pipeline executor can hold several micro-batches in flight.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "cai/core/tensor.h"
#include "cai/ops/ops.h"

namespace cai::nn {

// How a tensor-parallel parameter is cut. Each cut views dimension `dim` of the (already cut)
// tensor as `groups` equal groups, each split into `count` contiguous parts, and keeps part
// (rank / stride) % count of every group, where rank is the tensor-parallel rank (qkv's [3·D]
// output rows are 3 groups: each rank keeps whole heads of q, k and v). Cuts apply in order; a
// later cut of the same dimension splits the part further (3D: a weight's input features by
// the output index, then by the weight index). Ranks whose cuts select the same parts hold
// copies (2.5D: the depth slices).
struct ShardCut {
  int dim = 0;
  int groups = 1;
  int count = 1;
  int stride = 1;
};
struct ShardSpec {
  std::vector<ShardCut> cuts;  // empty: whole (replicated over the tensor-parallel group, if any)
  int rank = 0, size = 1;      // the tensor-parallel rank holding this part, of `size` ranks
  Shape full;                  // the full shape (set when sharded)
  bool sharded() const { return !cuts.empty(); }
  // Part of cut i that tensor-parallel rank r keeps.
  int part(size_t i, int r) const { return (r / cuts[i].stride) % cuts[i].count; }
  // Whether ranks r and s hold the same elements.
  bool same_part(int r, int s) const;
  // Whether this rank is the lowest one holding its part (counts the part once in a norm).
  bool primary() const;
  // 1D: part `part` of `count` along `dim` (in `groups` groups), rank `part` of `count`.
  static ShardSpec split(const Shape& full, int dim, int groups, int part, int count);
};

struct Parameter {
  std::string name;  // timm's state_dict name, e.g. "blocks.0.attn.qkv.weight"
  Tensor value;
  Tensor grad;                   // same shape, accumulated by backward; zero_grad() clears it
  bool weight_decay = true;      // false for norms, biases, tokens and position embedding (timm)
  ShardSpec shard;               // tensor parallelism: which part of the timm tensor this is
  uint64_t init_stream() const;  // RNG stream of this parameter's initialisation
  Shape full_shape() const { return shard.sharded() ? shard.full : value.shape(); }
};

// Everything a forward/backward needs besides tensors: training flag and the RNG position.
// Masks depend on (seed, step, site, global sample index) only, so they do not depend on how the
// batch is split into micro-batches or over data-parallel ranks.
struct ForwardCtx {
  bool training = false;
  uint64_t seed = 0;
  uint64_t step = 0;
  int64_t sample_offset = 0;  // global index of the first sample of this (micro-)batch
  // Backward only (may be null): called by a layer's backward at the point where a collective
  // started beside it slows it least (LayerHooks::overlap_point).
  const std::function<void()>* overlap_point = nullptr;
  // Backward only: set by Layer::backward_input (split backward, zero-bubble pipelines). The
  // layer leaves its parameter-gradient work in the cache for backward_weight (WeightGrads)
  // instead of accumulating into Parameter::grad.
  bool defer_weight_grads = false;
  // RNG key for a random op at `site` (e.g. "blocks.3.drop_path1") whose elements per sample
  // are `per_sample`.
  ops::RngKey key(const std::string& site, int64_t per_sample) const;
  // The key of a slice of that op's elements: rows of `row` elements, row j starting at global
  // element begin + j·stride within the micro-batch (tensor parallelism: this rank's units of a
  // hidden layer, or its tokens of every sample).
  ops::RngKey key_slice(const std::string& site, int64_t per_sample, int64_t begin, int64_t row,
                        int64_t stride) const;
};

// Opaque per-layer activations of one micro-batch.
struct Cache {
  virtual ~Cache() = default;
  // Split backward: the parameter-gradient steps backward_input left for backward_weight, in
  // order; each holds the tensors it reads (a linear's input and output gradient, a fused pass's
  // partial sums), nothing else of the forward's activations.
  std::vector<std::function<void()>> weight_steps;
};

class Layer {
 public:
  virtual ~Layer() = default;
  virtual Tensor forward(const Tensor& x, std::unique_ptr<Cache>& cache, const ForwardCtx& ctx) = 0;
  // Returns the gradient w.r.t. the layer's input and accumulates parameter gradients.
  // Consumes (and releases) the cache.
  // A layer implements it once: under ctx.defer_weight_grads it puts its parameter gradients
  // through a WeightGrads (see there), so the same code serves the split below.
  virtual Tensor backward(const Tensor& dy, std::unique_ptr<Cache>& cache,
                          const ForwardCtx& ctx) = 0;
  // Split backward (zero-bubble pipelines: B and W). backward_input returns the input gradient
  // (with every collective of the layer's backward) and leaves the parameter-gradient work in
  // the cache, which then holds only what that work reads; no Parameter::grad changes. Then
  // backward_weight does that work (accumulating into Parameter::grad) and releases the cache.
  // Together they give backward()'s gradients (bitwise on the CPU from zeroed gradients). A layer
  // whose backward ignores ctx.defer_weight_grads does all of it in backward_input (2d/2.5d/3d).
  Tensor backward_input(const Tensor& dy, std::unique_ptr<Cache>& cache, const ForwardCtx& ctx);
  void backward_weight(std::unique_ptr<Cache>& cache);
  virtual void collect(std::vector<Parameter*>& out) = 0;
  virtual std::string name() const = 0;

  // Mixed precision (autocast-like): the dtype of the layer's GEMM/attention/activation math.
  // Parameters and their gradients stay fp32 (master weights); the residual stream between
  // layers stays fp32, so pipeline stages exchange fp32 activations whatever this is.
  DType compute_dtype = DType::F32;
  // Whether a training forward keeps its weights rounded to the compute dtype in the cache for
  // the backward (torch's autocast keeps them alike) instead of rounding them again there. ZeRO-3
  // turns it off: it frees the parameters between the passes to save their memory.
  bool keep_compute_copies = true;
};

// Building blocks owned by layers.
struct Linear {
  Parameter weight, bias;
  bool has_bias = true;
  // The weight and bias in the compute dtype for the duration of one pass (set by a
  // ComputeCopies scope, undefined otherwise): rounded once for all the GEMMs of the pass
  // instead of at each use. w() and b() give the copy when there is one, else the fp32 value.
  Tensor weight_c, bias_c;
  const Tensor& w() const { return weight_c.defined() ? weight_c : weight.value; }
  const Tensor& b() const { return bias_c.defined() ? bias_c : bias.value; }
  Linear() = default;
  Linear(const std::string& name, int64_t in, int64_t out, bool bias = true);
  // Tensor parallel (1D): part `part` of `count`. Column: the output rows split (in `groups` equal
  // groups, e.g. 3 for a fused qkv), bias split alike. Row: the input columns split, bias whole.
  static Linear column(const std::string& name, int64_t in, int64_t out, int part, int count,
                       int groups = 1);
  static Linear row(const std::string& name, int64_t in, int64_t out, int part, int count);
  // Weight and bias cut by the given specs (2D/2.5D/3D; see TensorParallel::linear_specs).
  static Linear sharded(const std::string& name, int64_t in, int64_t out, const ShardSpec& weight,
                        const ShardSpec& bias);
  void collect(std::vector<Parameter*>& out);
};

// Sets the compute-dtype copies of some Linear layers' weights and biases (one launch on a GPU)
// for its lifetime and clears them at its end. Nothing when t is fp32 or a layer already has
// copies (an enclosing scope's: a checkpointed block's recomputation inside its backward).
class ComputeCopies {
 public:
  // The copies a scope made, to hand to a later pass over the same weights (a forward's to its
  // backward: the values do not change in between).
  struct Kept {
    std::vector<Linear*> layers;
    std::vector<Tensor> weights, biases;  // biases[i] undefined for a layer without one
    bool empty() const { return layers.empty(); }
  };
  ComputeCopies(DType t, std::initializer_list<Linear*> layers);
  // Sets the kept copies (on the layers that have none) instead of rounding again.
  explicit ComputeCopies(const Kept& kept);
  ~ComputeCopies();
  ComputeCopies(const ComputeCopies&) = delete;
  ComputeCopies& operator=(const ComputeCopies&) = delete;
  Kept keep() const;

 private:
  std::vector<Linear*> set_;
};

struct LayerNorm {
  Parameter weight, bias;
  float eps = 1e-6f;
  LayerNorm() = default;
  LayerNorm(const std::string& name, int64_t dim, float eps = 1e-6f);
  // Weight and bias cut by `spec` (its full shape [dim]): 2D/2.5D/3D split the features.
  LayerNorm(const std::string& name, const ShardSpec& spec, float eps = 1e-6f);
  void collect(std::vector<Parameter*>& out);
};

// Where a layer's backward puts its parameter gradients. backward(): into Parameter::grad at
// once (fused passes write there directly). backward_input (ctx.defer_weight_grads): a step
// run() is kept for backward_weight, and into() hands a fused pass a zeroed partial that
// backward_weight adds to the gradient; finish() then shrinks the cache to those steps.
class WeightGrads {
 public:
  explicit WeightGrads(const ForwardCtx& ctx) : defer_(ctx.defer_weight_grads) {}
  bool deferred() const { return defer_; }
  // Runs f now, or keeps it for backward_weight (f must capture what it reads by value and read
  // Parameter::grad when it runs: the gradient's storage may change in between).
  void run(std::function<void()> f);
  // The tensor a pass that makes p's gradient as a by-product accumulates into: p.grad now, or a
  // zeroed fp32 partial of its shape added to p.grad by backward_weight.
  Tensor into(Parameter& p);
  // The end of the layer's backward: releases the cache, or (deferred) replaces it by one that
  // holds only the kept steps (also when there are none: backward_weight still expects it).
  void finish(std::unique_ptr<Cache>& cache);

 private:
  bool defer_;
  std::vector<std::function<void()>> steps_;
};

// ops::linear_bwd through wg: returns the input gradient; the gradients of `weight` and `bias`
// (either may be null) accumulate now or in backward_weight.
Tensor linear_bwd(WeightGrads& wg, const Tensor& x, const Tensor& w, const Tensor& dy,
                  Parameter* weight, Parameter* bias);

Parameter make_parameter(const std::string& name, const Shape& shape, bool weight_decay);
// A parameter holding the part `spec` selects of a `spec.full` tensor (whole when not sharded).
Parameter make_sharded_parameter(const std::string& name, const ShardSpec& spec, bool weight_decay);
// The shape of the part `spec` selects for tensor-parallel rank r (spec.rank by default).
Shape shard_local_shape(const ShardSpec& spec, int r = -1);

}  // namespace cai::nn
