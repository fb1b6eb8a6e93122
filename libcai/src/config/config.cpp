#define TOML_HEADER_ONLY 1
#include "cai/config/config.h"

#include <algorithm>

#include <fmt/format.h>

#include <toml++/toml.h>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "cai/core/error.h"
#include "cai/core/toml_text.h"
#include "cai/data/data.h"
#include "key_docs.h"

namespace cai::config {

namespace {

enum class Kind { Int, Float, Bool, String, IntList };

struct Field {
  Field(std::string k, Kind kd, void* p, std::vector<std::string> ch = {}, double l = -1e300,
        double h = 1e300)
      : key(std::move(k)), kind(kd), ptr(p), choices(std::move(ch)), lo(l), hi(h) {}
  std::string key;  // "section.key"
  Kind kind;
  void* ptr;
  std::vector<std::string> choices;  // strings: allowed values (empty: any)
  double lo, hi;                     // numbers: allowed range
};

std::vector<Field> fields(TrainConfig& c) {
  const double inf = 1e300;
  return {
      {"train.batch_size", Kind::Int, &c.batch_size, {}, 1, inf},
      {"train.num_epochs", Kind::Int, &c.num_epochs, {}, 1, inf},
      {"train.learning_rate", Kind::Float, &c.learning_rate, {}, 0, inf},
      {"train.weight_decay", Kind::Float, &c.weight_decay, {}, 0, inf},
      {"train.warmup_epochs", Kind::Float, &c.warmup_epochs, {}, 0, inf},
      {"train.gradient_accumulation", Kind::Int, &c.gradient_accumulation, {}, 1, inf},
      {"train.clip_grad_norm", Kind::Float, &c.clip_grad_norm, {}, 0, inf},
      {"train.label_smoothing", Kind::Float, &c.label_smoothing, {}, 0, 0.999},
      {"train.seed", Kind::Int, &c.seed, {}, 0, inf},
      {"train.optimizer",
       Kind::String,
       &c.optimizer,
       {"sgd", "adam", "adamw", "hybrid_adam", "lamb"}},
      {"train.momentum", Kind::Float, &c.momentum, {}, 0, 1},
      {"train.nesterov", Kind::Bool, &c.nesterov},
      {"train.lr_schedule", Kind::String, &c.lr_schedule, {"cosine", "linear", "constant"}},
      {"train.schedule_by", Kind::String, &c.schedule_by, {"step", "epoch"}},
      {"train.min_lr", Kind::Float, &c.min_lr, {}, 0, inf},
      {"train.num_workers", Kind::Int, &c.num_workers, {}, 0, 64},
      {"train.log_interval", Kind::Int, &c.log_interval, {}, 0, inf},
      {"train.metrics_file", Kind::String, &c.metrics_file},
      {"train.kernel_profile", Kind::String, &c.kernel_profile},
      {"train.kernel_profile_start", Kind::Int, &c.kernel_profile_start, {}, 0, inf},
      {"train.kernel_profile_steps", Kind::Int, &c.kernel_profile_steps, {}, 1, inf},
      {"train.max_steps_per_epoch", Kind::Int, &c.max_steps_per_epoch, {}, 0, inf},
      {"train.peak_tflops", Kind::Float, &c.peak_tflops, {}, 0, inf},
      {"train.device", Kind::String, &c.device, {"cpu", "cuda"}},
      {"model.name", Kind::String, &c.model_name},
      {"model.img_size", Kind::Int, &c.img_size, {}, 1, inf},
      {"model.patch_size", Kind::Int, &c.patch_size, {}, 1, inf},
      {"model.in_chans", Kind::Int, &c.in_chans, {}, 1, inf},
      {"model.hidden_size", Kind::Int, &c.hidden_size, {}, 1, inf},
      {"model.depth", Kind::Int, &c.depth, {}, 1, inf},
      {"model.num_heads", Kind::Int, &c.num_heads, {}, 1, inf},
      {"model.mlp_ratio", Kind::Float, &c.mlp_ratio, {}, 1e-6, inf},
      {"model.num_classes", Kind::Int, &c.num_classes, {}, 1, inf},
      {"model.dropout", Kind::Float, &c.dropout, {}, 0, 0.999},
      {"model.drop_path", Kind::Float, &c.drop_path, {}, 0, 0.999},
      {"model.checkpoint", Kind::Bool, &c.checkpoint},
      {"model.act", Kind::String, &c.act, {"gelu", "gelu_tanh"}},
      {"model.recompute_gelu", Kind::Bool, &c.recompute_gelu},
      {"parallel.pipeline", Kind::Int, &c.pipeline, {}, 1, inf},
      {"parallel.num_microbatches", Kind::Int, &c.num_microbatches, {}, 0, inf},
      {"parallel.microbatch_size", Kind::Int, &c.microbatch_size, {}, 0, inf},
      {"parallel.pp_style",
       Kind::String,
       &c.pp_style,
       {"gpipe", "1f1b", "interleaved", "zbh1", "zbv"}},
      {"parallel.num_model_chunks", Kind::Int, &c.num_model_chunks, {}, 1, inf},
      {"parallel.split_backward", Kind::Bool, &c.split_backward},
      {"parallel.partition", Kind::String, &c.partition, {"uniform", "balanced"}},
      {"parallel.num_layers_per_stage", Kind::IntList, &c.num_layers_per_stage, {}, 1, inf},
      {"parallel.tensor.mode", Kind::String, &c.tensor_mode, {"none", "1d", "2d", "2.5d", "3d"}},
      {"parallel.tensor.size", Kind::Int, &c.tensor_size, {}, 1, inf},
      {"parallel.tensor.depth", Kind::Int, &c.tensor_depth, {}, 1, inf},
      {"parallel.sequence_parallel", Kind::Bool, &c.sequence_parallel},
      {"parallel.zero_stage", Kind::Int, &c.zero_stage, {}, 0, 3},
      {"parallel.cpu_offload", Kind::Bool, &c.cpu_offload},
      {"parallel.offload_step_overlap", Kind::Bool, &c.offload_step_overlap},
      {"parallel.ddp_bucket_cap_mb", Kind::Float, &c.ddp_bucket_cap_mb, {}, 1e-6, inf},
      {"parallel.gradient_comm_dtype", Kind::String, &c.gradient_comm_dtype, {"fp32", "bf16"}},
      {"parallel.ddp_copy_engine", Kind::Bool, &c.ddp_copy_engine},
      {"parallel.ddp_exchange", Kind::Bool, &c.ddp_exchange},
      {"parallel.ddp_bucket_hold", Kind::Float, &c.ddp_bucket_hold, {}, 0, 1},
      {"parallel.zero_bucket_size_in_m", Kind::Float, &c.zero_bucket_size_in_m, {}, 1e-9, inf},
      {"parallel.zero3_prefetch", Kind::Int, &c.zero3_prefetch, {}, 0, inf},
      {"parallel.gemm_sm_margin", Kind::Int, &c.gemm_sm_margin, {}, -1, 1024},
      {"parallel.p2p_max_ctas", Kind::Int, &c.p2p_max_ctas, {}, 0, 64},
      {"parallel.zero_max_inflight_buckets", Kind::Int, &c.zero_max_inflight_buckets, {}, 1, inf},
      {"precision.mode", Kind::String, &c.precision, {"fp32", "fp16", "bf16"}},
      {"precision.initial_scale", Kind::Float, &c.initial_scale, {}, 1e-30, inf},
      {"precision.min_scale", Kind::Float, &c.min_scale, {}, 1e-30, inf},
      {"precision.growth_factor", Kind::Float, &c.growth_factor, {}, 1, inf},
      {"precision.backoff_factor", Kind::Float, &c.backoff_factor, {}, 1e-30, 1},
      {"precision.growth_interval", Kind::Int, &c.growth_interval, {}, 1, inf},
      {"precision.hysteresis", Kind::Int, &c.hysteresis, {}, 1, inf},
      {"precision.max_scale", Kind::Float, &c.max_scale, {}, 1e-30, inf},
      {"data.dataset",
       Kind::String,
       &c.dataset,
       {"fashion_mnist", "mnist", "cifar10", "image_folder", "synthetic"}},
      {"data.path", Kind::String, &c.path},
      {"data.train_subset", Kind::Int, &c.train_subset, {}, 0, inf},
      {"data.eval_subset", Kind::Int, &c.eval_subset, {}, 0, inf},
      {"data.random_crop_padding", Kind::Int, &c.random_crop_padding, {}, 0, inf},
      {"data.horizontal_flip", Kind::Bool, &c.horizontal_flip},
      {"data.image_size", Kind::Int, &c.image_size, {}, 0, inf},
      {"checkpoint.dir", Kind::String, &c.checkpoint_dir},
      {"checkpoint.every_steps", Kind::Int, &c.checkpoint_every_steps, {}, 0, inf},
      {"checkpoint.every_epochs", Kind::Int, &c.checkpoint_every_epochs, {}, 0, inf},
      {"checkpoint.keep_last", Kind::Int, &c.checkpoint_keep_last, {}, 0, inf},
      {"checkpoint.max_shard_mb", Kind::Float, &c.checkpoint_max_shard_mb, {}, 1e-3, inf},
      {"checkpoint.export_dtype",
       Kind::String,
       &c.checkpoint_export_dtype,
       {"fp32", "bf16", "fp16"}},
      {"checkpoint.per_rank", Kind::Bool, &c.checkpoint_per_rank},
      {"checkpoint.overwrite", Kind::Bool, &c.checkpoint_overwrite},
      {"data.synthetic_size", Kind::Int, &c.synthetic_size, {}, 1, inf},
  };
}

std::string keys_of_section(const std::vector<Field>& fs, const std::string& section) {
  std::vector<std::string> ks;
  for (const auto& f : fs)
    if (f.key.rfind(section + ".", 0) == 0) ks.push_back(f.key.substr(section.size() + 1));
  return fmt::format("{}", fmt::join(ks, ", "));
}

std::string node_str(const toml::node& n) {
  if (auto v = n.value_exact<std::string>()) return fmt::format("\"{}\"", *v);
  if (auto v = n.value_exact<int64_t>()) return fmt::format("{}", *v);
  if (auto v = n.value_exact<double>()) return fmt::format("{}", *v);
  if (auto v = n.value_exact<bool>()) return *v ? "true" : "false";
  if (n.is_table()) return "a table";
  if (n.is_array()) return "an array";
  return "a value";
}

void assign(const Field& f, const toml::node& n, const std::string& origin) {
  auto bad = [&](const std::string& want) {
    fail("[config] {}: {} = {} is not {}", origin, f.key, node_str(n), want);
  };
  auto range = [&](double v) {
    if (v < f.lo || v > f.hi)
      fail("[config] {}: {} = {} is outside [{}, {}]", origin, f.key, node_str(n), f.lo,
           f.hi >= 1e300 ? std::string("inf") : fmt::format("{}", f.hi));
  };
  switch (f.kind) {
    case Kind::Int: {
      auto v = n.value_exact<int64_t>();
      if (!v) bad("an integer");
      range(static_cast<double>(*v));
      *static_cast<int64_t*>(f.ptr) = *v;
      break;
    }
    case Kind::Float: {
      std::optional<double> v = n.is_integer() ? std::optional<double>(double(*n.value<int64_t>()))
                                               : n.value_exact<double>();
      if (!v) bad("a number");
      range(*v);
      *static_cast<double*>(f.ptr) = *v;
      break;
    }
    case Kind::Bool: {
      auto v = n.value_exact<bool>();
      if (!v) bad("true or false");
      *static_cast<bool*>(f.ptr) = *v;
      break;
    }
    case Kind::IntList: {
      const toml::array* a = n.as_array();
      if (!a) bad("an array of integers");
      std::vector<int> out;
      for (const toml::node& e : *a) {
        auto v = e.value_exact<int64_t>();
        if (!v) bad("an array of integers");
        range(static_cast<double>(*v));
        out.push_back(static_cast<int>(*v));
      }
      *static_cast<std::vector<int>*>(f.ptr) = out;
      break;
    }
    case Kind::String: {
      auto v = n.value_exact<std::string>();
      if (!v) bad("a string");
      if (!f.choices.empty() &&
          std::find(f.choices.begin(), f.choices.end(), *v) == f.choices.end())
        fail("[config] {}: {} = \"{}\" is not one of: {}", origin, f.key, *v,
             fmt::join(f.choices, ", "));
      *static_cast<std::string*>(f.ptr) = *v;
      break;
    }
  }
}

// Walks a table, assigning known keys and rejecting unknown ones.
void walk(const toml::table& t, const std::string& prefix, std::vector<Field>& fs, TrainConfig& c,
          const std::string& origin) {
  for (auto&& [k, v] : t) {
    const std::string key =
        prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    auto it = std::find_if(fs.begin(), fs.end(), [&](const Field& f) { return f.key == key; });
    if (it != fs.end()) {
      assign(*it, v, origin);
      c.explicitly_set.insert(key);
      continue;
    }
    bool is_section = false;
    for (const auto& f : fs) is_section = is_section || f.key.rfind(key + ".", 0) == 0;
    if (is_section && v.is_table()) {
      walk(*v.as_table(), key, fs, c, origin);
      continue;
    }
    if (prefix.empty())
      fail(
          "[config] {}: unknown section or key '{}': expected [train], [model], [parallel], "
          "[precision] or [data]",
          origin, key);
    fail("[config] {}: unknown key '{}': [{}] accepts {}", origin, key, prefix,
         keys_of_section(fs, prefix));
  }
}

}  // namespace

nn::ViTConfig TrainConfig::vit() const {
  nn::ViTConfig v;
  if (!model_name.empty()) v = nn::ViTConfig::named(model_name);
  auto pick = [&](const char* key, int64_t mine, int64_t named) {
    return model_name.empty() || explicitly_set.count(key) ? mine : named;
  };
  v.img_size = pick("model.img_size", img_size, v.img_size);
  v.patch_size = pick("model.patch_size", patch_size, v.patch_size);
  v.embed_dim = pick("model.hidden_size", hidden_size, v.embed_dim);
  v.depth = pick("model.depth", depth, v.depth);
  v.num_heads = pick("model.num_heads", num_heads, v.num_heads);
  if (model_name.empty() || explicitly_set.count("model.mlp_ratio")) v.mlp_ratio = mlp_ratio;
  v.num_classes = num_classes;
  v.in_chans = in_chans > 0 ? in_chans : (dataset == "fashion_mnist" || dataset == "mnist" ? 1 : 3);
  v.drop_rate = static_cast<float>(dropout);
  v.drop_path_rate = static_cast<float>(drop_path);
  v.checkpoint = checkpoint;
  v.act = act;
  v.recompute_gelu = recompute_gelu;
  return v;
}

TrainConfig parse_config(const std::string& text, const std::string& origin,
                         const std::vector<std::string>& overrides) {
  TrainConfig c;
  auto fs = fields(c);
  const std::string_view body = strip_utf8_bom(text);
  if (const std::string why = toml_text_problem(body); !why.empty())
    fail("[config] {}: {}", origin, why);
  try {
    walk(toml::parse(body, origin), "", fs, c, origin);
  } catch (const toml::parse_error& e) {
    fail("[config] {}:{}:{}: {}", origin, e.source().begin.line, e.source().begin.column,
         e.description());
  }
  for (const std::string& o : overrides) {
    const auto eq = o.find('=');
    CAI_CHECK(eq != std::string::npos && eq > 0,
              "[config] --set '{}' is not of the form section.key=value", o);
    const std::string key = o.substr(0, eq), value = o.substr(eq + 1);
    auto it = std::find_if(fs.begin(), fs.end(), [&](const Field& f) { return f.key == key; });
    if (it == fs.end()) {
      const auto dot = key.find('.');
      const std::string section = dot == std::string::npos ? key : key.substr(0, dot);
      const std::string known = keys_of_section(fs, section);
      CAI_CHECK(!known.empty(), "[config] --set {}: unknown section '{}'", o, section);
      fail("[config] --set {}: unknown key '{}': [{}] accepts {}", o, key, section, known);
    }
    // A TOML value, or a bare word taken as a string (so --set data.dataset=cifar10 works).
    toml::table t;
    const std::string line = "v = " + value;
    try {
      // A value toml++ must not see (see toml_text.h) is no TOML value: a string.
      t = toml_text_problem(line).empty() ? toml::parse(line) : toml::table{{"v", value}};
    } catch (const toml::parse_error&) {
      t = toml::table{{"v", value}};
    }
    assign(*it, *t.get("v"), "--set");
    c.explicitly_set.insert(key);
  }
  return c;
}

std::string key_reference_markdown() {
  TrainConfig defaults;
  const std::vector<Field> fs = fields(defaults);
  auto num = [](double v) {
    return v >= 1e300    ? std::string("inf")
           : v <= -1e300 ? std::string("-inf")
                         : fmt::format("{}", v);
  };
  std::vector<std::string> sections;  // in order of first appearance in the table
  for (const Field& f : fs) {
    const std::string sec = f.key.substr(0, f.key.find('.'));
    if (std::find(sections.begin(), sections.end(), sec) == sections.end()) sections.push_back(sec);
  }
  std::string out;
  for (const std::string& sec : sections) {
    out += fmt::format(
        "\n### [{}]\n\n| key | type | default | allowed | meaning |\n"
        "| --- | --- | --- | --- | --- |\n",
        sec);
    for (const Field& f : fs) {
      if (f.key.rfind(sec + ".", 0) != 0) continue;
      const char* doc = detail::key_doc(f.key);
      CAI_CHECK(doc != nullptr, "[config] key {} has no description in key_docs.cpp", f.key);
      std::string type, def, allowed;
      switch (f.kind) {
        case Kind::Int:
          type = "integer";
          def = fmt::format("{}", *static_cast<const int64_t*>(f.ptr));
          break;
        case Kind::Float:
          type = "number";
          def = num(*static_cast<const double*>(f.ptr));
          break;
        case Kind::Bool:
          type = "bool";
          def = *static_cast<const bool*>(f.ptr) ? "true" : "false";
          break;
        case Kind::String:
          type = "string";
          def = fmt::format("\"{}\"", *static_cast<const std::string*>(f.ptr));
          break;
        case Kind::IntList:
          type = "integer list";
          def = fmt::format("[{}]", fmt::join(*static_cast<const std::vector<int>*>(f.ptr), ", "));
          break;
      }
      if (!f.choices.empty())
        allowed = fmt::format("{}", fmt::join(f.choices, " \\| "));
      else if (f.kind == Kind::Int || f.kind == Kind::Float || f.kind == Kind::IntList)
        allowed = fmt::format("[{}, {}]", num(f.lo), num(f.hi));
      out += fmt::format("| `{}` | {} | `{}` | {} | {} |\n", f.key.substr(sec.size() + 1), type,
                         def, allowed, doc);
    }
  }
  return out;
}

TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream f(path);
  CAI_CHECK(f.good(), "[config] cannot open config file '{}'", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_config(ss.str(), path, overrides);
}

std::string expand_env(const std::string& s, const std::string& key) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, 2, "${") == 0) {
      const auto end = s.find('}', i);
      CAI_CHECK(end != std::string::npos, "[config] {} = \"{}\": unterminated ${{", key, s);
      const std::string name = s.substr(i + 2, end - i - 2);
      const char* v = std::getenv(name.c_str());
      CAI_CHECK(v, "[config] {} = \"{}\" uses ${{{}}} but the environment variable {} is not set",
                key, s, name, name);
      out += v;
      i = end + 1;
    } else {
      out += s[i++];
    }
  }
  return out;
}

