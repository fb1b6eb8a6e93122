// The math of the ViT as functions with explicit forward and backward (no autograd tape).
// Each op checks shapes and devices, then dispatches to kernels/cpu or kernels/cuda by the
// tensors' device. Mixed precision: activations may be fp32, bf16 or fp16; parameters, parameter
// gradients and statistics are fp32. Half ops run the typed CUDA kernels (fp32 accumulation); on
// the CPU they compute in fp32 on the rounded operands and round the result (the reference the CUDA
// kernels are tested against). Backward functions overwrite the input gradient they return and
// ACCUMULATE into parameter gradients passed by pointer (null: not needed), so micro-batches add
// up.
#pragma once
#include <cstdint>
#include <vector>

#include "cai/core/tensor.h"

namespace cai::ops {

// y[..., N] = x[..., K] · w[N, K]^T + b[N]. b may be null. The compute dtype is x's: for half x
// the fp32 weight and bias are rounded to it; `out` is x's dtype (default) or fp32.
Tensor linear_fwd(const Tensor& x, const Tensor& w, const Tensor* b);
Tensor linear_fwd(const Tensor& x, const Tensor& w, const Tensor* b, DType out);
// A residual connection's add with the linear before it: r + x·wᵀ + b in fp32 (r fp32 of the
// output's shape; b fp32 or null). Half x: one GEMM whose epilogue adds b and r to the fp32
// accumulators (the product is not rounded to x's dtype first); fp32 x: linear_fwd, then the add.
Tensor linear_fwd_residual(const Tensor& x, const Tensor& w, const Tensor* b, const Tensor& r);
// Returns dx in x's dtype (undefined when need_dx is false); dw, db (fp32) accumulate. dy is
// converted to x's dtype when it differs.
Tensor linear_bwd(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dw, Tensor* db,
                  bool need_dx = true);
// The input half of linear_bwd without the input (the same kernels, so the same values):
// dx = dy·w in dtype `t` (x's dtype), dy and w converted to t when they differ. For a caller
// whose input is still on its way (sequence parallelism's re-gather, waited for after this GEMM).
Tensor linear_bwd_input(const Tensor& w, const Tensor& dy, DType t);
// The weight half of linear_bwd (the same kernels, so the same values): dw ([N, K]) and db ([N])
// accumulate, either may be null. Needs no weight: the deferred W of a split backward runs it
// after the pass that held the weight (zero-bubble pipelines).
void linear_bwd_weight(const Tensor& x, const Tensor& dy, Tensor* dw, Tensor* db);

// LayerNorm over the last dimension. `mean`/`rstd` ([rows]) are written for the backward.
// y has dtype `out` (default x's); dx has x's dtype; dy may be any float dtype.
Tensor layernorm_fwd(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                     Tensor* mean, Tensor* rstd);
Tensor layernorm_fwd(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                     Tensor* mean, Tensor* rstd, DType out);
Tensor layernorm_bwd(const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                     const Tensor& dy, Tensor* dgamma, Tensor* dbeta);
// layernorm_bwd + residual (x's dtype and shape), the residual stream's gradient in one pass on
// the GPU; with half_out (half a bf16/fp16 dtype) also that sum rounded to `half` (the copy the
// next GEMM reads), from the same pass. The CPU reference composes layernorm_bwd, add_ and a cast.
// With dsum (fp32, one value per feature): also the column sums of that result as the next GEMM
// takes it (the half copy when there is one), i.e. that GEMM's bias gradient, added to *dsum when
// dsum_add, else written (on the GPU from the same pass).
Tensor layernorm_bwd_add(const Tensor& x, const Tensor& gamma, const Tensor& mean,
                         const Tensor& rstd, const Tensor& dy, const Tensor& residual,
                         Tensor* dgamma, Tensor* dbeta, DType half = DType::F32,
                         Tensor* half_out = nullptr, Tensor* dsum = nullptr, bool dsum_add = true);

// LayerNorm over features split across ranks (each holds f of F columns of every row); the caller
// sums each per-row partial over the ranks of a row (all-reduce) between the steps:
//   s  = layernorm_row_sums(x, Tensor())  // [rows] Σ x                 -> all-reduce; mean = s / F
//   v  = layernorm_row_sums(x, mean)      // [rows] Σ (x − mean)²       -> all-reduce
//   y  = layernorm_split_fwd(x, gamma, beta, mean, v, F, eps, out, &rstd)  // rstd = 1/√(v/F + eps)
//   s2 = layernorm_split_bwd_sums(x, gamma, mean, rstd, dy, &dgamma, &dbeta)
//        // [rows, 2]: Σ dy·γ, Σ dy·γ·x̂ over this rank's columns -> all-reduce;
//        // dgamma += Σ_rows dy·x̂, dbeta += Σ_rows dy (accumulate; either may be null)
//   dx = layernorm_split_bwd(x, gamma, mean, rstd, dy, s2, F)
//        // rstd·(dy·γ − (s2[:,0] + x̂·s2[:,1]) / F), in x's dtype
// x̂ = (x − mean)·rstd; rows = x.numel() / f, f = x.size(-1). x and dy: fp32, bf16 or fp16;
// gamma, beta (this rank's f columns), statistics and sums: fp32. y has dtype `out`; rstd
// ([rows], fp32) is written when not null. With F = f these are layernorm_fwd/layernorm_bwd.
Tensor layernorm_row_sums(const Tensor& x, const Tensor& mean);
Tensor layernorm_split_fwd(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                           const Tensor& mean, const Tensor& sqdev, int64_t features, float eps,
                           DType out, Tensor* rstd);
Tensor layernorm_split_bwd_sums(const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                const Tensor& rstd, const Tensor& dy, Tensor* dgamma,
                                Tensor* dbeta);
Tensor layernorm_split_bwd(const Tensor& x, const Tensor& gamma, const Tensor& mean,
                           const Tensor& rstd, const Tensor& dy, const Tensor& sums,
                           int64_t features);

// GELU: the exact erf form (nn.GELU()), or its tanh approximation (nn.GELU(approximate="tanh")).
enum class Gelu { Exact, Tanh };
Tensor gelu_fwd(const Tensor& x, Gelu kind = Gelu::Exact);
Tensor gelu_bwd(const Tensor& x, const Tensor& dy, Gelu kind = Gelu::Exact);
// gelu_bwd, and the bias gradient of the linear that produced x: db (fp32, [x.size(-1)])
// += Σ over rows of the returned gradient (as rounded to x's dtype) — on the GPU in the same pass.
// y (optional): receives gelu(x) made again in the same pass (equal to gelu_fwd's), for a
// backward that did not keep the forward's output.
Tensor gelu_bwd_bias(const Tensor& x, const Tensor& dy, Gelu kind, Tensor* db, Tensor* y = nullptr);

// An MLP's first linear and its tanh GELU in one (on a GPU: cuBLASLt's bias+GELU epilogue):
// returns gelu_tanh(x·wᵀ + b) in x's dtype; `pre` receives x·wᵀ + b for the backward.
Tensor linear_gelu_fwd(const Tensor& x, const Tensor& w, const Tensor& b, Tensor* pre);
// linear_bwd of the linear AFTER that GELU (x = its output), with the gradient taken on through
// the GELU (on a GPU: the DGELU epilogue): returns d pre; dw, db accumulate.
Tensor linear_dgelu_bwd(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& pre,
                        Tensor* dw, Tensor* db);

// Multi-head attention from fused qkv[B, N, 3·D] (timm layout) -> out[B, N, D].
// `saved` receives what the backward needs besides qkv and out: the softmax [B, H, N, N], or for
// the fused half-precision GPU kernel the fp32 log-sum-exp of each score row [B, H, N].
Tensor attention_fwd(const Tensor& qkv, int64_t heads, Tensor* saved);
// With dbias (fp32, 3·D values; only where attention_bwd_sums_bias(saved)): also adds the qkv
// linear's bias gradient (the column sums of dqkv: q's from the fused kernel's own pass, k's are 0
// and v's those of dout, by the softmax's identities; kernels/cuda/flash_attention.cu).
Tensor attention_bwd(const Tensor& qkv, const Tensor& out, const Tensor& saved, const Tensor& dout,
                     int64_t heads, Tensor* dbias = nullptr);
// Whether attention_bwd with this `saved` (the fused GPU kernel's log-sum-exp) takes dbias.
bool attention_bwd_sums_bias(const Tensor& saved);

// Where a random mask comes from: element i of the op uses philox(seed, stream, offset + i).
// With row > 0 the op is a slice of a bigger logical tensor whose global indices come in runs of
// `row` elements, `row_stride` apart: element i draws at offset + (i / row)·row_stride + (i % row).
// E.g. columns [c0, c0 + f) of x[rows, F]: offset = base + c0, row = f, row_stride = F; tokens
// [t0, t0 + n) of x[B, N, D]: offset = base + t0·D, row = n·D, row_stride = N·D. Then the slice's
// mask is the matching slice of the whole tensor's. row_stride >= row (runs do not overlap).
struct RngKey {
  uint64_t seed = 0;
  uint64_t stream = 0;
  uint64_t offset = 0;
  uint64_t row = 0, row_stride = 0;  // elements; row 0: contiguous
};
// Zeroes each element with probability p and scales the kept ones by 1/(1-p); the backward
// applies the same mask to dy. Any float dtype, same dtype out.
Tensor dropout_fwd(const Tensor& x, float p, RngKey key);
Tensor dropout_bwd(const Tensor& dy, float p, RngKey key);
// Drops whole samples (dim 0) with probability p; sample i draws at key.offset + i (key.row and
// key.row_stride are ignored: the draw is per sample).
Tensor drop_path_fwd(const Tensor& x, float p, RngKey key);
Tensor drop_path_bwd(const Tensor& dy, float p, RngKey key);

// Conv2d(kernel = stride = patch) as patchify + GEMM: img[B, C, H, W], w[D, C, p, p], b[D]
// -> tokens[B, (H/p)·(W/p), D] in `compute`. `patches` receives the im2col matrix (in `compute`)
// for the backward.
Tensor patch_embed_fwd(const Tensor& img, const Tensor& w, const Tensor& b, Tensor* patches,
                       DType compute = DType::F32);
void patch_embed_bwd(const Tensor& patches, const Tensor& w, const Tensor& dy, Tensor* dw,
                     Tensor* db);

// tokens[B, P, D] (any float dtype) with cls[1, 1, D] and pos[1, P+1, D] -> fp32 [B, P+1, D].
Tensor cls_pos_fwd(const Tensor& tokens, const Tensor& cls, const Tensor& pos);
// Returns dtokens in `tokens_dtype`.
Tensor cls_pos_bwd(const Tensor& dout, Tensor* dcls, Tensor* dpos, DType tokens_dtype = DType::F32);

// x[B, N, D] -> x[:, index, :] as [B, D].
Tensor select_token_fwd(const Tensor& x, int64_t index);
Tensor select_token_bwd(const Tensor& dout, int64_t n, int64_t index);

// Sequence parallelism's rank-major staging (kernels/tokens.h): `staged` (flat, Σ or T·max of the
// ranks' [B, n_r, F] blocks, packed or padded) <-> `full` [B, N, F], for T ranks splitting the
// tokens at ⌊N·r/T⌋. Any dtype, both tensors of the same dtype and device, staged sized exactly
// (kernels::staged_numel). One pass (one kernel on a GPU, on the default stream);
// tokens_to_ranks_ zeroes the padding.
void tokens_from_ranks_(Tensor& full, const Tensor& staged, int ranks, bool padded);
void tokens_to_ranks_(Tensor& staged, const Tensor& full, int ranks, bool padded);

// dst[:, dst_token : dst_token + count, :] = src[:, src_token : src_token + count, :] for
// dst[B, Nd, F] and src[B, Ns, F] of the same dtype (fp32, bf16, fp16 or int32) and device.
// count 0 is a no-op; dst and src must not overlap. On a GPU: asynchronous on the default stream.
void copy_tokens_(Tensor& dst, int64_t dst_token, const Tensor& src, int64_t src_token,
                  int64_t count);

// Per-sample cross-entropy with label smoothing: logits[B, K], labels int32 [B] -> losses[B]
// (fp32; half logits are converted first).
Tensor cross_entropy_fwd(const Tensor& logits, const Tensor& labels, float smoothing);
// d(Σ_i w·loss_i)/dlogits with the same weight w for every sample (w = 1/B for a mean).
Tensor cross_entropy_bwd(const Tensor& logits, const Tensor& labels, float smoothing, float weight);
// The trainer's metrics where the logits live: sums[0] += Σ losses, sums[1] += the number of rows
// whose first maximum of logits is the label. sums: fp32 [2] on the logits' device (no host
// read); losses from cross_entropy_fwd.
void loss_metrics_(Tensor& sums, const Tensor& losses, const Tensor& logits, const Tensor& labels);

// Elementwise helpers. add: fp32 when either operand is fp32. add_/axpy_: y fp32, x any float
// dtype. scale_, fill_, sum_squares, count_nonfinite: fp32.
Tensor add(const Tensor& a, const Tensor& b);
void add_(Tensor& y, const Tensor& x);                // y += x
void axpy_(Tensor& y, float alpha, const Tensor& x);  // y += alpha·x
void scale_(Tensor& x, float alpha);
void fill_(Tensor& x, float value);
double sum_squares(const Tensor& x);
// Each tensor converted to dtype t (as Tensor::to): fp32 tensors on a GPU to bf16/fp16 in one
// launch per kernels::cuda::kCastMulti tensors; the rest one by one.
std::vector<Tensor> to_dtype(const std::vector<const Tensor*>& ts, DType t);
int64_t count_nonfinite(const Tensor& x);  // elements that are inf or NaN

}  // namespace cai::ops
