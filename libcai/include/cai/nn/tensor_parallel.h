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
// 2D (SUMMA), 2.5D (Tesseract) and 3D, Colossal-AI's legacy modes with its group layout (see
// docs/TENSOR_PARALLEL.md for the full description):
//  - 2D / 2.5D: q = √(T/d); tensor-parallel rank r = a + q·(b + q·k): a is the position in the
//    row group (consecutive ranks), b in the column group (stride q), k the depth slice. The
//    residual stream is [samples of batch chunk k·q + b, tokens, features of chunk a]; a linear's
//    weight block holds input features b and output features a (copies over depth), SUMMA:
//    q steps each broadcasting an input block along the row and a weight block along the column
//    (the next step's broadcasts run under the current multiply). 2D is 2.5D with d = 1.
//  - 3D: q = ∛T; r = i + q·(j + q·k); input group: vary j, weight group: vary i, output group:
//    vary k. Residual stream [batch chunk i·q + j, tokens, features of chunk k] (layout 0); a
//    linear all-gathers its input over the input group and its weight [out/q, in/q²] over the
//    weight group, multiplies, and reduce-scatters the output over the output group, which
//    leaves it in layout 1 [batch chunk i·q + k, features of chunk j]; the next linear swaps the
//    input and output groups and returns to layout 0 (qkv, fc1: 0 → 1; proj, fc2: 1 → 0).
//  - every mode: LayerNorm statistics are all-reduced over the ranks holding a row's other
//    features (the feature group); parameters cut on features only (LayerNorms, biases, the
//    embedding, the classifier) are copies over the ranks holding other batch chunks (the replica
//    group), which sum their gradients; the classifier's partial logits are summed over the
//    feature group and all-gathered over the replica group, so every rank returns the logits of
//    the whole batch (the loss is computed as without tensor parallelism).
//
// Randomness: masks stay keyed by global element indices (RngKey's row/row_stride), so dropout
// and drop-path give the single-process masks under any split.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
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

// The sub-groups of a tensor-parallel group (All: the whole group).
enum class TpGroup {
  All,
  Row,
  Col,
  Depth,
  ColDepth,
  Input,
  Weight,
  Output,
  InputWeight,
  OutputWeight
};
const char* tp_group_name(TpGroup g);  // "tp", "row", "col", "depth", "col×depth", "input", ...
// The tensor-parallel ranks of sub-group `group` (by name) that holds tensor-parallel rank `rank`
// of a `mode` group of `size` ranks (2.5d: `depth`), in the group's order: what TensorParallel
// splits, for the simulator and the analytic model. Throws naming an unknown group.
std::vector<int> tp_group_members(const std::string& mode, int size, int depth,
                                  const std::string& group, int rank);

class TensorParallel {
 public:
  // `tp`: the tensor-parallel group (ranks consecutive in the mesh), kept by reference: it must
  // outlive this object. mode: "1d", "2d", "2.5d" (with `depth`) or "3d"; the sub-groups of the
  // 2d/2.5d/3d modes are split from `tp` here (collective over it). With more than one rank it
  // turns the GEMM algorithm timing off for the process (kernels::cuda::set_gemm_timing): the
  // ranks' replicated layers must compute bit-equal results.
  TensorParallel(dist::Communicator& tp, std::string mode = "1d", bool sequence_parallel = false,
                 int depth = 1);
  ~TensorParallel();
  // Throws naming the size and listing the valid ones when `size` (and `depth`) do not fit the
  // mode: 2d squares, 2.5d size/depth a square, 3d cubes.
  static void validate_size(const std::string& mode, int size, int depth);
  // The grid of a 2d/2.5d/3d group of `size` ranks (validated as validate_size): q, the batch
  // chunks (2d/2.5d: q·depth, 3d: q²) and the parts a linear's input features are cut in (q, 3d
  // q²). 1d: all 1.
  struct Grid {
    int q = 1, chunks = 1, in_cut = 1;
  };
  static Grid grid(const std::string& mode, int size, int depth);
  // The modes and depths `size` ranks can run ("1d", "2d", "2.5d" depth d, "3d"), in
  // Colossal-AI's order; `size` 1 has none.
  struct ModeChoice {
    std::string mode;
    int depth = 1;
  };
  static std::vector<ModeChoice> modes_for(int size);

