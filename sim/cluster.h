// Virtual clusters (hostfiles/clusters/*.toml) and calibration profiles (sim/calibrations/*.json):
// plain descriptions of hardware, loaded without SimGrid so the GUI and `colossalai benchmark` can
// read them too (library cai_cluster). Units inside the structs are SI: seconds, bytes, bytes/s,
// FLOP/s. The files carry the unit in each key's name (tflops, gib, gbytes_per_s, gbits_per_s, us).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace cai::sim {

enum class DType { F32, BF16, F16 };
// "fp32" | "bf16" | "fp16"; throws "[sim] unknown dtype ..." otherwise.
DType parse_dtype(const std::string& s);
const char* dtype_name(DType d);

struct GpuSpec {
  std::string model;
  double flops_fp32 = 0, flops_bf16 = 0, flops_fp16 = 0;  // dense peak, FLOP/s
  int64_t memory_bytes = 0;                               // usable device memory
  double memory_bandwidth = 0;                            // bytes/s
  double peak_flops(DType d) const;
};

enum class Fabric { NvSwitch, Pcie, SharedMemory };
const char* fabric_name(Fabric f);

// One link per GPU (per direction) to the node's switch: NVSwitch ports, PCIe lanes to a PCIe
// switch, or a process's share of a machine's memory copies. `latency` is GPU to GPU.
struct IntraNode {
  Fabric fabric = Fabric::NvSwitch;
  double bandwidth = 0;  // bytes/s per GPU per direction
  double latency = 0;    // seconds, one GPU to another of the node
  // Shared memory only ("placement" in the file): false ("shared") runs the processes wherever a
  // core is free, as the OS does for unbound processes; true ("pinned") binds rank r to core
  // r mod gpus_per_node (taskset or mpirun --bind-to core), ranks of one core sharing it.
  bool pinned = false;
};

// The node's NICs into a full-bisection network ("fat-tree" or "non-blocking": the same model).
struct InterNode {
  int nics_per_node = 0;
  double nic_bandwidth = 0;  // bytes/s per NIC per direction
  double latency = 0;        // seconds, NIC to NIC (a GPU to a GPU of another node adds intra)
  std::string topology = "fat-tree";
};

// GPU <-> host memory, for CPU offload (per GPU, per direction).
struct HostLink {
  double bandwidth = 0;  // bytes/s
  double latency = 0;    // seconds
  // Host memory each GPU's process may use (host_link.memory_gib_per_gpu: the host's memory over
  // its GPUs), which ZeRO-Offload's host state must fit; 0: not given (not checked).
  int64_t memory_bytes = 0;
};

struct Cluster {
  std::string name, description;
  std::string origin;  // the file it came from
  int nodes = 1, gpus_per_node = 1;
  // More ranks than GPUs (CPU clusters: processes time-sharing a core): up to this many ranks per
  // GPU, rank r on GPU r mod gpus(); ranks of one GPU exchange through a loopback link with the
  // intra-node bandwidth and latency.
  int max_ranks_per_gpu = 1;
  GpuSpec gpu;
  IntraNode intra;
  InterNode inter;  // unused (and optional in the file) when nodes == 1
  HostLink host;
  int gpus() const { return nodes * gpus_per_node; }
  int max_ranks() const { return gpus() * max_ranks_per_gpu; }
};

// Parses a cluster description. Errors: "[cluster] <origin>: <key> ..." naming the key and what
// was expected (missing keys, wrong types, values out of range, unknown keys or sections).
Cluster parse_cluster(const std::string& text, const std::string& origin);
Cluster load_cluster(const std::string& path);

// Achieved fraction of the peak per kind of compute op ("gemm", "attention", "layernorm",
// "elementwise", "optimizer", ...): a compute op of `flops` and `bytes` takes
// max(flops / (peak · flops_eff), bytes / (memory_bandwidth · bytes_eff)).
struct Efficiency {
  double flops = 0.6, bytes = 0.8;
};

// One timing of a real kernel (`colossalai benchmark --calibrate`): the plan's FLOPs and bytes
// of the op at that shape, and the measured seconds.
struct Sample {
  double flops = 0, bytes = 0, seconds = 0;
};

