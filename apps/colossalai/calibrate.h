// `colossalai benchmark --calibrate OUT --config F`: times the real kernels of a vit_train model on
// this device, op by op, over the shapes its layouts use, and writes the simulator's calibration
// profile (sim/cluster.h: "samples": per plan op and phase, [flops, bytes, seconds]).
//
// For every micro-batch size b in 1, 2, 4, ... up to the config's batch size (and that size) and
// every 1D tensor-parallel size T in 1, 2, 4, 8 the model splits over, the analytic plan
// (libcai's `plan`) lists each layer's ops with their FLOPs and bytes; each distinct (op, phase,
// FLOPs) is run with the shapes that give it (ops::linear_fwd/bwd, attention_fwd/bwd,
// layernorm, GELU, residual adds, patch embedding, class token and position embedding, the
// classifier, cross-entropy) and timed (synchronised, warm, repeated), then scaled so the ops of a
// layer add up to the real layer timed in place (the whole model's forward and backward back to
// back, events between the layers: time_layers in calibrate.cpp). The optimizer step
// (clipping, AdamW, zero_grad) is timed over parameter counts from 10^4 to the model's. The
// profile holds per-op and per-collective timings only: no whole-step figure feeds the simulator.
//
// With N > 1 processes (`-g N`: the launcher starts N ranks like `colossalai run`; or already
// under mpirun / `colossalai run --nproc_per_node N`) every rank also times the collectives with
// the communicator the trainer uses (MPI on CPU, NCCL on GPUs): all-reduce, reduce-scatter,
// all-gather and broadcast over the first g ranks for every group size g in 2..N, and a p2p
// send/recv between ranks 0 and 1 (one way: half a ping-pong), over message sizes in powers of
// two from 64 bytes to the largest message the model's plan moves (its fp32 gradients, a
// micro-batch's activations). Each is the slowest member's mean over repeated calls (warm, 20 ms
// or at most 50 calls). Rank 0 then times the kernels as above and writes everything, the
// collectives under "collectives": [{"op", "group", "bytes", "seconds"}, ...].
#pragma once
#include <string>
#include <vector>

#include "cai/core/tensor.h"
#include "cai/dist/communicator.h"
#include "cmd_benchmark.h"

namespace cai::dist {
class Communicator;
}
namespace cai::nn {
struct ViTConfig;
}

