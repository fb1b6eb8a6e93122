// Tensor parallelism of the ViT's layers: the group they are split over, how a parameter is cut,
// and the collectives the parallel layers call in their forward and backward.
//
// 1D (Megatron / Colossal-AI legacy 1D), the mode implemented today:
//  - column-parallel linears (attn.qkv, mlp.fc1): the weight's output rows are split over the T
//    ranks (qkv's [3·D] rows as 3 groups, so each rank holds whole heads of q, k and v); the
//    input is replicated, the output stays split; backward all-reduces the input gradient
//    (launched asynchronously so it overlaps the weight-gradient GEMM).
//  - row-parallel linears (attn.proj, mlp.fc2): the weight's input columns are split; the partial
//    outputs are all-reduced in forward; the bias is replicated and added once.
//  - attention: heads split over T (each rank's qkv shard is a complete H/T-head qkv).
//  - LayerNorm, patch embedding, class token and position embedding: replicated.
//  - classifier (head.weight): split on its input dimension (Colossal-AI's Classifier1D); the
//    class token's features are sliced, the partial logits all-reduced; its gradient all-gathered.
// Sequence parallelism (Megatron / Colossal-AI `split_gather`, same group as tp): between the
// parallel regions the residual stream is split along the sequence, [B, n_r, D] with rank r
// holding tokens [N·r/T, N·(r+1)/T) of every sample (197 tokens split unevenly is fine). The
// column-parallel input is all-gathered along the sequence (its backward reduce-scatters), the
// row-parallel output reduce-scattered (its backward all-gathers). LayerNorm and dropout then work
// on the rank's tokens only; the gradients of the replicated parameters that see only those
// tokens (LayerNorms, the embedding's) are summed over the group by the layer itself.
//
// Randomness: masks stay keyed by global element indices (RngKey's row/row_stride), so dropout
// and drop-path give the single-process masks under any split.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cai/core/tensor.h"
#include "cai/dist/communicator.h"
#include "cai/nn/module.h"

namespace cai::nn {

// This rank's part of `full` (CPU), and the inverse: the full tensor from every rank's part in
// rank order (CPU). Both throw naming the shapes when they do not fit the spec.
Tensor shard_of(const Tensor& full, const ShardSpec& s);
Tensor unshard(const std::vector<Tensor>& parts, const ShardSpec& s);
// Shape of part `part` of `full` cut along dim into count parts per group.
Shape shard_shape(const Shape& full, int dim, int count);

class TensorParallel {
 public:
  // `tp`: the tensor-parallel group (ranks consecutive in the mesh), kept by reference: it must
  // outlive this object. mode: "1d" (2d, 2.5d and 3d are refused with "not supported yet").
  TensorParallel(dist::Communicator& tp, std::string mode = "1d", bool sequence_parallel = false);

  int size() const { return size_; }
  int rank() const { return rank_; }
  const std::string& mode() const { return mode_; }
  bool sequence_parallel() const { return sequence_parallel_; }
  dist::Communicator& comm() const { return comm_; }
  std::string describe() const;  // "tp 2 (1d, sequence parallel)"

  // Tokens [begin, end) of N that rank r holds under sequence parallelism.
  std::pair<int64_t, int64_t> token_range(int64_t tokens, int r) const;
  std::pair<int64_t, int64_t> my_tokens(int64_t tokens) const { return token_range(tokens, rank_); }
  // Elements of every rank's tokens of a [batch, tokens, features] tensor, in rank order.
  std::vector<int64_t> token_counts(int64_t batch, int64_t tokens, int64_t features) const;
  // Columns [begin, end) of `features` that rank r holds (features divisible by the size).
  std::pair<int64_t, int64_t> feature_range(int64_t features, int r) const;

