#include "cai/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <sstream>

#include "cai/core/error.h"
#include "cai/core/log.h"
#include "cai/core/version.h"
#include "cai/nn/module.h"
#include "cai/nn/tensor_parallel.h"
#include "checkpoint_internal.h"

namespace cai::checkpoint {

namespace fs = std::filesystem;

namespace detail {

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  CAI_CHECK(f.good(), "[checkpoint] cannot open {}", path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// Replaces `path` with `text` atomically (temporary file, fsync, rename, fsync of the directory
// so that the rename is on disk too).
void write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    CAI_CHECK(f.good(), "[checkpoint] cannot write {}", tmp);
    f << text;
    f.flush();
    CAI_CHECK(f.good(), "[checkpoint] error writing {}", tmp);
  }
  fsync_path(tmp, false);
  std::error_code ec;
  fs::rename(tmp, path, ec);
  CAI_CHECK(!ec, "[checkpoint] cannot rename {} to {}: {}", tmp, path, ec.message());
  const fs::path parent = fs::path(path).parent_path();
  fsync_path(parent.empty() ? "." : parent.string(), true);
}

bool path_exists(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

nlohmann::json read_json(const std::string& path) {
  try {
    return nlohmann::json::parse(read_text(path));
  } catch (const nlohmann::json::exception& e) {
    fail("[checkpoint] {}: not valid JSON ({})", path, e.what());
  }
}

std::optional<std::string> step_run_id(const fs::path& step) {
  try {
    const nlohmann::json j =
        nlohmann::json::parse(read_text((step / "trainer_state.json").string()));
    return j.value("run_id", "");
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace detail

namespace {

using detail::kRunRecord;
using detail::path_exists;
using detail::read_json;
using detail::read_text;
using detail::step_run_id;
using detail::write_atomically;

std::string step_name(int64_t step) {
  return fmt::format("step-{:09d}", step);
}

nlohmann::json to_json(const TrainingState& s) {
  nlohmann::json j = {{"epoch", s.epoch},
                      {"step_in_epoch", s.step_in_epoch},
                      {"global_step", s.global_step},
                      {"scheduler_last", s.scheduler_last},
                      {"loss_scaler", s.scaler},
                      {"layout", s.layout},
                      {"version", s.version},
                      {"format", "colossalai-cpp checkpoint 1"}};
  if (!s.run_id.empty()) j["run_id"] = s.run_id;
  return j;
}

// A counter of trainer_state.json: a JSON integer in int64_t (nlohmann would cast 1e300 or 2.5
// to int64_t, undefined behaviour for the first).
int64_t counter_of(const nlohmann::json& j, const char* key, const std::string& path) {
  const nlohmann::json& v = j.at(key);
  CAI_CHECK(v.is_number_integer(), "[checkpoint] {}: {} is {}, expected an integer", path, key,
            v.dump());
  CAI_CHECK(!v.is_number_unsigned() ||
                v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
            "[checkpoint] {}: {} = {} is beyond 64-bit integers", path, key, v.dump());
  return v.get<int64_t>();
}

TrainingState from_json(const nlohmann::json& j, const std::string& path) {
  TrainingState s;
  try {
    s.epoch = counter_of(j, "epoch", path);
    s.step_in_epoch = counter_of(j, "step_in_epoch", path);
    s.global_step = counter_of(j, "global_step", path);
    s.scheduler_last = counter_of(j, "scheduler_last", path);
    const nlohmann::json& sc = j.at("loss_scaler");
    CAI_CHECK(sc.is_array() && std::all_of(sc.begin(), sc.end(),
                                           [](const nlohmann::json& x) { return x.is_number(); }),
              "[checkpoint] {}: loss_scaler is {}, expected a list of numbers", path,
              sc.dump().substr(0, 200));
    s.scaler = sc.get<std::vector<double>>();
    s.layout = j.value("layout", "");
    s.version = j.value("version", "");
    s.run_id = j.value("run_id", "");
  } catch (const nlohmann::json::exception& e) {
    fail("[checkpoint] {}: {}", path, e.what());
  }
  CAI_CHECK(s.epoch >= 0 && s.step_in_epoch >= 0 && s.global_step >= 0 && s.scheduler_last >= 0,
            "[checkpoint] {}: negative epoch/step values", path);
  return s;
}

constexpr const char* kIndex = "checkpoint.index.json";

std::string rank_file(const char* kind, int r, int world) {
  return fmt::format("{}-rank{:05d}-of-{:05d}.safetensors", kind, r, world);
}

void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream f(path, std::ios::trunc);
  CAI_CHECK(f.good(), "[checkpoint] cannot write {}", path);
  f << j.dump(1) << "\n";
  f.flush();
  CAI_CHECK(f.good(), "[checkpoint] error writing {}", path);
}

// Every rank learns whether any failed: the failing rank throws its own error, the others say
// that another rank failed (its log names the error). Collective.
void agree(train::Plugin& plugin, const std::string& err, const std::string& what) {
  const double bad = plugin.all_reduce_max(err.empty() ? 0.0 : 1.0);
  if (!err.empty()) throw Error(err);
  CAI_CHECK(bad == 0.0, "[checkpoint] {}: another rank failed (its log names the error)", what);
}

// Removes this run's (cfg.run_id's) older complete checkpoints beyond keep_last, never `newest`;
// none while DIR/run.json names another run, and never a checkpoint of another run.
void prune(const CheckpointConfig& cfg, const std::string& newest) {
  if (cfg.keep_last <= 0) return;
  try {
    const std::optional<RunRecord> owner = read_run_record(cfg.dir);
    if (owner && owner->run_id != cfg.run_id) {
      log::warn("[checkpoint] keep_last: {}/{} names run {}, not this run ({}): nothing removed",
                cfg.dir, kRunRecord, owner->run_id, cfg.run_id.empty() ? "no run id" : cfg.run_id);
      return;
    }
  } catch (const Error& e) {
    log::warn("[checkpoint] keep_last: nothing removed: {}", e.what());
    return;
  }
  std::vector<std::string> steps;
  for (const auto& e : fs::directory_iterator(cfg.dir)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory() && n.rfind("step-", 0) == 0 && n.find('.') == std::string::npos &&
        fs::exists(e.path() / "trainer_state.json") && step_run_id(e.path()) == cfg.run_id)
      steps.push_back(n);
  }
  std::sort(steps.begin(), steps.end());
  for (size_t i = 0; i + static_cast<size_t>(cfg.keep_last) < steps.size(); ++i)
    if (steps[i] != newest) fs::remove_all(cfg.dir + "/" + steps[i]);
}

// trainer_state.json last (what marks a directory complete), the commit, then `latest`.
void finish_rank0(const CheckpointConfig& cfg, AtomicDir& out, const TrainingState& state) {
  // trainer_state.json last, once everything else is on disk: a temporary directory holding it
  // is complete, one without it (a job killed before) is refused by the loader.
  out.flush_files();
  write_json(out.path() + "/trainer_state.json", to_json(state));
  out.commit();
  write_atomically(cfg.dir + "/latest", step_name(state.global_step) + "\n");
  prune(cfg, step_name(state.global_step));
}

nlohmann::json spec_json(const nn::ShardSpec& s) {
  nlohmann::json cuts = nlohmann::json::array();
  for (const nn::ShardCut& c : s.cuts) cuts.push_back({c.dim, c.groups, c.count, c.stride});
  return {{"rank", s.rank}, {"size", s.size}, {"cuts", cuts}};
}

int64_t json_int(const nlohmann::json& j, const char* key, const std::string& where) {
  CAI_CHECK(j.is_object() && j.contains(key) && j[key].is_number_integer(),
            "[checkpoint] {}: '{}' missing or not an integer", where, key);
  return j[key].get<int64_t>();
}

Shape json_shape(const nlohmann::json& j, const std::string& where) {
  CAI_CHECK(j.is_array() && j.size() <= 8, "[checkpoint] {}: shape {} is not a list of sizes",
            where, j.dump());
  Shape s;
  uint64_t numel = 1;
  for (const auto& d : j) {
    CAI_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0 && d.get<int64_t>() <= (1ll << 40),
              "[checkpoint] {}: bad dimension {} in shape {}", where, d.dump(), j.dump());
    const uint64_t v = d.get<uint64_t>();
    CAI_CHECK(v == 0 || numel <= (uint64_t{1} << 40) / v, "[checkpoint] {}: shape {} overflows",
              where, j.dump());
    numel *= v;
    s.push_back(static_cast<int64_t>(v));
  }
  return s;
}

nn::ShardSpec json_spec(const nlohmann::json& j, const Shape& full, const std::string& where) {
  nn::ShardSpec s;
  s.rank = static_cast<int>(json_int(j, "rank", where));
  s.size = static_cast<int>(json_int(j, "size", where));
  CAI_CHECK(s.size >= 1 && s.size <= 65536 && s.rank >= 0 && s.rank < s.size,
            "[checkpoint] {}: tensor-parallel rank {} of {}", where, s.rank, s.size);
  CAI_CHECK(j.contains("cuts") && j["cuts"].is_array() && j["cuts"].size() <= 8,
            "[checkpoint] {}: 'cuts' is not a list", where);
  for (const auto& c : j["cuts"]) {
    CAI_CHECK(c.is_array() && c.size() == 4,
              "[checkpoint] {}: cut {} is not [dim, groups, "
              "count, stride]",
              where, c.dump());
    int v[4];
    for (int i = 0; i < 4; ++i) {
      CAI_CHECK(c[i].is_number_integer() && c[i].get<int64_t>() >= (i == 0 ? 0 : 1) &&
                    c[i].get<int64_t>() <= 65536,
                "[checkpoint] {}: cut {} is not [dim, groups, count, stride]", where, c.dump());
      v[i] = static_cast<int>(c[i].get<int64_t>());
    }
    s.cuts.push_back(nn::ShardCut{v[0], v[1], v[2], v[3]});
  }
  if (s.sharded()) s.full = full;
  return s;
}

// One section ("model" or "optimizer") of a per-rank checkpoint's index, put back together.
std::map<std::string, Tensor> assemble(const std::string& dir, const nlohmann::json& index,
                                       const char* section,
                                       std::map<std::string, SafetensorsFile>& files) {
  const std::string index_path = dir + "/" + kIndex;
  CAI_CHECK(index.contains(section) && index[section].is_object(),
            "[checkpoint] {}: no '{}' object", index_path, section);
  std::map<std::string, Tensor> out;
  for (auto it = index[section].begin(); it != index[section].end(); ++it) {
    const std::string& name = it.key();
    const std::string where = fmt::format("{} ('{}')", index_path, name);
    const auto& e = it.value();
    CAI_CHECK(e.is_object() && e.contains("shape") && e.contains("slices") &&
                  e["slices"].is_array() && !e["slices"].empty(),
              "[checkpoint] {}: needs a shape and a non-empty list of slices", where);
    const Shape full = json_shape(e["shape"], where);
    struct Slice {
      nn::ShardSpec spec;
      int64_t begin, end;
      std::string file;
    };
    std::vector<Slice> slices;
    for (const auto& j : e["slices"]) {
      CAI_CHECK(j.is_object() && j.contains("file") && j["file"].is_string() && j.contains("tp"),
                "[checkpoint] {}: slice {} needs file, tp, begin and end", where, j.dump());
      Slice sl{json_spec(j["tp"], full, where), json_int(j, "begin", where),
               json_int(j, "end", where), j["file"].get<std::string>()};
      // A name of at most 255 bytes (NAME_MAX): longer ones made fs::exists throw
      // std::filesystem::filesystem_error, not cai::Error (found by the fuzzer).
      CAI_CHECK(!sl.file.empty() && sl.file.size() <= 255 &&
                    sl.file.find('/') == std::string::npos &&
                    sl.file.find('\0') == std::string::npos && sl.file != "." && sl.file != "..",
                "[checkpoint] {}: '{}' is not a file of that directory", where, sl.file);
      if (!slices.empty()) {
        const nn::ShardSpec& a = slices[0].spec;
        bool same = sl.spec.size == a.size && sl.spec.cuts.size() == a.cuts.size();
        for (size_t i = 0; same && i < a.cuts.size(); ++i)
          same = sl.spec.cuts[i].dim == a.cuts[i].dim &&
                 sl.spec.cuts[i].groups == a.cuts[i].groups &&
                 sl.spec.cuts[i].count == a.cuts[i].count &&
                 sl.spec.cuts[i].stride == a.cuts[i].stride;
        CAI_CHECK(same, "[checkpoint] {}: its slices are cut differently", where);
      }
      slices.push_back(std::move(sl));
    }
    const nn::ShardSpec& spec0 = slices[0].spec;
    Shape local = full;
    try {
      if (spec0.sharded()) local = nn::shard_local_shape(spec0);
    } catch (const Error& err) {
      fail("[checkpoint] {}: its tensor-parallel cut does not fit {}: {}", where, shape_str(full),
           err.what());
    }
    const int64_t n = shape_numel(local);
    std::vector<Tensor> parts(static_cast<size_t>(spec0.size));
    for (int r = 0; r < spec0.size; ++r) {
      int first = r;  // ranks holding the same part share the lowest one's copy
      for (int q = 0; q < r && first == r; ++q)
        if (spec0.same_part(q, r)) first = q;
      if (first != r) {
        parts[r] = parts[first];
        continue;
      }
      std::vector<const Slice*> mine;
      for (const Slice& sl : slices)
        if (spec0.same_part(sl.spec.rank, r)) mine.push_back(&sl);
      std::sort(mine.begin(), mine.end(),
                [](const Slice* a, const Slice* b) { return a->begin < b->begin; });
      // Check the ranges and the files' tensors before allocating anything of the index's size.
      std::vector<const Tensor*> data;
      int64_t at = 0;
      for (const Slice* sl : mine) {
        CAI_CHECK(sl->begin == at && sl->end >= sl->begin && sl->end <= n,
                  "[checkpoint] {}: tensor-parallel part {} of {}: slice [{}, {}) in {} where "
                  "[{}, ...) of {} elements was expected ({})",
                  where, r, spec0.size, sl->begin, sl->end, sl->file, at, n,
                  sl->begin < at ? "overlapping" : "elements missing");
        auto f = files.find(sl->file);
        if (f == files.end()) {
          const std::string path = dir + "/" + sl->file;
          std::error_code ec;
          CAI_CHECK(fs::is_regular_file(path, ec),
                    "[checkpoint] {}: its elements [{}, {}) are in {}, which does not exist (a "
                    "shard is missing)",
                    where, sl->begin, sl->end, path);
          f = files.emplace(sl->file, load_safetensors(path)).first;
        }
        const auto t = f->second.tensors.find(name);
        CAI_CHECK(t != f->second.tensors.end(),
                  "[checkpoint] {}/{}: no tensor '{}' (the index {} says it holds its elements "
                  "[{}, {}))",
                  dir, sl->file, name, kIndex, sl->begin, sl->end);
        CAI_CHECK(t->second.dtype() == DType::F32 && t->second.numel() == sl->end - sl->begin,
                  "[checkpoint] {}/{}: '{}' is {} {}, the index expects F32 [{}] (elements [{}, "
                  "{}))",
                  dir, sl->file, name, dtype_name(t->second.dtype()), shape_str(t->second.shape()),
                  sl->end - sl->begin, sl->begin, sl->end);
        data.push_back(&t->second);
        at = sl->end;
      }
      CAI_CHECK(at == n,
                "[checkpoint] {}: tensor-parallel part {} of {} has elements [0, {}) of {} in "
                "the slices (a shard is missing from the index)",
                where, r, spec0.size, at, n);
      Tensor part = Tensor::empty({n}, DType::F32);
      for (size_t i = 0; i < mine.size(); ++i)
        part.narrow(mine[i]->begin, mine[i]->end - mine[i]->begin)
            .copy_from(data[i]->reshape({mine[i]->end - mine[i]->begin}));
      parts[r] = part.reshape(local);
    }
    out[name] = spec0.sharded() ? nn::unshard(parts, spec0) : parts[0];
  }
  return out;
}

std::string save_per_rank(const CheckpointConfig& cfg, train::Trainer& trainer,
                          const TrainingState& state) {
  train::Plugin& plugin = trainer.plugin();
  const int rank = plugin.rank(), world = plugin.world_size();
  const std::string name = step_name(state.global_step);
  const std::string final_dir = cfg.dir + "/" + name, tmp = final_dir + ".tmp";
  std::unique_ptr<AtomicDir> out;  // rank 0's
  std::string err;
  try {
    if (rank == 0) {
      fs::create_directories(cfg.dir);
      out = std::make_unique<AtomicDir>(final_dir, tmp, true);
    }
  } catch (const std::exception& e) {
    err = e.what();
  }
  agree(plugin, err, "creating " + tmp);
  // Every rank writes and flushes its own files; nothing is gathered.
  try {
    const std::vector<train::OwnedSlice> mine =
        plugin.owned_state(trainer.model(), trainer.optimizer());
    std::map<std::string, Tensor> model, optimizer;
    nlohmann::json frag = nlohmann::json::array();
    const std::string mf = rank_file("model", rank, world),
                      of = rank_file("optimizer", rank, world);
    for (const train::OwnedSlice& s : mine) {
      auto& dst = s.optimizer ? optimizer : model;
      CAI_CHECK(dst.emplace(s.name, s.data).second, "[checkpoint] rank {} owns two slices of {}",
                rank, s.name);
      frag.push_back({{"name", s.name},
                      {"optimizer", s.optimizer},
                      {"shape", s.full},
                      {"file", s.optimizer ? of : mf},
                      {"tp", spec_json(s.spec)},
                      {"begin", s.begin},
                      {"end", s.end}});
    }
    const Metadata meta{{"format", "colossalai-cpp per-rank shard"},
                        {"rank", std::to_string(rank)},
                        {"world_size", std::to_string(world)}};
    for (const auto& [file, tensors] : {std::pair{mf, &model}, std::pair{of, &optimizer}}) {
      save_safetensors(tmp + "/" + file, *tensors, meta);
      fsync_path(tmp + "/" + file, false);
    }
    const std::string fp = fmt::format("{}/index-rank{:05d}.json", tmp, rank);
    write_json(fp, frag);
    fsync_path(fp, false);
  } catch (const std::exception& e) {
    err = e.what();
  }
  agree(plugin, err, "writing " + tmp);
  // Rank 0: the index from every rank's fragment, trainer_state.json, the commit.
  try {
    if (rank == 0) {
      nlohmann::json index = {{"format", "colossalai-cpp per-rank checkpoint 1"},
                              {"world_size", world},
                              {"layout", state.layout},
                              {"model", nlohmann::json::object()},
                              {"optimizer", nlohmann::json::object()}};
      for (int r = 0; r < world; ++r) {
        const std::string fp = fmt::format("{}/index-rank{:05d}.json", tmp, r);
        for (const auto& s : read_json(fp)) {
          auto& e = index[s["optimizer"].get<bool>() ? "optimizer" : "model"][s["name"]];
          if (e.is_null()) e = {{"shape", s["shape"]}, {"slices", nlohmann::json::array()}};
          CAI_CHECK(e["shape"] == s["shape"], "[checkpoint] {}: {} is {}, another rank said {}", fp,
                    s["name"].dump(), s["shape"].dump(), e["shape"].dump());
          e["slices"].push_back(
              {{"file", s["file"]}, {"tp", s["tp"]}, {"begin", s["begin"]}, {"end", s["end"]}});
        }
        fs::remove(fp);
      }
      write_json(tmp + "/" + kIndex, index);
      finish_rank0(cfg, *out, state);
      log::info("[checkpoint] saved {} (step {}, epoch {}; {} ranks wrote their shards)", final_dir,
                state.global_step, state.epoch, world);
    }
  } catch (const std::exception& e) {
    err = e.what();
  }
  agree(plugin, err, "committing " + final_dir);
  return final_dir;
}

}  // namespace

std::string save_checkpoint(const CheckpointConfig& cfg, train::Trainer& trainer,
                            optim::LRScheduler* scheduler, const TrainingState& state0) {
  CAI_CHECK(!cfg.dir.empty(), "[checkpoint] no checkpoint.dir");
  train::Plugin& plugin = trainer.plugin();
  TrainingState state = state0;
  state.scheduler_last = scheduler ? scheduler->last() : 0;
  if (auto* s = trainer.grad_scaler()) state.scaler = s->state();
  state.layout = cfg.layout;
  state.run_id = cfg.run_id;
  state.version = fmt::format("{} ({})", version(), git_hash());
  if (cfg.per_rank) return save_per_rank(cfg, trainer, state);
  // Collective gathers first: every rank takes part.
  std::map<std::string, Tensor> model = plugin.full_model_state(trainer.model());
  std::map<std::string, Tensor> optimizer =
      plugin.full_optimizer_state(trainer.model(), trainer.optimizer());
  const std::string final_dir = cfg.dir + "/" + step_name(state.global_step);
  std::string err;
  try {
    if (plugin.rank() == 0) {
      fs::create_directories(cfg.dir);
      // The same step saved again replaces the old one only once the new one is complete.
      AtomicDir out(final_dir, final_dir + ".tmp", true);
      if (cfg.export_dtype != DType::F32)
        for (auto& [k, v] : model) v = v.to(cfg.export_dtype);
      save_sharded(out.path(), model, cfg.max_shard_bytes,
                   {{"format", "pt"}, {"source", "colossalai-cpp"}});
      save_safetensors(out.path() + "/optimizer.safetensors", optimizer);
      finish_rank0(cfg, out, state);
      log::info("[checkpoint] saved {} (step {}, epoch {})", final_dir, state.global_step,
                state.epoch);
    }
  } catch (const std::exception& e) {
    err = e.what();
  }
  agree(plugin, err, "saving " + final_dir);
  return final_dir;
}

std::string resolve_checkpoint(const std::string& p) {
  CAI_CHECK(path_exists(p), "[checkpoint] {} does not exist", p);
  if (path_exists(fs::path(p) / "trainer_state.json")) return p;
  const fs::path latest = fs::path(p) / "latest";
  CAI_CHECK(path_exists(latest),
            "[checkpoint] {} holds no checkpoint (neither trainer_state.json nor latest)", p);
  std::string name = read_text(latest.string());
  name.erase(name.find_last_not_of(" \n\r\t") + 1);
  CAI_CHECK(!name.empty() && name.find('/') == std::string::npos,
            "[checkpoint] {} names '{}', not a checkpoint of that directory", latest.string(),
            name);
  const fs::path dir = fs::path(p) / name;
  CAI_CHECK(path_exists(dir / "trainer_state.json"),
            "[checkpoint] {} names {}, which is incomplete", latest.string(), dir.string());
  return dir.string();
}

TrainingState parse_training_state(const std::string& text, const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("[checkpoint] {}: not valid JSON ({})", path, e.what());
  }
  CAI_CHECK(j.is_object(), "[checkpoint] {}: not a JSON object", path);
  return from_json(j, path);
}

