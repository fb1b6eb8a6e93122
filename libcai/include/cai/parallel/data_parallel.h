// Data parallelism and ZeRO as a train::Plugin over a data-parallel Communicator.
//
//  stage 0 (DDP): parameters broadcast from rank 0; gradients grouped in buckets of
//    ddp_bucket_cap_mb (in backward order); once the last layer owning one of its parameters has
//    finished its backward, each bucket's all-reduce starts at the next overlap point
//    (nn::LayerHooks::overlap_point: the next block's attention backward, or the embedding's
//    position and class-token gradients, not beside the GEMMs that follow a block's end; without
//    one, when the next layer's gradients are ready), on the
//    final micro-batch of a step. The loss of every sample is weighted by 1/global batch, so the
//    summed gradient is the average of the ranks' local-mean gradients (what PyTorch DDP computes).
//  stage 1: as DDP, but each rank keeps the optimizer state of its shard only (every parameter
//    is cut into dp contiguous chunks; rank r owns chunk r), updates its shard, then all-gathers.
//  Stage 0/1 buckets keep one flat buffer each for the whole run, as PyTorch DDP's do (the
//  gradients are full-size anyway).
//  stage 2: gradients are reduce-scattered per bucket of zero_bucket_size_in_m elements on every
//    micro-batch; each rank keeps only its shard of the gradients. A layer's full gradients are
//    created before its backward and freed when their bucket launches (packed into a rank-major
//    buffer allocated for that launch); at most zero_max_inflight_buckets reductions are in
//    flight (launching one more completes the oldest; finished ones complete as later layers
//    end their backward), and a completed bucket's buffers are dropped. So during backward the
//    full-size gradient bytes are the layer being run, one partly filled bucket and the
//    in-flight window; at its end only the window.
//  Stage 1/2 after the step: the updated shards are all-gathered bucket by bucket straight into
//    the existing parameter storage, deferred to their use (schedule::ParamGatherQueue, which
//    the simulator follows): optimizer_step issues the first zero_max_inflight_buckets gathers in
//    forward order, and each layer's forward (the train and eval hooks' before_forward) completes
//    the gathers holding its parameters and issues the next, so they run beside the next
//    forward. A completed gather is waited for by the compute stream, not the host
//    (Work::wait_on_device), then unpacked in one launch. Between the step and the next forward
//    the full values are stale: materialize_parameters() completes them for other readers
//    (HybridParallelPlugin::full_state and the pipeline's eval_batch call it).
//  Packing and unpacking (buckets, gathers, stage 1's shard gradients) is one copy_spans call
//    each: one kernel launch per bucket on a GPU instead of a device copy per parameter.
//  stage 3: parameters are sharded too (Gemini-style chunks: one chunk per layer; one gradient
//    bucket per layer, reduced as in stage 2): a layer's parameters are gathered just before its
//    forward and its backward and freed after. The all-gathers of the next zero3_prefetch layers
//    (forward: the following ones in layer order; backward: the preceding ones) are issued
//    asynchronously before the current layer computes, and the host waits only on the gather of
//    the layer about to run. Gathers issued for a use that did not come (eval, pipeline chunks)
//    are completed and discarded by optimizer_step() and materialize_parameters().
// Parameters on the CPU with an MPI (or fake) communicator, or on one GPU with an NCCL
// communicator (dist::make_nccl): buckets and shards live on the parameters' device and every
// copy is a device copy on the compute stream, so on a GPU the bucket all-reduces started from
// the backward hooks run on the communicator's stream while backward goes on. A bucket's or a
// gather's buffers are dropped only after its Work's wait() or test() has reported completion
// (the caching allocator knows no streams); gradients packed into a bucket are freed at launch,
// which the compute stream orders after the pack.
// cpu_offload (ZeRO-Offload, stage >= 1; an error with stage 0): each rank's fp32 master shard,
// its gradient shard and its optimizer state live in host memory (optimizer_parameters() returns
// host shards; HybridAdam steps them with the vectorised multi-threaded CPU Adam), and the
// parameters' device keeps only a copy of the shard in offload_dtype (bf16 under bf16 mixed
// precision), from which the gathers work (in that dtype; the full parameters they fill are
// fp32). Stage 2/3 stream the gradients: each bucket's reduced chunk is copied into page-locked
// host memory on a copy stream as soon as the bucket completes (every micro-batch) and added into
// the host gradient shard by a host thread while the backward goes on; the device chunk is freed
// once copied, so no gradient shard of the model is kept on the device. Stage 1 keeps its device
// gradient shard and copies it to the host once, in sync_gradients. After the host step the
// updated values are cast and copied back chunk by chunk (the compute stream waits for them
// before the gathers). With bf16 device copies the step writes them itself as it updates each
// weight (schedule::offload_layout's upload pieces) and, with offload_step_overlap, runs on a
// thread of its own beside the next forward: the fp32 part first, then the weights in model
// order, each gather waiting only for its own parameters; every other reader of the host state
// or the optimizer waits for the step's end (wait_host_step). See offload_lane.h. With CPU
// parameters the same path runs with host memory on both sides (no saving: it makes the path
// testable anywhere).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cai/dist/communicator.h"
#include "cai/schedule/param_gathers.h"
#include "cai/train/trainer.h"