  // Collectives of the parallel layers. Reductions are sums. Half tensors on the CPU travel and
  // are reduced in fp32, rounded once (MPI has no bf16/fp16 arithmetic); on GPUs they move as
  // they are. A started operation runs while the caller goes on (on GPUs: on the communicator's
  // stream, e.g. under the weight-gradient GEMM); finish() returns its result.
  struct Pending {
    Tensor result;
    std::unique_ptr<dist::Work> work;
    DType dtype = DType::F32;  // of the result handed back
  };
  Pending all_reduce_start(const Tensor& t);  // in place when t can travel as it is
  // [B, N, F] partial sums -> this rank's tokens of their sum, [B, n_r, F].
  Pending reduce_scatter_tokens_start(const Tensor& full);
  Tensor finish(Pending p);
  Tensor all_reduce(const Tensor& t) { return finish(all_reduce_start(t)); }
  Tensor reduce_scatter_tokens(const Tensor& full) {
    return finish(reduce_scatter_tokens_start(full));
  }
  // [B, n_r, F] (this rank's tokens) -> [B, N, F], every rank's tokens in place.
  Tensor gather_tokens(const Tensor& part, int64_t tokens);
  // [B, N, F] -> this rank's tokens [B, n_r, F] (a copy; no communication).
  Tensor slice_tokens(const Tensor& full) const;
  // [B, n_r, F] -> [B, N, F] with zeros outside this rank's tokens (no communication).
  Tensor pad_tokens(const Tensor& part, int64_t tokens) const;
  // [B, F] -> this rank's columns [B, F/T] (a copy), and the inverse gather over the group.
  Tensor slice_features(const Tensor& x) const;
  Tensor gather_features(const Tensor& part);

  // An operation whose result the next kernels read: on GPUs the compute stream waits for it
  // without blocking the host, and the Work is kept (its buffers alive) until it has completed;
  // host backends wait now. At most kMaxPending operations stay pending: beyond that the oldest
  // is waited for on the host (bounded by the communicator's timeout, so a dead peer is named
  // instead of hanging).
  void complete(std::unique_ptr<dist::Work> w);
  // Host wait for every pending operation (end of a step; before reading results on the host).
  void drain();
  static constexpr size_t kMaxPending = 16;

  // Benchmarks: with profiling on, every collective is timed alone (the device synchronised
  // before it and waited for after it), so comm_seconds() is the time spent communicating if
  // nothing overlapped. Off by default (it serialises the step).
  void set_profiling(bool on) { profiling_ = on; }
  double comm_seconds() const { return comm_seconds_; }
  void reset_comm_seconds() { comm_seconds_ = 0; }
  // Bytes this rank handed to its collectives since the last reset (all-reduce: the tensor;
  // all-gather: the gathered result; reduce-scatter: the input), as sent in their dtype.
  int64_t comm_bytes() const { return comm_bytes_; }
  void reset_comm_bytes() { comm_bytes_ = 0; }

 private:
  std::deque<std::unique_ptr<dist::Work>> pending_;
  bool profiling_ = false;
  double comm_seconds_ = 0;
  int64_t comm_bytes_ = 0;
  double profile_start(const Tensor& t);
  void profile_end(dist::Work* w, const Tensor& t, double t0);
  dist::Communicator& comm_;
  std::string mode_;
  bool sequence_parallel_;
  int size_, rank_;
};

// The two halves of Megatron's 1D linear pair, shared by the ViT's blocks and ParallelLinear.
// Row-parallel forward: this rank's input columns times its weight columns, the partial outputs
// summed over the group (reduce-scattered along the sequence with sequence parallelism), the bias
// added once (by tp rank 0). tp null or of size 1: the plain linear.
Tensor row_linear_fwd(TensorParallel* tp, const Tensor& x, Linear& l);
// Column-parallel backward: the weight and bias gradients of this rank's output rows, and the
// input gradient summed over the group (reduce-scattered with sequence parallelism), its
// reduction running under the weight-gradient GEMM.
Tensor column_linear_bwd(TensorParallel* tp, const Tensor& x, Linear& l, const Tensor& dy);

// One Linear(in, out) as a layer of a parallel mode: Whole (not split), Column (1D: output
// features split, input replicated) or Row (1D: input features split, output summed over the
// group). A Column followed by a Row needs no communication between them (Megatron's MLP);
// Colossal-AI's benchmark MLP alternates them.
class ParallelLinear : public Layer {
 public:
  enum class Kind { Whole, Column, Row };
  ParallelLinear(const std::string& name, int64_t in, int64_t out, Kind kind,
                 TensorParallel* tp = nullptr);
  Tensor forward(const Tensor& x, std::unique_ptr<Cache>& cache, const ForwardCtx& ctx) override;
  Tensor backward(const Tensor& dy, std::unique_ptr<Cache>& cache, const ForwardCtx& ctx) override;
  void collect(std::vector<Parameter*>& out) override { lin.collect(out); }
  std::string name() const override { return name_; }
  Kind kind() const { return kind_; }

  Linear lin;

 private:
  std::string name_;
  Kind kind_;
  TensorParallel* tp_;
};

}  // namespace cai::nn