Checkpoint load_checkpoint(const std::string& path) {
  Checkpoint c;
  c.path = resolve_checkpoint(path);
  const std::string sj = c.path + "/trainer_state.json";
  c.state = parse_training_state(read_text(sj), sj);
  if (path_exists(c.path + "/" + kIndex)) {
    const nlohmann::json index = read_json(c.path + "/" + kIndex);
    CAI_CHECK(index.is_object(), "[checkpoint] {}/{}: not a JSON object", c.path, kIndex);
    std::map<std::string, SafetensorsFile> files;
    c.model = assemble(c.path, index, "model", files);
    c.optimizer = assemble(c.path, index, "optimizer", files);
    return c;
  }
  c.model = load_model_weights(c.path).tensors;
  for (auto& [k, v] : c.model)
    if (v.dtype() != DType::F32) v = v.to(DType::F32);
  c.optimizer = load_safetensors(c.path + "/optimizer.safetensors").tensors;
  return c;
}

std::map<std::string, Tensor> load_weights(const std::string& path) {
  const fs::path p(path);
  std::error_code ec;
  if (fs::is_directory(p, ec) && !path_exists(p / "model.safetensors") &&
      !path_exists(p / "model.safetensors.index.json"))
    return load_checkpoint(path).model;
  return load_model_weights(path).tensors;
}