  bool nd() const { return mode_ != "1d"; }  // 2d, 2.5d or 3d
  int q() const { return q_; }
  int depth() const { return depth_; }

  int size() const { return size_; }
  int rank() const { return rank_; }
  const std::string& mode() const { return mode_; }
  bool sequence_parallel() const { return sequence_parallel_; }
  dist::Communicator& comm() const { return comm_; }
  std::string describe() const;  // "tp 2 (1d, sequence parallel)", "tp 8 (2.5d, q 2, depth 2)"

  // Sequence parallelism's cut of a [batch, tokens, features] activation (the residual stream
  // and the normalised inputs). Which rows a rank holds does not matter to the row-wise work
  // (LayerNorm, dropout, residual adds), so:
  // - by samples when the batch divides by the group: rank r holds samples [s0, s1), every token.
  //   Its block is contiguous in [B, N, F], so the gathers and reduce-scatters move the tensors
  //   themselves (no staging, no permutation, no padding);
  // - else by tokens: every sample's tokens [t0, t1) (token_range), through the rank-major
  //   staging below.
  struct SeqPart {
    bool by_samples = false;
    int64_t s0 = 0, s1 = 0, t0 = 0, t1 = 0;
    int64_t samples() const { return s1 - s0; }
    int64_t tokens() const { return t1 - t0; }
  };
  SeqPart seq_part(int64_t batch, int64_t tokens, int r) const;
  SeqPart my_seq_part(int64_t batch, int64_t tokens) const {
    return seq_part(batch, tokens, rank_);
  }
  // The part a local [b, t, F] activation is (tokens: the whole sequence's): t == tokens means by
  // samples (batch b × the group), else by tokens (batch b). Throws when neither fits.
  SeqPart seq_part_of(const Tensor& part, int64_t tokens) const;
  // Tokens [begin, end) of N that rank r holds when sequence parallelism cuts by tokens.
  std::pair<int64_t, int64_t> token_range(int64_t tokens, int r) const;
  std::pair<int64_t, int64_t> my_tokens(int64_t tokens) const { return token_range(tokens, rank_); }
  // Elements of every rank's part of a [batch, tokens, features] tensor, in rank order.
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
  // [B, N, F] partial sums -> this rank's part of their sum (seq_part: [B/T, N, F] or
  // [B, n_r, F]).
  Pending reduce_scatter_tokens_start(const Tensor& full);
  Tensor finish(Pending p);
  Tensor all_reduce(const Tensor& t) { return finish(all_reduce_start(t)); }
  Tensor reduce_scatter_tokens(const Tensor& full) {
    return finish(reduce_scatter_tokens_start(full));
  }
  // This rank's part (seq_part) -> [B, N, F], every rank's part in place; started, it runs
  // while the caller goes on and gather_tokens_finish returns the whole.
  // By samples the collectives move the tensors as they are. By tokens they move a rank-major
  // staging buffer (kernels/tokens.h): on GPUs padded (every
  // rank's block as long as the largest: NCCL's even-count collectives, no copies of their own),
  // on the CPU packed (MPI takes uneven counts); one permutation kernel per collective between
  // it and [B, N, F] (ops::tokens_from_ranks_ / tokens_to_ranks_). A gather whose part is
  // shorter than the largest copies it into a padded buffer first; a reduce-scatter's result is
  // the head of its padded output (a view).
  struct TokenGather {
    Pending p;  // result: the staged ranks' tokens until finished
    int64_t batch = 0, tokens = 0, features = 0;
    bool padded = false;
    bool by_samples = false;  // the result is [B, N, F] itself (no staging)
  };
  TokenGather gather_tokens_start(const Tensor& part, int64_t tokens);
  Tensor gather_tokens_finish(TokenGather g);
  Tensor gather_tokens(const Tensor& part, int64_t tokens) {
    return gather_tokens_finish(gather_tokens_start(part, tokens));
  }
  // Whether a token collective of `t` stages padded (a GPU tensor, or set_pad_staging(true):
  // the GPU's layout on the CPU, for tests).
  bool padded_staging(const Tensor& t) const;
  void set_pad_staging(bool on) { pad_staging_ = on; }
  // [B, N, F] -> this rank's part (seq_part; a copy; no communication).
  Tensor slice_tokens(const Tensor& full) const;
  // This rank's part -> [B, N, F] with zeros outside it (no communication).
  Tensor pad_tokens(const Tensor& part, int64_t tokens) const;
  // [B, F] -> this rank's columns [B, F/T] (a copy), and the inverse gather over the group.
  Tensor slice_features(const Tensor& x) const;
  Tensor gather_features(const Tensor& part);