int gemm_sm_margin_for(const TrainConfig& c) {
  if (c.gemm_sm_margin >= 0) return static_cast<int>(c.gemm_sm_margin);
  return c.pipeline > 1 ? static_cast<int>(2 * c.p2p_max_ctas) : 0;
}

void validate(const TrainConfig& c, int world) {
  const nn::ViTConfig v = c.vit();
  v.validate();
  if (c.pipeline > 1) {
    CAI_CHECK(c.zero_stage <= 1,
              "[config] parallel.zero_stage = {} with parallel.pipeline = {}: pipeline stages "
              "combine with ZeRO 0 or 1 only",
              c.zero_stage, c.pipeline);
    CAI_CHECK(c.gradient_accumulation == 1,
              "[config] train.gradient_accumulation = {} with parallel.pipeline = {}: accumulate "
              "through parallel.num_microbatches instead",
              c.gradient_accumulation, c.pipeline);
  }
  CAI_CHECK(c.pp_style == "interleaved" || c.pp_style == "zbv" || c.num_model_chunks == 1,
            "[config] parallel.num_model_chunks = {} needs parallel.pp_style = \"interleaved\" "
            "(or \"zbv\", 2 chunks)",
            c.num_model_chunks);
  CAI_CHECK(c.pp_style != "zbv" || c.num_model_chunks == 2 || c.pipeline == 1,
            "[config] parallel.pp_style = \"zbv\" places 2 model chunks per rank in a V: set "
            "parallel.num_model_chunks = 2 (got {})",
            c.num_model_chunks);
  CAI_CHECK(c.pp_style != "interleaved" || c.num_model_chunks >= 2 || c.pipeline == 1,
            "[config] parallel.pp_style = \"interleaved\" needs parallel.num_model_chunks >= 2");
  CAI_CHECK(
      c.num_microbatches == 0 || c.microbatch_size == 0,
      "[config] set parallel.num_microbatches ({}) or parallel.microbatch_size ({}), not both",
      c.num_microbatches, c.microbatch_size);
  CAI_CHECK(c.tensor_size == 1 || c.tensor_mode != "none",
            "[config] parallel.tensor.size = {} needs parallel.tensor.mode (1d, 2d, 2.5d or 3d)",
            c.tensor_size);
  CAI_CHECK(c.tensor_depth == 1 || c.tensor_mode == "2.5d",
            "[config] parallel.tensor.depth = {} applies to mode \"2.5d\" only (mode is \"{}\")",
            c.tensor_depth, c.tensor_mode);
  CAI_CHECK(!c.split_backward || c.pipeline > 1,
            "[config] parallel.split_backward = true needs parallel.pipeline > 1 (got {}): it "
            "splits the pipeline schedule's backward",
            c.pipeline);
  CAI_CHECK(!c.sequence_parallel || c.tensor_size > 1,
            "[config] parallel.sequence_parallel = true needs parallel.tensor.size > 1 (got {}): "
            "the sequence is split over the tensor-parallel group",
            c.tensor_size);
  CAI_CHECK(!c.sequence_parallel || c.tensor_mode == "1d",
            "[config] parallel.sequence_parallel = true needs parallel.tensor.mode = \"1d\" (got "
            "\"{}\", which splits the batch and the features instead)",
            c.tensor_mode);
  if (c.tensor_mode != "none") {
    try {
      v.validate_tensor_parallel(c.tensor_mode, static_cast<int>(c.tensor_size),
                                 static_cast<int>(c.tensor_depth), c.sequence_parallel);
    } catch (const Error& e) {
      fail("[config] parallel.tensor = {{mode = \"{}\", size = {}{}}}: {}", c.tensor_mode,
           c.tensor_size,
           c.tensor_mode == "2.5d" ? fmt::format(", depth = {}", c.tensor_depth) : std::string(),
           e.what());
    }
  }
  if (c.tensor_mode == "2d" || c.tensor_mode == "2.5d" || c.tensor_mode == "3d") {
    // The batch is split into equal chunks: q (2d), q·depth (2.5d) or q² (3d).
    const int64_t T = c.tensor_size;
    const int64_t chunks = nn::TensorParallel::grid(c.tensor_mode, static_cast<int>(T),
                                                    static_cast<int>(c.tensor_depth))
                               .chunks;
    CAI_CHECK(c.batch_size % chunks == 0,
              "[config] train.batch_size = {} is not divisible by the {} batch chunks of tensor "
              "mode {} (size {}): every tensor-parallel rank holds an equal part of the batch",
              c.batch_size, chunks, c.tensor_mode, T);
  }
  CAI_CHECK(
      !(c.zero_stage > 0 && c.optimizer == "lamb"),
      "[config] parallel.zero_stage = {} with train.optimizer = \"lamb\": LAMB's per-parameter "
      "trust ratio spans ZeRO shards; use sgd, adam or adamw",
      c.zero_stage);
  CAI_CHECK(c.gradient_comm_dtype == "fp32" || c.zero_stage <= 1,
            "[config] parallel.gradient_comm_dtype = \"{}\" applies to zero_stage 0 and 1 (the "
            "all-reduced buckets), not zero_stage = {}",
            c.gradient_comm_dtype, c.zero_stage);
  CAI_CHECK(!c.cpu_offload || c.zero_stage > 0,
            "[config] parallel.cpu_offload = true needs parallel.zero_stage >= 1");
  CAI_CHECK(!c.ddp_copy_engine ||
                (c.zero_stage <= 1 && c.gradient_comm_dtype == "fp32" && c.device == "cuda"),
            "[config] parallel.ddp_copy_engine = true all-reduces fp32 buckets between GPUs: it "
            "needs parallel.zero_stage 0 or 1 (got {}), parallel.gradient_comm_dtype = \"fp32\" "
            "(got \"{}\") and train.device = \"cuda\" (got \"{}\")",
            c.zero_stage, c.gradient_comm_dtype, c.device);
  CAI_CHECK(!c.ddp_exchange || (c.zero_stage == 0 && c.gradient_comm_dtype == "fp32" &&
                                c.device == "cuda" && !c.ddp_copy_engine),
            "[config] parallel.ddp_exchange = true copies whole fp32 gradients between GPUs: it "
            "needs parallel.zero_stage = 0 (got {}), parallel.gradient_comm_dtype = \"fp32\" "
            "(got \"{}\"), train.device = \"cuda\" (got \"{}\") and parallel.ddp_copy_engine "
            "= false (got {})",
            c.zero_stage, c.gradient_comm_dtype, c.device, c.ddp_copy_engine);
  CAI_CHECK(c.ddp_bucket_hold == 0 || c.zero_stage <= 1,
            "[config] parallel.ddp_bucket_hold = {} holds the all-reduced buckets of "
            "parallel.zero_stage 0 and 1, not zero_stage = {}",
            c.ddp_bucket_hold, c.zero_stage);
  CAI_CHECK(world % (c.tensor_size * c.pipeline) == 0,
            "[config] {} processes are not divisible by tensor size {} × pipeline {}", world,
            c.tensor_size, c.pipeline);
  CAI_CHECK(!c.checkpoint_dir.empty() ||
                (c.checkpoint_every_steps == 0 && c.checkpoint_every_epochs == 0),
            "[config] checkpoint.every_steps = {} / every_epochs = {} need checkpoint.dir",
            c.checkpoint_every_steps, c.checkpoint_every_epochs);
  CAI_CHECK(!c.checkpoint_per_rank || c.checkpoint_export_dtype == "fp32",
            "[config] checkpoint.per_rank = true writes fp32 shards; checkpoint.export_dtype = "
            "\"{}\" applies to consolidated checkpoints (or export one with --export-to)",
            c.checkpoint_export_dtype);
  CAI_CHECK(c.min_scale <= c.initial_scale && c.initial_scale <= c.max_scale,
            "[config] precision: need min_scale ({}) <= initial_scale ({}) <= max_scale ({})",
            c.min_scale, c.initial_scale, c.max_scale);
  CAI_CHECK(c.kernel_profile.empty() || c.device == "cuda",
            "[config] train.kernel_profile = \"{}\" profiles GPU kernels but train.device = \"{}\" "
            "(expected \"cuda\")",
            c.kernel_profile, c.device);
  CAI_CHECK(c.min_lr <= c.learning_rate, "[config] train.min_lr {} exceeds train.learning_rate {}",
            c.min_lr, c.learning_rate);
  if (c.dataset == "fashion_mnist" || c.dataset == "mnist")
    CAI_CHECK(v.in_chans == 1, "[config] model.in_chans = {} but {} images have 1 channel",
              v.in_chans, c.dataset);
  if (c.dataset == "cifar10") {
    CAI_CHECK(v.in_chans == 3, "[config] model.in_chans = {} but cifar10 images have 3 channels",
              v.in_chans);
  }
  // (A resolved config written by to_toml carries the default: only another value is a mistake.)
  CAI_CHECK(c.dataset == "synthetic" || !c.explicitly_set.count("data.synthetic_size") ||
                c.synthetic_size == TrainConfig{}.synthetic_size,
            "[config] data.synthetic_size = {} needs data.dataset = \"synthetic\" (got \"{}\")",
            c.synthetic_size, c.dataset);
  if (c.dataset != "image_folder" && c.dataset != "synthetic")
    CAI_CHECK(v.num_classes == 10, "[config] model.num_classes = {} but {} has 10 classes",
              v.num_classes, c.dataset);
}

