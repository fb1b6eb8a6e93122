#include "cai/checkpoint/checkpoint.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cai/core/error.h"
#include "cai/core/log.h"
#include "cai/core/version.h"
#include "cai/nn/tensor_parallel.h"

namespace cai::checkpoint {

namespace fs = std::filesystem;

namespace {

std::string step_name(int64_t step) {
  return fmt::format("step-{:09d}", step);
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  CAI_CHECK(f.good(), "[checkpoint] cannot open {}", path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// Replaces `path` with `text` atomically (temporary file, fsync, rename).
void write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    CAI_CHECK(f.good(), "[checkpoint] cannot write {}", tmp);
    f << text;
    f.flush();
    CAI_CHECK(f.good(), "[checkpoint] error writing {}", tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  CAI_CHECK(!ec, "[checkpoint] cannot rename {} to {}: {}", tmp, path, ec.message());
}

nlohmann::json to_json(const TrainingState& s) {
  return {{"epoch", s.epoch},
          {"step_in_epoch", s.step_in_epoch},
          {"global_step", s.global_step},
          {"scheduler_last", s.scheduler_last},
          {"loss_scaler", s.scaler},
          {"layout", s.layout},
          {"version", s.version},
          {"format", "colossalai-cpp checkpoint 1"}};
}

TrainingState from_json(const nlohmann::json& j, const std::string& path) {
  TrainingState s;
  try {
    s.epoch = j.at("epoch").get<int64_t>();
    s.step_in_epoch = j.at("step_in_epoch").get<int64_t>();
    s.global_step = j.at("global_step").get<int64_t>();
    s.scheduler_last = j.at("scheduler_last").get<int64_t>();
    s.scaler = j.at("loss_scaler").get<std::vector<double>>();
    s.layout = j.value("layout", "");
    s.version = j.value("version", "");
  } catch (const nlohmann::json::exception& e) {
    fail("[checkpoint] {}: {}", path, e.what());
  }
  CAI_CHECK(s.epoch >= 0 && s.step_in_epoch >= 0 && s.global_step >= 0 && s.scheduler_last >= 0,
            "[checkpoint] {}: negative epoch/step values", path);
  return s;
}

}  // namespace

std::string save_checkpoint(const CheckpointConfig& cfg, train::Trainer& trainer,
                            optim::LRScheduler* scheduler, const TrainingState& state0) {
  CAI_CHECK(!cfg.dir.empty(), "[checkpoint] no checkpoint.dir");
  train::Plugin& plugin = trainer.plugin();
  // Collective gathers first: every rank takes part.
  std::map<std::string, Tensor> model = plugin.full_model_state(trainer.model());
  std::map<std::string, Tensor> optimizer =
      plugin.full_optimizer_state(trainer.model(), trainer.optimizer());
  TrainingState state = state0;
  state.scheduler_last = scheduler ? scheduler->last() : 0;
  if (auto* s = trainer.grad_scaler()) state.scaler = s->state();
  state.layout = cfg.layout;
  state.version = fmt::format("{} ({})", version(), git_hash());
  const std::string final_dir = cfg.dir + "/" + step_name(state.global_step);
  if (plugin.rank() == 0) {
    fs::create_directories(cfg.dir);
    if (fs::exists(final_dir)) fs::remove_all(final_dir);  // the same step saved again
    AtomicDir out(final_dir);
    if (cfg.export_dtype != DType::F32)
      for (auto& [k, v] : model) v = v.to(cfg.export_dtype);
    save_sharded(out.path(), model, cfg.max_shard_bytes,
                 {{"format", "pt"}, {"source", "colossalai-cpp"}});
    save_safetensors(out.path() + "/optimizer.safetensors", optimizer);
    std::ofstream j(out.path() + "/trainer_state.json");
    j << to_json(state).dump(2) << "\n";
    j.close();
    out.commit();
    write_atomically(cfg.dir + "/latest", step_name(state.global_step) + "\n");
    if (cfg.keep_last > 0) {
      std::vector<std::string> steps;
      for (const auto& e : fs::directory_iterator(cfg.dir)) {
        const std::string n = e.path().filename().string();
        if (e.is_directory() && n.rfind("step-", 0) == 0 && n.find(".tmp") == std::string::npos &&
            fs::exists(e.path() / "trainer_state.json"))
          steps.push_back(n);
      }
      std::sort(steps.begin(), steps.end());
      // Never the one just written: it is the newest.
      for (size_t i = 0; i + static_cast<size_t>(cfg.keep_last) < steps.size(); ++i)
        if (steps[i] != step_name(state.global_step)) fs::remove_all(cfg.dir + "/" + steps[i]);
    }
    log::info("[checkpoint] saved {} (step {}, epoch {})", final_dir, state.global_step,
              state.epoch);
  }
  plugin.barrier();
  return final_dir;
}

std::string resolve_checkpoint(const std::string& p) {
  CAI_CHECK(fs::exists(p), "[checkpoint] {} does not exist", p);
  if (fs::exists(fs::path(p) / "trainer_state.json")) return p;
  const fs::path latest = fs::path(p) / "latest";
  CAI_CHECK(fs::exists(latest),
            "[checkpoint] {} holds no checkpoint (neither trainer_state.json nor latest)", p);
  std::string name = read_text(latest.string());
  name.erase(name.find_last_not_of(" \n\r\t") + 1);
  CAI_CHECK(!name.empty() && name.find('/') == std::string::npos,
            "[checkpoint] {} names '{}', not a checkpoint of that directory", latest.string(),
            name);
  const fs::path dir = fs::path(p) / name;
  CAI_CHECK(fs::exists(dir / "trainer_state.json"), "[checkpoint] {} names {}, which is incomplete",
            latest.string(), dir.string());
  return dir.string();
}

Checkpoint load_checkpoint(const std::string& path) {
  Checkpoint c;
  c.path = resolve_checkpoint(path);
  const std::string sj = c.path + "/trainer_state.json";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text(sj));
  } catch (const nlohmann::json::exception& e) {
    fail("[checkpoint] {}: not valid JSON ({})", sj, e.what());
  }
  c.state = from_json(j, sj);
  c.model = load_model_weights(c.path).tensors;
  for (auto& [k, v] : c.model)
    if (v.dtype() != DType::F32) v = v.to(DType::F32);
  c.optimizer = load_safetensors(c.path + "/optimizer.safetensors").tensors;
  return c;
}

void load_model_state(nn::ViT& model, const std::map<std::string, Tensor>& full,
                      const std::set<std::string>& skip, bool allow_unexpected) {
  std::set<std::string> seen;
  for (nn::Parameter* p : model.parameters()) {
    seen.insert(p->name);
    if (skip.count(p->name)) continue;
    const auto it = full.find(p->name);
    CAI_CHECK(it != full.end(), "[checkpoint] the weights have no '{}' (the model needs it)",
              p->name);
    const Shape want = p->full_shape();
    CAI_CHECK(it->second.shape() == want,
              "[checkpoint] '{}' is {} in the weights, the model has {}", p->name,
              shape_str(it->second.shape()), shape_str(want));
    CAI_CHECK(p->value.defined(), "[checkpoint] load '{}' before the plugin's setup()", p->name);
    Tensor v = it->second.dtype() == DType::F32 ? it->second : it->second.to(DType::F32);
    p->value.copy_from(p->shard.sharded() ? nn::shard_of(v.to(Device::cpu()), p->shard) : v);
  }
  if (!allow_unexpected)
    for (const auto& [k, v] : full)
      CAI_CHECK(seen.count(k), "[checkpoint] the weights have '{}', which the model does not", k);
}

CheckpointHook::CheckpointHook(CheckpointConfig cfg, optim::LRScheduler* scheduler)
    : cfg_(std::move(cfg)), scheduler_(scheduler) {
  CAI_CHECK(cfg_.every_steps >= 0 && cfg_.every_epochs >= 0 && cfg_.keep_last >= 0,
            "[checkpoint] every_steps {}, every_epochs {} and keep_last {} must be >= 0",
            cfg_.every_steps, cfg_.every_epochs, cfg_.keep_last);
}

void CheckpointHook::after_step(train::Trainer& t, const train::StepInfo& s) {
  if (cfg_.every_steps <= 0 || s.global_step % cfg_.every_steps != 0) return;
  // An epoch's last step is saved by after_epoch, after the epoch's evaluation and its LR step.
  if (s.step_in_epoch >= s.steps_per_epoch) return;
  TrainingState st;
  st.epoch = s.epoch;
  st.step_in_epoch = s.step_in_epoch;
  st.global_step = s.global_step;
  save_checkpoint(cfg_, t, scheduler_, st);
}

void CheckpointHook::after_epoch(train::Trainer& t, const train::EpochInfo& e) {
  const bool by_epoch = cfg_.every_epochs > 0 && (e.epoch + 1) % cfg_.every_epochs == 0;
  const bool by_step = cfg_.every_steps > 0 && e.global_step % cfg_.every_steps == 0;
  if (!by_epoch && !by_step) return;
  TrainingState st;
  st.epoch = e.epoch + 1;
  st.step_in_epoch = 0;
  st.global_step = e.global_step;
  save_checkpoint(cfg_, t, scheduler_, st);
}

}  // namespace cai::checkpoint