// One timing of a real collective (`colossalai benchmark -g N --calibrate`, with the communicator
// the trainer uses: MPI on CPU, NCCL on GPUs): `bytes` as the workload counts them (all-reduce's
// and broadcast's buffer, reduce-scatter's input, all-gather's output, a p2p message), measured
// seconds per call over a group of that size.
struct CollectiveSample {
  double bytes = 0, seconds = 0;
};

struct Calibration {
  std::string device;  // what it was measured on (informative)
  std::string origin;  // file, or "built-in defaults"
  Efficiency fallback;
  std::map<std::string, Efficiency> ops;
  // Measured kernels per plan op and phase ("attn.qkv|fwd", "attn|bwd", "optimizer|step"; for
  // the optimizer `flops` holds the elements stepped), sorted by flops.
  std::map<std::string, std::vector<Sample>> samples;
  // The efficiency of an op kind: its entry, else the fallback (`default` in the file).
  const Efficiency& of(const std::string& kind) const;
  // Seconds of op `key` doing `flops`: a sample's when one matches (within 0.1%), else
  // interpolated in log-log between the samples around it (beyond the ends: the nearest sample's
  // rate); -1 when there is no sample of `key`. *interpolated tells which (may be null).
  double seconds_of(const std::string& key, double flops, bool* interpolated) const;
  bool has_samples(const std::string& key) const {
    const auto it = samples.find(key);
    return it != samples.end() && !it->second.empty();
  }
  // Seconds of a device copy moving `bytes` (read + written) at the streaming bandwidth of the
  // profile's elementwise kernel (kCopyReference: GELU forward, one read and one write per
  // element, memory-bound): its samples' time at the same bytes, interpolated as seconds_of
  // (always interpolated); -1 without samples of it.
  static constexpr const char* kCopyReference = "mlp.act|fwd";
  double copy_seconds(double bytes) const;
  // Measured collectives per {op, group size}: op "all_reduce", "reduce_scatter", "all_gather",
  // "broadcast" or "p2p" (group size 2: a one-way send/recv), sorted by bytes. No entry: the
  // network model of the cluster file times that collective.
  std::map<std::pair<std::string, int>, std::vector<CollectiveSample>> collectives;
  // Samples of other group layouts (an entry's optional "layout": "strided", the pair {0, N/2}
  // alone; "strided_concurrent", every pair {r, r + N/2} at once; "concurrent", every consecutive
  // pair at once; rank 0's pair's time), per {op, group size, layout}, sorted by bytes. Not
  // used for timing: the flow model predicts them from the links (tests compare).
  std::map<std::tuple<std::string, int, std::string>, std::vector<CollectiveSample>>
      collective_layouts;
  // Seconds of collective `op` over `group_size` ranks moving `bytes`: a sample's when one
  // matches (within 0.1%), between samples interpolated in log-log (log-seconds linear in
  // log-bytes); -1 outside the sampled range of that {op, group size} or without samples.
  // *interpolated tells which (may be null).
  double collective_seconds(const std::string& op, int group_size, double bytes,
                            bool* interpolated) const;
  // The share of a GPU's compute that its in-flight communication takes (NCCL's kernels hold
  // SMs, also while they wait for a peer): 1 - alone / beside of the profile's "overlap" entry
  // (a block's forward + backward alone and beside all-reduces); 0 without one. The replay runs a
  // rank's compute at (1 - share) of its speed while a collective or transfer of that rank is in
  // flight.
  double overlap_share = 0;
  // The share a posted receive that waits for its data takes (a pipeline stage's next receive):
  // 1 - alone / beside of the profile's "posted" entry (a block's forward + backward alone and
  // beside such a receive; a list of them: the one at the largest batch); -1 without one (the
  // replay then takes overlap_share).
  double posted_share = -1;
  // The same by batch size, {batch, share} sorted by batch, from a "posted" list (the block at
  // the profile's batch and its halves): the GEMMs of a small micro-batch have few waves, and
  // those that want every SM wait for the ones the receive's kernel holds, so the share grows as
  // the batch shrinks. Empty with one entry.
  std::vector<std::pair<double, double>> posted_shares;
  // The posted share for compute on micro-batches of `batch` samples: posted_shares interpolated
  // linearly in log(batch), the end's beyond them; posted_share without them or when batch <= 0
  // (not known).
  double posted_share_at(double batch) const;
  // The share a waiting posted receive holds at micro-batch `batch`: posted_share_at, or without
  // a "posted" entry overlap_share (what the replay holds and its summary prints).
  double receive_share_at(double batch) const {
    const double s = posted_share_at(batch);
    return s >= 0 ? s : overlap_share;
  }
  // The channels and GEMM margin the "posted" entries were measured with (their "max_ctas" and
  // "gemm_sm_margin"; 0 where absent: NCCL's choice and the whole device, as profiles before
  // these keys ran); -1 without a "posted" entry.
  int posted_max_ctas = -1, posted_gemm_sm_margin = -1;
  // The GPUs' speeds relative to the one whose kernels the profile timed (GPU 0), from the
  // profile's "gpu_speeds" entry (one block's forward + backward on every GPU of the measuring
  // host at once, after seconds of the same load: at the power cap the clocks of one host's GPUs
  // settle apart, and a data-parallel step follows the slowest): block_seconds[g] /
  // block_seconds[0]; empty without one (every GPU as GPU 0). The replay runs a rank's GPU
  // compute on GPU g of its node at 1 / gpu_time_factor(g) of the profile's speed.
  std::vector<double> gpu_time_factors;
  // gpu_time_factors[g mod their count]: a cluster larger than the measuring host repeats the
  // measured GPUs (the spread of a larger set is not known); 1 without them.
  double gpu_time_factor(int g) const {
    return gpu_time_factors.empty()
               ? 1.0
               : gpu_time_factors[static_cast<size_t>(g) % gpu_time_factors.size()];
  }
  // On CPUs, the share of a core's speed that each other rank computing on the same node takes
  // (memory bandwidth and caches): (1 - alone / together) / (group - 1) of the profile's
  // "contention" entry (a block's forward + backward on one rank alone and on `group` ranks at
  // once); 0 without one. The replay runs a rank's compute at 1 - share × (the other ranks of its
  // node computing meanwhile) of its speed.
  double contention_share = 0;
  // On CPUs, MPI waits that nap (dist::WaitPolicy), from the profile's "wake" entry: the time of
  // one test of a pending operation (poll_seconds), and what an operation costs beyond its time
  // when its other members had waited past their polling and napped (late_seconds -
  // base_seconds, at least 0). The replay adds `wake_s` to a collective whose first member
  // arrived longer before the last than that member's wait polls, and to a receive that waited
  // longer; 0 without the entry (GPUs: NCCL's kernels wait on the device).
  double wake_poll_s = 0, wake_s = 0;
  // The host side of ZeRO-Offload (the profile's "host" entry; 0: not measured, the replay then
  // takes the cluster's host link and the placeholders of replay.h): pinned copies of 256 MiB
  // each way (bytes/s), optim::HybridAdam on host fp32 tensors over the default CPU pool
  // (elements/s) and y += x over the pool (bytes of x per second).
  double h2d_bytes_per_s = 0, d2h_bytes_per_s = 0;
  double host_adam_elements_per_s = 0, host_add_bytes_per_s = 0;
};