namespace cai::app {

struct CollectiveTiming {
  std::string op;  // all_reduce | reduce_scatter | all_gather | broadcast | p2p
  int group = 2;
  double bytes = 0, seconds = 0;
  // "" for the first `group` ranks alone (consecutive); on 4 ranks or more, all-reduces of pairs
  // of ranks N/2 apart as 2D/2.5D/3D rows and columns use them: "strided" (the pair {0, N/2}
  // alone), "strided_concurrent" (every pair {r, r + N/2} at once) and "concurrent" (every
  // consecutive pair {2k, 2k + 1} at once: groups contending for shared links); rank 0's pair's
  // time.
  std::string layout;
};

// Message sizes the calibration times for a model of `params` parameters whose largest
// activation tensor (a micro-batch's tokens × hidden) has `activation_elements` elements: powers
// of two from 64 bytes up to the first at or above the larger of their fp32 sizes.
std::vector<double> calibration_message_sizes(double params, double activation_elements);

// Every rank of `world` calls it (collective). Samples for group sizes 2..world.size() and p2p,
// the same list on every rank; `cuda` puts the buffers on this rank's current CUDA device (for a
// NCCL communicator). Progress on stderr from rank 0. The p2p samples go over channels built
// with `p2p` (the pipeline's, parallel.p2p_max_ctas).
std::vector<CollectiveTiming> time_collectives(dist::Communicator& world,
                                               const std::vector<double>& sizes, bool cuda,
                                               int cuda_device, const dist::P2POptions& p2p = {});

// SM sharing on GPUs: one real block's forward + backward at the config's batch size, timed alone
// and beside all-reduces of `bytes` that every member runs back to back on the communicator's
// stream meanwhile (as DDP's buckets run beside the backward, NCCL's kernels holding SMs). The
// profile's "overlap" entry; the simulator slows the compute of a rank by beside / alone while a
// collective or transfer of that rank is in flight.
struct OverlapTiming {
  double bytes = 0, alone_s = 0, beside_s = 0;
  int group = 0;  // 0: not measured
  // The same block on rank 1 alone and beside a posted receive (from rank 0) that waits for its
  // data through the window, as a pipeline stage's next receive does, at the batch and at its
  // halves down to a sixteenth (a pipeline's micro-batches: the GEMMs of a small one have few
  // waves, and one that wants every SM waits for those the receive's kernel holds); empty when
  // not measured. The receive's channel is built with `p2p_max_ctas` (0: NCCL's choice), the
  // block's GEMMs leave `gemm_sm_margin` SMs (both as the config's pipelines run).
  struct Posted {
    int64_t batch = 0;
    double alone_s = 0, beside_s = 0;
  };
  std::vector<Posted> posted;
  int p2p_max_ctas = 0, gemm_sm_margin = 0;
  // Every rank's block time under sustained load, all ranks computing at once as a data-parallel
  // step runs them (the GPUs of one host differ: at their power cap the clocks settle apart); by
  // rank, empty when not measured. The profile's "gpu_speeds" entry: the simulator slows the
  // compute of a rank on GPU g by gpu_block_s[g mod n] / gpu_block_s[0] (the kernels are timed
  // on rank 0).
  std::vector<double> gpu_block_s;
  double gpu_sustain_s = 0;  // how long each rank computed before its timed window
};

// Every rank of `comm` (a NCCL communicator) calls it; one block of `model` at micro-batch
// `batch` in `compute` precision runs on CUDA device `cuda_device`.
OverlapTiming time_overlap(dist::Communicator& comm, const nn::ViTConfig& model, int64_t batch,
                           DType compute, int cuda_device, const dist::P2POptions& p2p = {},
                           int posted_gemm_sm_margin = 0);

// Compute contention on CPUs: one real block's forward + backward at the config's batch size,
// timed on rank 0 alone (the other ranks waiting) and on `group` ranks at once (the processes of
// one machine computing together share its memory bandwidth and caches, as the ranks of a
// data-parallel or pipeline step do). The profile's "contention" entry; the simulator slows a
// rank's compute while other ranks of its node compute.
struct ContentionTiming {
  double alone_s = 0, together_s = 0;
  int group = 0;  // 0: not measured
  // The waits' naps (dist::WaitPolicy), the profile's "wake" entry: one test of a pending
  // collective (poll_s), and a small all-reduce on all ranks timed by the one arriving 5 ms after
  // the others, who nap by then (late_s), against the same all-reduce with all there (base_s).
  double poll_s = 0, late_s = 0, base_s = 0;
  int wake_group = 0;  // 0: not measured
};

// Every rank of `comm` (on CPUs) calls it; ranks [0, group) compute together, where group is the
// smaller of the communicator's size and the CPUs this process may run on (one rank per core,
// as the CPU clusters place them).
ContentionTiming time_contention(dist::Communicator& comm, const nn::ViTConfig& model,
                                 int64_t batch);

// Times the kernels (on CUDA device `cuda_device` when --device cuda) and writes the profile with
// `collectives` (and `overlap` / `contention` when measured) in it.
int run_calibrate(const BenchmarkOptions& opts,
                  const std::vector<CollectiveTiming>& collectives = {}, int cuda_device = 0,
                  const OverlapTiming& overlap = {}, const ContentionTiming& contention = {});

// One rank of a multi-process calibration (-g N > 1, under MPI): the collectives on every rank,
// then the kernels and the file on rank 0.
int run_calibrate_ranks(const BenchmarkOptions& opts);

}  // namespace cai::app