std::string to_toml(const TrainConfig& c0) {
  TrainConfig c = c0;
  // The model as resolved (named model, explicit keys, channels from the dataset), so the text
  // loads back to the same model.
  const nn::ViTConfig v = c.vit();
  c.img_size = v.img_size;
  c.patch_size = v.patch_size;
  c.hidden_size = v.embed_dim;
  c.depth = v.depth;
  c.num_heads = v.num_heads;
  c.mlp_ratio = v.mlp_ratio;
  c.in_chans = v.in_chans;
  auto fs = fields(c);
  // Keys grouped by section in order of first appearance: a section's header appears once, so
  // the text loads back (TOML refuses a [parallel] reopened after [parallel.tensor]).
  std::vector<std::string> order;
  for (const auto& f : fs) {
    const std::string sec = f.key.substr(0, f.key.rfind('.'));
    if (std::find(order.begin(), order.end(), sec) == order.end()) order.push_back(sec);
  }
  auto rank = [&](const auto& f) {
    return std::find(order.begin(), order.end(), f.key.substr(0, f.key.rfind('.'))) - order.begin();
  };
  std::stable_sort(fs.begin(), fs.end(),
                   [&](const auto& a, const auto& b) { return rank(a) < rank(b); });
  std::string out, section;
  for (const auto& f : fs) {
    const auto dot = f.key.rfind('.');
    const std::string sec = f.key.substr(0, dot), key = f.key.substr(dot + 1);
    if (sec != section) {
      out += fmt::format("{}[{}]\n", out.empty() ? "" : "\n", sec);
      section = sec;
    }
    switch (f.kind) {
      case Kind::Int:
        out += fmt::format("{} = {}\n", key, *static_cast<int64_t*>(f.ptr));
        break;
      case Kind::Float:
        out += fmt::format("{} = {}\n", key, *static_cast<double*>(f.ptr));
        break;
      case Kind::Bool:
        out += fmt::format("{} = {}\n", key, *static_cast<bool*>(f.ptr));
        break;
      case Kind::String:
        out += fmt::format("{} = \"{}\"\n", key, *static_cast<std::string*>(f.ptr));
        break;
      case Kind::IntList:
        out += fmt::format("{} = [{}]\n", key,
                           fmt::join(*static_cast<std::vector<int>*>(f.ptr), ", "));
        break;
    }
  }
  return out;
}