// Built-in placeholders until `colossalai benchmark --calibrate` measures them: gemm 0.7/0.85,
// attention 0.5/0.8, layernorm/elementwise/optimizer 0.5/0.85, anything else 0.6/0.8.
Calibration default_calibration();
// JSON: {"device": "...", "default": {"flops": f, "bytes": b}, "ops": {"gemm": {...}, ...},
// "samples": {"attn.qkv|fwd": [[flops, bytes, seconds], ...], ...},
// "collectives": [{"op": "all_reduce", "group": 2, "bytes": 1024, "seconds": 1e-5}, ...] (an
// entry may add "layout": "strided" | "strided_concurrent" | "concurrent"),
// "overlap": {"op": "all_reduce", "group": 2, "bytes": b, "alone_seconds": a,
// "beside_seconds": s}, "contention": {"group": g, "alone_seconds": a, "together_seconds": t},
// "gpu_speeds": {"sustained_seconds": s, "block_seconds": [t0, t1, ...]},
// "wake": {"group": g, "poll_seconds": p, "base_seconds": b, "late_seconds": l},
// "host": {"h2d_bytes_per_s": b, "d2h_bytes_per_s": b, "adam_elements_per_s": e,
// "add_bytes_per_s": b} (each optional: a CPU-only build measures no copies)};
// every efficiency in (0, 1],
// every sample positive; unknown keys are errors ("[calibration] <origin>: ...").
Calibration parse_calibration(const std::string& text, const std::string& origin);
Calibration load_calibration(const std::string& path);

}  // namespace cai::sim
