// The training configuration (TOML) that vit_train, colossalai (benchmark, calibrate),
// colossalai-sim and colossalai-gui share: the keys mirror Colossal-AI's ViT configs.
// Unknown keys and bad values are errors naming the key and what is allowed, never silently
// ignored.
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "cai/nn/vit.h"
#include "cai/plan/plan.h"

namespace cai::config {

struct TrainConfig {
  // [train]
  int64_t batch_size = 128;  // per process (data-parallel rank), as in Colossal-AI's configs
  int64_t num_epochs = 5;
  double learning_rate = 1e-3;
  double weight_decay = 0.05;
  double warmup_epochs = 1.0;
  int64_t gradient_accumulation = 1;
  double clip_grad_norm = 0.0;  // 0 = off
  double label_smoothing = 0.0;
  int64_t seed = 42;
  std::string optimizer = "adamw";     // sgd | adam | adamw | lamb
  double momentum = 0.9;               // sgd
  bool nesterov = false;               // sgd
  std::string lr_schedule = "cosine";  // cosine | linear | constant
  std::string schedule_by = "step";    // step | epoch
  double min_lr = 0.0;                 // cosine eta_min
  int64_t num_workers = 2;             // data loader threads
  int64_t log_interval = 0;            // steps between plain progress lines (0: 10 per epoch)
  std::string metrics_file;            // JSON lines; "" = none
  std::string kernel_profile;         // per-kernel table (Markdown, CUPTI) of some steps; "" = none
  int64_t kernel_profile_start = 10;  // profile the steps after this global step ...
  int64_t kernel_profile_steps = 5;   // ... this many of them
  int64_t max_steps_per_epoch = 0;    // 0 = whole epoch
  double peak_tflops = 0;      // one device's dense peak for MFU (0: known GPUs' own, else none)
  std::string device = "cpu";  // cpu | cuda (one GPU per process: local rank mod
                               // GPUs; several processes talk over NCCL)
  // [model]
  std::string model_name;  // a timm name as the starting point, e.g. vit_base_patch16_224
  int64_t img_size = 28, patch_size = 7, in_chans = 0, hidden_size = 64, depth = 4, num_heads = 4,
          num_classes = 10;
  double mlp_ratio = 2.0, dropout = 0.0, drop_path = 0.0;
  bool checkpoint = false;
  std::string act = "gelu";    // gelu (exact) | gelu_tanh (fused into the GEMM epilogues on a GPU)
  bool recompute_gelu = true;  // the lean backward: the GELU's output made again, not kept
  // [parallel]
  int64_t pipeline = 1, num_microbatches = 0, microbatch_size = 0, num_model_chunks = 1;
  std::string pp_style = "1f1b";  // gpipe | 1f1b | interleaved | zbh1 | zbv
  // Each backward as B (input gradient) + W (weight gradients), W right after B's SendGrad
  // (zero-bubble's split; pipeline > 1 only). zbh1 and zbv always split.
  bool split_backward = false;
  std::string partition = "uniform";      // uniform | balanced (by parameter count)
  std::vector<int> num_layers_per_stage;  // explicit partition per virtual stage
  std::string tensor_mode = "none";       // none | 1d | 2d | 2.5d | 3d
  int64_t tensor_size = 1, tensor_depth = 1;
  bool sequence_parallel = false;  // Megatron's split_gather over the tensor-parallel group
  int64_t zero_stage = 0;
  bool cpu_offload = false;
  bool offload_step_overlap = true;  // cpu_offload, bf16: the host step beside the next forward
  double ddp_bucket_cap_mb = 25.0;
  std::string gradient_comm_dtype = "fp32";  // stage 0/1 bucket all-reduce: fp32 | bf16
  bool ddp_copy_engine = false;  // stage 0/1 fp32 buckets all-reduced by the GPUs' copy engines
  double ddp_bucket_hold = 0.0;  // stage 0/1 buckets wait until this share of gradients is final
  bool ddp_exchange = false;     // stage 0 buckets copied whole between GPUs, summed at the end
  double zero_bucket_size_in_m = 12.0;
  int64_t zero3_prefetch = 1;  // ZeRO-3: layers gathered ahead of the running one
  // GPUs: SMs the GEMMs leave to NCCL's kernels beside them (kernels::cuda::set_gemm_sm_margin).
  // 0: the whole device; -1 (auto): gemm_sm_margin_for() below.
  int64_t gemm_sm_margin = -1;
  // GPUs: thread blocks each pipeline send/receive channel's NCCL kernel takes at most
  // (dist::P2POptions::max_ctas; NCCL's choice, 0, is 16 on an H200). A stage's posted receive
  // holds its blocks' SMs until its data is in, and the GEMMs beside it that want every SM wait
  // for them: ViT-B/16 pipeline 2 at 8 micro-batches 58.1 -> 55.5 ms a step with 2, 50.2 ms with
  // the GEMMs also leaving 4 SMs (docs/bench/h200x2-pipeline-p2p-ctas).
  int64_t p2p_max_ctas = 2;
  int64_t zero_max_inflight_buckets = 2;  // ZeRO-2/3 reductions (and ZeRO-1/2 gathers) in flight
  // [precision]
  std::string precision = "fp32";  // fp32 | fp16 | bf16
  double initial_scale = 65536.0, min_scale = 1.0, growth_factor = 2.0, backoff_factor = 0.5,
         max_scale = 4294967296.0;
  int64_t growth_interval = 1000, hysteresis = 2;
  // [data]
  std::string dataset = "fashion_mnist";  // fashion_mnist | mnist | cifar10 | image_folder |
                                          // synthetic
  std::string path = "/usr/share/datasets/fashion-mnist";
  int64_t train_subset = 0, eval_subset = 0;  // 0 = all
  int64_t random_crop_padding = 0;
  bool horizontal_flip = false;
  int64_t image_size = 0;  // image_folder decode size (0: model.img_size)
  // [checkpoint]
  std::string checkpoint_dir;  // "" = no checkpoints
  int64_t checkpoint_every_steps = 0, checkpoint_every_epochs = 0, checkpoint_keep_last = 0;
  double checkpoint_max_shard_mb = 5120.0;
  std::string checkpoint_export_dtype = "fp32";
  bool checkpoint_per_rank = false;  // every rank writes its own shard files (no gathering)
  // A new run may take over a checkpoint.dir holding another run (its checkpoints are deleted).
  bool checkpoint_overwrite = false;
  // synthetic: training samples (random images of the model's size, fixed labels, no I/O); the
  // evaluation set has a fifth as many (at least 1).
  int64_t synthetic_size = 50000;