void export_consolidated(const std::string& checkpoint, const std::string& out_dir,
                         int64_t max_shard_bytes, DType dtype) {
  std::map<std::string, Tensor> model = load_weights(checkpoint);
  AtomicDir out(out_dir);
  for (auto& [k, v] : model)
    if (v.dtype() != dtype) v = v.to(dtype);
  save_sharded(out.path(), model, max_shard_bytes,
               {{"format", "pt"}, {"source", "colossalai-cpp"}});
  out.commit();
}

void load_model_state(nn::ViT& model, const std::map<std::string, Tensor>& full,
                      const std::set<std::string>& skip, bool allow_unexpected,
                      const std::string& origin) {
  std::set<std::string> seen;
  for (nn::Parameter* p : model.parameters()) {
    seen.insert(p->name);
    if (skip.count(p->name)) continue;
    const auto it = full.find(p->name);
    CAI_CHECK(it != full.end(), "[checkpoint] {} has no '{}' (the model needs it)", origin,
              p->name);
    const Shape want = p->full_shape();
    CAI_CHECK(it->second.shape() == want, "[checkpoint] '{}' is {} in {}, the model has {}",
              p->name, shape_str(it->second.shape()), origin, shape_str(want));
    CAI_CHECK(p->value.defined(), "[checkpoint] load '{}' before the plugin's setup()", p->name);
    Tensor v = it->second.dtype() == DType::F32 ? it->second : it->second.to(DType::F32);
    p->value.copy_from(p->shard.sharded() ? nn::shard_of(v.to(Device::cpu()), p->shard) : v);
  }
  if (!allow_unexpected)
    for (const auto& [k, v] : full)
      CAI_CHECK(seen.count(k), "[checkpoint] {} has '{}', which the model does not", origin, k);
}

}  // namespace cai::checkpoint