namespace cai::parallel {

struct DataParallelConfig {
  int zero_stage = 0;                   // 0 (DDP), 1, 2, 3
  double ddp_bucket_cap_mb = 25.0;      // stage 0 and 1 buckets
  double zero_bucket_size_in_m = 12.0;  // stage 2 buckets, millions of elements
  bool cpu_offload = false;
  // cpu_offload with bf16 device copies: the host step runs on its own thread beside the next
  // forward (ZeRO-Offload's step overlapped with the next step's first layers, with no stale
  // weights: each layer's gathers wait for that layer's parameters only). false: the step ends
  // before optimizer_step returns. Same results either way.
  bool offload_step_overlap = true;
  // cpu_offload: the dtype of the shard copy kept on the parameters' device (fp32, bf16, fp16):
  // the model's compute dtype (vit_train sets it from train.precision).
  DType offload_dtype = DType::F32;
  // Start reductions during backward (else all at sync_gradients). On a GPU the first step's
  // stage 0/1 reductions wait for sync_gradients even so: its backward times the GEMM algorithms
  // (kernels::cuda::gemm_timing), which NCCL's kernels running beside would mislead.
  bool overlap = true;
  // Stage 2/3: gradient buckets whose reduce-scatter may be in flight at once; launching one more
  // first completes the oldest. Bounds the full-size gradient bytes alive during backward.
  // Stage 1/2: also the parameter all-gathers in flight after the step and in the next forward
  // (schedule::ParamGatherQueue): their buffers are this many buckets' at most.
  int zero_max_inflight_buckets = 2;
  // Stage 3: layers whose all-gather is issued ahead of use (forward: the following layers,
  // backward: the preceding ones), as FSDP's forward/backward prefetch. 0: gather on use.
  int zero3_prefetch = 1;
  // Stage 0/1: the dtype the gradient buckets are all-reduced in. BF16 (PyTorch DDP's
  // bf16_compress_hook): each rank's fp32 gradients are rounded to bf16 into the bucket, summed
  // in bf16 (every partial sum rounded, NCCL natively, MPI through a user operation), and the sum
  // is widened back into the fp32 gradients; half the bytes on the wire for about 3 significant
  // digits per element (relative error up to 2^-8 per rounding, a few per reduction).
  DType bucket_dtype = DType::F32;
  // Stage 0/1 with fp32 buckets on GPUs: all-reduce the buckets with the GPUs' copy engines
  // (dist::Communicator::enable_copy_engine_all_reduce: no SM held by the transfers or by a rank
  // waiting for a slower one) where every rank is on one host with peer access; NCCL otherwise.
  // Costs one staging region per rank of about the largest bucket (plan::step_memory counts it).
  // Not faster so far: 2 H100, ViT-B/16 batch 256, 0.5% fewer img/s than NCCL's kernels (the
  // chunk sums cost the SM time NCCL's kernels took; docs/bench/README.md).
  bool copy_engine_all_reduce = false;
  // Stage 0 with fp32 buckets on GPUs: no reduction beside the backward at all. Each bucket,
  // once final, is copied whole by the copy engines into every other rank's memory
  // (dist::Communicator::enable_copy_engine_exchange; one host with peer access, else NCCL's
  // all-reduce is used); the buckets share one allocation. sync_gradients only makes the compute
  // stream wait for the peers' copies; the sum over the ranks (rank order: the same bits on every
  // rank) is taken where the gradients are read next: the clip's sum of squares and the fused
  // Adam/AdamW update read every rank's copy (Optimizer::sum_replicas), so no pass writes the
  // sum. Other optimizers, and other readers (finish_gradients), get it summed in place first.
  // Costs (dp - 1) receive slots of the whole gradient per rank (plan::step_memory counts them)
  // and (dp - 1) gradients' bytes into each GPU per step (NCCL's ring: 2 (dp - 1) / dp), and the
  // AdamW read of the copies (2 H100, ViT-B/16: +0.12 ms a step). 2 H100, ViT-B/16 batch 256:
  // 0.3-1.1% more img/s than NCCL's all-reduce (vit_step_bench); meant for 2 GPUs: on 4 H100
  // through vit_train 93.4% scaling against NCCL's 96.2% (docs/bench/README.md).
  bool copy_engine_exchange = false;
  // Stage 0/1, 0 to 1: the buckets whose gradients are final wait at the overlap points until
  // this fraction of the gradients' elements is final, then launch together
  // (schedule::launch_held_buckets; 1: all at sync_gradients, as overlap = false). 0 (default):
  // each bucket at the next overlap point. Fewer, later bursts of traffic beside the backward:
  // on 2 H100 at their 700 W cap gradient traffic beside the backward lowered the SM clocks by
  // 2-3% whatever its volume (half the bytes: no gain; none: the no-traffic floor), and the
  // copy-engine exchange held to 0.85 ran 0.45-0.65% more img/s than unheld (vit_step_bench,
  // ViT-B/16, two calls, 3 rounds each); through vit_train with clipping it scaled 97.5% and
  // 97.2% on two 2-H100 hosts, NCCL's all-reduce 96.7-96.9% (docs/bench/README.md). Same
  // results: only when the sums start moves.
  double bucket_hold = 0.0;
};

class DataParallelPlugin : public train::Plugin {
 public:
  DataParallelPlugin(dist::Communicator& dp, DataParallelConfig cfg);
  ~DataParallelPlugin() override;