  // An operation whose result the next kernels read: on GPUs the compute stream waits for it
  // without blocking the host, and the Work is kept (for its failure, not its buffers: see
  // dist::Work::wait_on_device) until it has completed;
  // host backends wait now. At most kMaxPending operations stay pending: beyond that the oldest
  // is waited for on the host (bounded by the communicator's timeout, so a dead peer is named
  // instead of hanging).
  void complete(std::unique_ptr<dist::Work> w);
  // Host wait for every pending operation (end of a step; before reading results on the host).
  void drain();
  static constexpr size_t kMaxPending = 16;

  // --- 2d / 2.5d / 3d --------------------------------------------------------------------------
  // An activation layout: which chunk of the batch (samples, split evenly in `chunks` ranges)
  // and which chunk of the features this rank holds. Layout 0: the residual stream; 1: the
  // output of qkv and fc1 (3d; the same as 0 in 2d/2.5d).
  struct Layout {
    int chunk = 0, chunks = 1;
    int feature = 0, features = 1;
    int feature_stride = 1;  // feature = (rank / feature_stride) % features
    TpGroup feature_group = TpGroup::All, replica_group = TpGroup::All;
  };
  const Layout& layout(int orient) const { return layouts_[orient & 1]; }
  // Samples [s0, s1) of `batch` in this rank's chunk of layout `orient` (throws when a chunk
  // would be empty, naming the batch and the chunk count).
  std::pair<int64_t, int64_t> batch_range(int64_t batch, int orient) const;
  // Samples of every member of the replica group of layout `orient` (in its order), and of the
  // members of `g` when g gathers / scatters along the batch (3d input and output groups).
  std::vector<int64_t> chunk_rows(int64_t batch, int orient) const;
  // Features [f0, f1) of `features` in this rank's chunk of layout `orient`.
  std::pair<int64_t, int64_t> feature_slice(int64_t features, int orient) const;
  // `full` cut on `dim` by layout `orient`'s feature chunk (in `groups` groups).
  ShardSpec feature_spec(const Shape& full, int dim, int orient, int groups = 1) const;
  // A Linear(in, out)'s weight and bias specs when its input is in layout `orient` (the output
  // in layout 1 - orient under 3d), `groups` as Linear::column's.
  std::pair<ShardSpec, ShardSpec> linear_specs(int64_t in, int64_t out, int orient,
                                               int groups = 1) const;
  // The group's communicator (All: the whole tensor-parallel group) and this rank's index in it.
  dist::Communicator& group(TpGroup g) const;
  // Collectives over a sub-group, with the same conventions as the ones above (half tensors
  // reduced in fp32 on the CPU; counted in comm_bytes() and comm_by_group()).
  Pending all_reduce_start(TpGroup g, const Tensor& t);
  Tensor all_reduce(TpGroup g, const Tensor& t) { return finish(all_reduce_start(g, t)); }
  // Every member's `part` (counts[m] elements each), concatenated in member order: flat.
  Tensor all_gather(TpGroup g, const Tensor& part, const std::vector<int64_t>& counts);
  // `staged` (Σ counts elements, member-major) -> this member's counts[me] elements of the sum.
  Pending reduce_scatter_start(TpGroup g, const Tensor& staged, const std::vector<int64_t>& counts);
  // Member `root`'s `t` into a tensor of t's shape on every member (others pass a tensor of the
  // shape and dtype to receive into).
  Pending broadcast_start(TpGroup g, const Tensor& t, int root);

  // Benchmarks: with profiling on, every collective is timed alone (the device synchronised
  // before it and waited for after it), so comm_seconds() is the time spent communicating if
  // nothing overlapped. Off by default (it serialises the step).
  void set_profiling(bool on) { profiling_ = on; }
  double comm_seconds() const { return comm_seconds_; }
  void reset_comm_seconds() { comm_seconds_ = 0; }
  // Bytes this rank handed to its collectives since the last reset (all-reduce: the tensor;
  // all-gather: the gathered result; reduce-scatter: the input), as sent in their dtype.
  int64_t comm_bytes() const { return comm_bytes_; }
  void reset_comm_bytes() {
    comm_bytes_ = 0;
    by_group_.clear();
  }
  // The same per sub-group ("tp" for the whole group): operations issued and their bytes.
  struct CommCount {
    int64_t ops = 0, bytes = 0;
  };
  const std::map<std::string, CommCount>& comm_by_group() const { return by_group_; }