TrainConfig tensor_layout_config(const TrainConfig& base, const std::string& mode, int size,
                                 int depth, int64_t batch) {
  TrainConfig c = base;
  c.tensor_mode = mode;
  c.tensor_size = size;
  c.tensor_depth = depth;
  c.sequence_parallel = false;
  c.pipeline = 1;
  c.num_microbatches = 0;
  c.microbatch_size = 0;
  c.num_model_chunks = 1;
  c.split_backward = false;
  c.num_layers_per_stage.clear();
  c.zero_stage = 0;
  c.cpu_offload = false;
  c.gradient_accumulation = 1;
  c.batch_size = batch;
  return c;
}

plan::Layout plan_layout(const TrainConfig& c, int world) {
  plan::Layout l;
  l.world = world;
  l.tp = static_cast<int>(c.tensor_size);
  l.tp_mode = c.tensor_mode == "none" || l.tp == 1 ? "1d" : c.tensor_mode;
  l.tp_depth = l.tp_mode == "2.5d" ? static_cast<int>(c.tensor_depth) : 1;
  l.pp = static_cast<int>(c.pipeline);
  l.sequence_parallel = c.sequence_parallel;
  l.zero_stage = static_cast<int>(c.zero_stage);
  l.cpu_offload = c.cpu_offload;
  l.offload_step_overlap = c.offload_step_overlap;
  l.pp_style = c.pp_style;
  l.num_microbatches = static_cast<int>(c.num_microbatches);
  l.microbatch_size = static_cast<int>(c.microbatch_size);
  l.chunks = static_cast<int>(c.num_model_chunks);
  l.split_backward = c.split_backward;
  l.partition = c.partition;
  l.num_layers_per_stage = c.num_layers_per_stage;
  l.batch = c.batch_size;
  l.gradient_accumulation = c.gradient_accumulation;
  l.precision = dtype_from_name(c.precision);
  l.optimizer = c.optimizer;
  l.momentum = c.momentum;
  l.ddp_bucket_cap_mb = c.ddp_bucket_cap_mb;
  l.bucket_dtype = dtype_from_name(c.gradient_comm_dtype);
  l.ddp_copy_engine = c.ddp_copy_engine;
  l.ddp_exchange = c.ddp_exchange;
  l.ddp_bucket_hold = c.ddp_bucket_hold;
  l.zero_bucket_size_in_m = c.zero_bucket_size_in_m;
  l.zero3_prefetch = static_cast<int>(c.zero3_prefetch);
  l.zero_max_inflight_buckets = static_cast<int>(c.zero_max_inflight_buckets);
  l.gpu = c.device == "cuda";
  l.p2p_max_ctas = static_cast<int>(c.p2p_max_ctas);
  l.gemm_sm_margin = gemm_sm_margin_for(c);
  // The trainer's batches on the device (trainer.cpp): on a GPU the prefetcher's two slots; on
  // the CPU the step's batches and those the loader's workers build ahead (LoaderConfig's
  // prefetch plus one per worker; main.cpp keeps the default prefetch).
  const int ahead =
      c.num_workers > 0 ? data::LoaderConfig{}.prefetch + static_cast<int>(c.num_workers) : 0;
  l.input_batches = l.gpu ? 2 : 1 + ahead;
  // main.cpp: a DataParallelPlugin (or the pipeline / hybrid plugin over one) whenever there
  // are several processes, ZeRO, a pipeline or tensor parallelism.
  l.data_parallel_plugin = world > 1 || c.zero_stage > 0 || c.pipeline > 1 || c.tensor_size > 1;
  return l;
}

}  // namespace cai::config