  std::string name() const override;
  int rank() const override;
  int world_size() const override;
  void setup(nn::ViT& model) override;
  // setup() for a subset of the model's layers (a pipeline stage's): only their parameters are
  // broadcast, reduced, sharded and stepped.
  void setup_layers(const std::vector<nn::Layer*>& layers);
  std::vector<nn::Parameter*> optimizer_parameters(nn::ViT& model) override;
  const nn::LayerHooks* train_hooks(bool last_micro_batch) override;
  const nn::LayerHooks* eval_hooks() override;
  // With the copy-engine exchange (uses_copy_engine_exchange) the gradients hold only this
  // rank's copy after sync_gradients: clip_grad_norm and optimizer_step read them as their sum
  // over the ranks (Optimizer::sum_replicas, where the optimizer can; else they sum them in place
  // first), and finish_gradients / sum_pending_gradients sum them in place for other readers.
  void sync_gradients(nn::ViT& model) override;
  // sync_gradients of the layers given to setup_layers (it does not read the model).
  void sync_layer_gradients();
  void finish_gradients(nn::ViT& model) override;
  void sum_pending_gradients();
  Tensor clip_grad_norm(optim::Optimizer& opt, double max_norm) override;
  void optimizer_step(optim::Optimizer& opt) override;
  void zero_grad(nn::ViT& model, optim::Optimizer& opt) override;
  double all_reduce_sum(double v) override;
  double all_reduce_max(double v) override;
  // Checkpoints of sharded state go through HybridParallelPlugin: these throw saying so.
  std::map<std::string, Tensor> full_model_state(nn::ViT& model) override;
  std::map<std::string, Tensor> full_optimizer_state(nn::ViT& model,
                                                     optim::Optimizer& opt) override;
  void load_optimizer_state(nn::ViT& model, optim::Optimizer& opt,
                            const std::map<std::string, Tensor>& full) override;
  // train::Plugin's, once a host step running beside the forward has ended.
  std::vector<train::OwnedSlice> owned_state(nn::ViT& model, optim::Optimizer& opt) override;