  std::set<std::string> explicitly_set;  // "section.key" given in the file or by --set

  nn::ViTConfig vit() const;  // model section resolved (named defaults + overrides)
};

// Parses a TOML file and then `overrides` ("section.key=value"). Throws cai::Error naming the key.
TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides);
TrainConfig parse_config(const std::string& toml_text, const std::string& origin,
                         const std::vector<std::string>& overrides);
// Checks values against each other and this build ("not supported yet"); world = processes
// (the data-parallel size is world / (tensor size · pipeline)).
void validate(const TrainConfig& c, int world);
// The SMs the run's GEMMs leave to NCCL (parallel.gemm_sm_margin): the setting, or for auto (-1)
// twice p2p_max_ctas under a pipeline and 0 otherwise (measured: 4 beside 2 blocks, 10% faster
// than none at 8 micro-batches; other margins not tried; without a pipeline a margin only costs).
int gemm_sm_margin_for(const TrainConfig& c);
std::string to_toml(const TrainConfig& c);  // the resolved configuration
// Every key the config accepts (the table load_config validates against) as a Markdown
// reference: key, type, default, allowed values, description (`vit_train --help-config`).
std::string key_reference_markdown();
// ${NAME} expanded from the environment; an unset variable is an error naming it.
std::string expand_env(const std::string& s, const std::string& key);

// The step model's layout for this config on `world` processes (cai/plan): what --dry-run
// prints and what colossalai-sim reads.
plan::Layout plan_layout(const TrainConfig& c, int world);
// `base` with its parallel section replaced by one tensor layout (mode none/1d/2d/2.5d/3d, size,
// depth) and nothing else: pipeline 1, ZeRO 0, no sequence parallelism, offload or accumulation,
// `batch` samples per data-parallel rank. What colossalai benchmark measures and simulates per
// layout.
TrainConfig tensor_layout_config(const TrainConfig& base, const std::string& mode, int size,
                                 int depth, int64_t batch);

}  // namespace cai::config