 private:
  dist::DeviceWaits pending_{kMaxPending};
  bool profiling_ = false;
  bool pad_staging_ = false;
  double comm_seconds_ = 0;
  int64_t comm_bytes_ = 0;
  double profile_start(const Tensor& t);
  void profile_end(dist::Work* w, const Tensor& t, double t0);
  void count(TpGroup g, int64_t bytes);
  std::map<std::string, CommCount> by_group_;
  dist::Communicator& comm_;
  std::string mode_;
  bool sequence_parallel_;
  int size_, rank_;
  int q_ = 1, depth_ = 1;
  Layout layouts_[2];
  std::map<TpGroup, std::unique_ptr<dist::Communicator>> groups_;
};

// The 2d/2.5d/3d layers' math (tp->nd()). x and dy are [samples, tokens, features] (or
// [samples, features]) in the layouts above.
// A Linear whose input is in layout `orient`: SUMMA (2d/2.5d) or 3d's gather / reduce-scatter.
Tensor nd_linear_fwd(TensorParallel& tp, const Tensor& x, Linear& l, int orient);
// Returns the input gradient (layout `orient`); the weight and bias gradients of this rank's
// part accumulate (summed over the ranks that hold copies).
Tensor nd_linear_bwd(TensorParallel& tp, const Tensor& x, Linear& l, const Tensor& dy, int orient);
// LayerNorm over features split in layout 0: statistics summed over the feature group. The
// parameter gradients accumulate into dgamma/dbeta for this rank's samples only: the caller sums
// them over the replica group (with the layer's other such gradients, in one all-reduce).
Tensor nd_layernorm_fwd(TensorParallel& tp, const Tensor& x, const LayerNorm& ln, DType out,
                        Tensor* mean, Tensor* rstd);
Tensor nd_layernorm_bwd(TensorParallel& tp, const Tensor& x, const LayerNorm& ln,
                        const Tensor& mean, const Tensor& rstd, const Tensor& dy, Tensor* dgamma,
                        Tensor* dbeta);

// The two halves of Megatron's 1D linear pair, shared by the ViT's blocks and ParallelLinear.
// Row-parallel forward: this rank's input columns times its weight columns, the partial outputs
// summed over the group (reduce-scattered along the sequence with sequence parallelism), the bias
// added once (by tp rank 0). tp null or of size 1: the plain linear.
Tensor row_linear_fwd(TensorParallel* tp, const Tensor& x, Linear& l);
// Column-parallel backward: the weight and bias gradients of this rank's output rows, and the
// input gradient summed over the group (reduce-scattered with sequence parallelism), its
// reduction running under the weight-gradient GEMM. bias_grad false: the caller has accumulated
// the bias gradient already (the fused GELU backward). wg (null: now): where the weight and bias
// gradients go (split backward: W; the input gradient's reduction stays in B). x_gather (sequence
// parallelism's re-gather of x, started by the caller; x then unused): finished after the input
// gradient's GEMM and the start of its reduction, so the compute stream waits for it only at the
// weight-gradient GEMM, the first reader of x.
Tensor column_linear_bwd(TensorParallel* tp, const Tensor& x, Linear& l, const Tensor& dy,
                         bool bias_grad = true, WeightGrads* wg = nullptr,
                         TensorParallel::TokenGather* x_gather = nullptr);

// One Linear(in, out) as a layer of a parallel mode: Whole (not split), Column (1D: output
// features split, input replicated), Row (1D: input features split, output summed over the
// group) or Nd (2d/2.5d/3d: nd_linear_fwd with the input in layout `orient`). A Column followed
// by a Row needs no communication between them (Megatron's MLP); Colossal-AI's benchmark MLP
// alternates them (and, in 3d, the layouts: orient = layer index % 2).
class ParallelLinear : public Layer {
 public:
  enum class Kind { Whole, Column, Row, Nd };
  ParallelLinear(const std::string& name, int64_t in, int64_t out, Kind kind,
                 TensorParallel* tp = nullptr, int orient = 0);
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
  int orient_;
};

}  // namespace cai::nn