  // Makes every parameter's full value current, for readers other than the forward (checkpoints,
  // comparisons, an evaluation without the eval hooks). ZeRO-1/2: completes the step's deferred
  // all-gathers (the next forward would complete them layer by layer); ZeRO-3: gathers every
  // parameter (the next forward frees them again). A no-op for DDP.
  void materialize_parameters();
  // Returns once a host step running beside the forward (offload_step_overlap) has ended, and
  // rethrows its error: before reading the optimizer's state or the host shards from outside
  // (HybridParallelPlugin's checkpoints). The plugin's own methods call it where they need to.
  void wait_host_step();
  // ZeRO-1/2: whether some parameters' full values still wait for the step's deferred gather.
  bool parameters_stale() const;
  // ZeRO-1/2: the parameter-gather actions (issue or complete, bucket) since the last call, in
  // order (tests of the deferred gathers' ordering).
  std::vector<schedule::ParamGatherQueue::Action> take_param_gather_log();
  // The plugin's copies (copy_spans calls: packs, unpacks, shard updates, bf16 casts) since the
  // last call: their number and the bytes they read and wrote. The simulator's copy ops of a
  // step are tested against them (tests/sim/test_dp_copies.cpp).
  struct CopyStats {
    int64_t launches = 0;
    int64_t bytes = 0;
  };
  CopyStats take_copy_stats();
  // Bytes of parameter values held by this rank right now (ZeRO-3: its shards).
  int64_t parameter_bytes() const;
  // cpu_offload: this rank's shard (elements), the gradient bytes kept on the parameters' device
  // for it (stage 1: its fp32 shard; stage 2/3: 0, streamed), and the lane's traffic since setup:
  // reduced chunks copied to the host, their bytes, bytes uploaded after the steps (and at setup),
  // its staging buffers' host bytes, and the host's milliseconds waiting for the streamed
  // gradients (sync_gradients: also the device's backward still running), in the host optimizer
  // step (with bf16 device copies: the step staging each parameter's copy as it updates, the
  // copies sent on while the next steps), in the upload (the rest) and in the clip's sum of
  // squares. All 0 without offload.
  struct OffloadTraffic {
    int64_t shard_elements = 0, device_gradient_bytes = 0;
    int64_t chunks_down = 0, bytes_down = 0, bytes_up = 0, staging_bytes = 0;
    double flush_ms = 0, step_ms = 0, upload_ms = 0, clip_ms = 0;
    // Steps whose clip took the sums of squares the last micro-batch's host adds computed
    // (stage 2/3), not a pass over the host gradients.
    int64_t clips_streamed = 0;
    // offload_step_overlap: the host steps run beside the next forward, the parameter gathers
    // issued while one still ran (their layers' compute queued behind them, beside the step),
    // and the host's milliseconds spent waiting for them (a gather's parameters not sent yet, or
    // the step's end).
    int64_t steps_overlapped = 0, gathers_beside = 0;
    double wait_ms = 0;
  };
  OffloadTraffic offload_traffic() const;
  int num_buckets() const;
  // Whether the buckets go through the copy-engine all-reduce (asked for with
  // copy_engine_all_reduce, and the communicator could enable it).
  bool uses_copy_engine_all_reduce() const;
  // Whether the buckets go through the copy-engine gradient exchange (copy_engine_exchange, and
  // the communicator could enable it).
  bool uses_copy_engine_exchange() const;
  // ZeRO's cut: elements [begin, end) of an n-element parameter that rank r of `size` owns.
  static std::pair<int64_t, int64_t> shard_range(int64_t n, int r, int size);
  // Elements of each gradient bucket, in launch (backward) order: with zero_max_inflight_buckets,
  // what bounds the in-flight reduction buffers (tests and the memory model).
  std::vector<int64_t> bucket_numels() const;
  // Stage 0/1: how many buckets the last step's backward launched together at each point, in
  // order, the last entry being sync_gradients' (bucket_hold: fewer, larger bursts).
  std::vector<int> launch_bursts() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cai::parallel
