// Checkpoint and resume in one process: a run interrupted after step k and resumed from its
// checkpoint (a fresh model, optimizer, scheduler and loader) continues bit for bit like the run
// that was never interrupted — losses of every later step and the final parameters — with dropout,
// gradient accumulation, a step-based cosine schedule and fp16 loss scaling; a checkpoint loads in
// timm's names; keep_last keeps the newest. RunIdentity: the run that owns a directory (run.json),
// refusing it to a new run, overwrite, resume, keep_last sparing other runs, the lock.
#include <gtest/gtest.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>

#include <nlohmann/json.hpp>

#include "cai/checkpoint/checkpoint.h"
#include "cai/core/error.h"
#include "cai/data/data.h"
#include "cai/nn/vit.h"
#include "cai/optim/lr_scheduler.h"
#include "cai/optim/optimizer.h"
#include "cai/train/trainer.h"

using namespace cai;
namespace fs = std::filesystem;

// A seam to see what the library flushes: this executable's fsync, to which the library's calls
// bind, records the path of each descriptor while g_fsyncs is set, then does the real fsync.
namespace {
std::mutex g_fsync_mutex;
std::vector<std::string>* g_fsyncs = nullptr;
}  // namespace

extern "C" int fsync(int fd) {
  {
    const std::lock_guard<std::mutex> lock(g_fsync_mutex);
    if (g_fsyncs) {
      std::error_code ec;
      const fs::path p = fs::read_symlink("/proc/self/fd/" + std::to_string(fd), ec);
      g_fsyncs->push_back(ec ? "?" : p.string());
    }
  }
  return static_cast<int>(::syscall(SYS_fsync, fd));
}

namespace {
const char* kFmnist = "/usr/share/datasets/fashion-mnist";

class Losses : public train::Hook {
 public:
  std::vector<double> v;
  void after_step(train::Trainer&, const train::StepInfo& s) override { v.push_back(s.loss); }
};

struct TrainRun {
  std::vector<double> losses;
  std::map<std::string, Tensor> params;
  int64_t steps_left = -1;  // Trainer::steps_left() before fit()
  size_t epochs = 0;        // epochs fit() ran
};

// 2 epochs of 5 steps (batch 8, 2 micro-batches of 4), optionally checkpointing every 3 steps
// (and every `every_epochs` epochs), optionally resuming from `resume`, optionally writing a
// metrics file (a step record every step).
TrainRun train_run(const std::string& ckpt_dir, const std::string& resume, DType precision,
                   bool per_rank = false, int64_t embed_dim = 16, const std::string& metrics = {},
                   int64_t every_epochs = 0, const std::string& run_id = {}) {
  auto ds = data::subset(data::load_mnist_dir(kFmnist, true, "fashion-mnist"), 40);
  data::LoaderConfig lc;
  lc.batch_size = 4;
  lc.seed = 3;
  lc.num_workers = 1;
  lc.transform.normalize = data::normalization_for("fashion_mnist");
  lc.transform.random_crop = 28, lc.transform.crop_padding = 2;
  data::DataLoader loader(ds, lc);
  nn::ViTConfig c;
  c.img_size = 28, c.patch_size = 7, c.in_chans = 1, c.num_classes = 10, c.embed_dim = embed_dim;
  c.depth = 2, c.num_heads = 2, c.mlp_ratio = 2.0, c.drop_rate = 0.1f, c.drop_path_rate = 0.1f;
  nn::ViT model(c);
  model.init(1);
  checkpoint::Checkpoint ck;
  if (!resume.empty()) {
    ck = checkpoint::load_checkpoint(resume);
    checkpoint::load_model_state(model, ck.model, {}, false, ck.path);
  }
  auto plugin = std::make_shared<train::Plugin>();
  plugin->setup(model);
  optim::AdamW opt(optim::weight_decay_groups(model.parameters(), 5e-3, 0.05));
  auto sched = optim::make_scheduler("cosine", opt, 10, 2);
  train::TrainerConfig tc;
  tc.num_epochs = 2;
  tc.gradient_accumulation = 2;
  tc.clip_grad_norm = 1.0;
  tc.precision = precision;
  tc.grad_scaler.initial_scale = 1024;
  tc.grad_scaler.growth_interval = 2;  // the scale changes during the run
  tc.seed = 9;
  train::Booster booster(plugin);
  auto t =
      booster.boost(model, opt, train::Criterion{0.1f}, loader, nullptr, sched.get(), false, tc);
  auto losses = std::make_shared<Losses>();
  t->add_hook(losses);
  if (!ckpt_dir.empty()) {
    checkpoint::CheckpointConfig cc;
    cc.dir = ckpt_dir;
    cc.every_steps = 3;
    cc.every_epochs = every_epochs;
    cc.keep_last = 2;
    cc.per_rank = per_rank;
    cc.run_id = run_id;
    t->add_hook(std::make_shared<checkpoint::CheckpointHook>(cc, sched.get()));
  }
  if (!resume.empty()) {
    plugin->load_optimizer_state(model, opt, ck.optimizer);
    sched->set_last(ck.state.scheduler_last);
    if (auto* s = t->grad_scaler()) s->load_state(ck.state.scaler);
    t->resume_at(ck.state.epoch, ck.state.step_in_epoch, ck.state.global_step, ck.path);
  }
  if (!metrics.empty()) t->add_hook(std::make_shared<train::MetricsFileHook>(metrics, 1));
  TrainRun r;
  r.steps_left = t->steps_left();
  t->fit();
  r.epochs = t->history().size();
  r.losses = losses->v;
  for (nn::Parameter* p : model.parameters()) r.params[p->name] = p->value.clone();
  return r;
}

void expect_bit_exact_resume(DType precision, bool per_rank = false) {
  const std::string dir =
      (fs::temp_directory_path() /
       ("cai_resume_" + std::string(dtype_name(precision)) + (per_rank ? "_per_rank" : "")))
          .string();
  fs::remove_all(dir);
  const TrainRun whole = train_run(dir, "", precision, per_rank);
  ASSERT_EQ(whole.losses.size(), 10u);
  // every 3 steps: step 3 (epoch 0), 6 (epoch 1 step 1), 9; keep_last 2 keeps 6 and 9.
  EXPECT_FALSE(fs::exists(dir + "/step-000000003"));
  ASSERT_TRUE(fs::exists(dir + (per_rank ? "/step-000000006/model-rank00000-of-00001.safetensors"
                                         : "/step-000000006/model.safetensors")));
  EXPECT_EQ(fs::exists(dir + "/step-000000006/checkpoint.index.json"), per_rank);
  EXPECT_EQ(checkpoint::resolve_checkpoint(dir), dir + "/step-000000009");
  for (const char* from : {"step-000000006", "step-000000009"}) {
    SCOPED_TRACE(from);
    const TrainRun resumed = train_run("", dir + "/" + from, precision);
    const size_t k = whole.losses.size() - resumed.losses.size();
    ASSERT_EQ(k, std::string(from) == "step-000000006" ? 6u : 9u);
    for (size_t i = 0; i < resumed.losses.size(); ++i)
      EXPECT_EQ(resumed.losses[i], whole.losses[k + i]) << "step " << k + i + 1;
    for (const auto& [name, v] : whole.params) {
      const Tensor& w = resumed.params.at(name);
      EXPECT_EQ(std::memcmp(v.raw(), w.raw(), v.nbytes()), 0) << name;
    }
  }
}
}  // namespace

TEST(Checkpoint, ResumeIsBitExactInFp32) {
  expect_bit_exact_resume(DType::F32);
}

TEST(Checkpoint, ResumeIsBitExactWithFp16LossScaling) {
  expect_bit_exact_resume(DType::F16);
}

TEST(Checkpoint, PerRankResumeIsBitExact) {
  expect_bit_exact_resume(DType::F32, true);
}

namespace {
std::vector<nlohmann::json> read_records(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}
}  // namespace

// Issue 42: a resumed run truncated the metrics file of the run it continued, and resuming a run
// that had finished found no step left (vit_train then read the last epoch of an empty history).
TEST(Checkpoint, ResumedRunAppendsToItsMetricsFile) {
  const std::string dir = (fs::temp_directory_path() / "cai_resume_metrics").string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string metrics = dir + "/metrics.jsonl";
  std::ofstream(metrics) << "{\"type\": \"step\", \"step\": 99}\n";  // a fresh run starts anew
  // Saving every 3 steps and at the end of each epoch, keeping the last 2: steps 9 and 10.
  const TrainRun whole = train_run(dir + "/ck", "", DType::F32, false, 16, metrics, 1);
  EXPECT_EQ(whole.steps_left, 10);
  const auto before = read_records(metrics);
  ASSERT_EQ(before.size(), 12u);  // 10 step records and 2 epoch records
  EXPECT_EQ(before.front()["type"], "step");
  EXPECT_EQ(before.front()["step"], 1);
  EXPECT_EQ(before.back()["type"], "epoch");
  EXPECT_EQ(before.back()["step"], 10);

  // From step 9 (the second epoch, 4 of its 5 steps done): the records stay, then where it
  // resumed, then step 10 and the second epoch's record.
  const std::string from = dir + "/ck/step-000000009";
  const TrainRun rest = train_run("", from, DType::F32, false, 16, metrics);
  EXPECT_EQ(rest.steps_left, 1);
  ASSERT_EQ(rest.losses.size(), 1u);
  EXPECT_EQ(rest.losses[0], whole.losses[9]);
  const auto after = read_records(metrics);
  ASSERT_EQ(after.size(), 15u);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(after[i], before[i]) << "record " << i;
  EXPECT_EQ(after[12], (nlohmann::json{{"type", "resume"},
                                       {"epoch", 2},
                                       {"step_in_epoch", 4},
                                       {"step", 9},
                                       {"checkpoint", from}}));
  EXPECT_EQ(after[13]["type"], "step");
  EXPECT_EQ(after[13]["step"], 10);
  EXPECT_EQ(after[14]["type"], "epoch");
  EXPECT_EQ(after[14]["step"], 10);

  // From the end (step 10, saved after the last epoch): no step left, fit() runs none and adds
  // only the record of where it resumed.
  const std::string end = dir + "/ck/step-000000010";
  const TrainRun none = train_run("", end, DType::F32, false, 16, metrics);
  EXPECT_EQ(none.steps_left, 0);
  EXPECT_TRUE(none.losses.empty());
  EXPECT_EQ(none.epochs, 0u);
  const auto last = read_records(metrics);
  ASSERT_EQ(last.size(), 16u);
  EXPECT_EQ(last.back()["type"], "resume");
  EXPECT_EQ(last.back()["step"], 10);
  EXPECT_EQ(last.back()["checkpoint"], end);
}

// Issue 42: `latest` was replaced by a rename without the fsyncs its comment promised, so after a
// power loss it could name nothing or an older step. Each save now fsyncs latest.tmp before the
// rename and the directory after it.
TEST(Checkpoint, LatestIsFsyncedAndItsDirectoryAfterTheRename) {
  const fs::path root = fs::temp_directory_path() / "cai_latest_fsync";
  fs::remove_all(root);
  fs::create_directories(root);
  const std::string dir = fs::canonical(root).string();  // as /proc/self/fd names it
  std::vector<std::string> fsyncs;
  {
    const std::lock_guard<std::mutex> lock(g_fsync_mutex);
    g_fsyncs = &fsyncs;
  }
  train_run(dir, "", DType::F32);  // saves steps 3, 6 and 9
  {
    const std::lock_guard<std::mutex> lock(g_fsync_mutex);
    g_fsyncs = nullptr;
  }
  std::ifstream latest(dir + "/latest");
  const std::string text((std::istreambuf_iterator<char>(latest)),
                         std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "step-000000009\n");
  EXPECT_FALSE(fs::exists(dir + "/latest.tmp"));
  int saves = 0;
  for (size_t i = 0; i < fsyncs.size(); ++i) {
    if (fsyncs[i] != dir + "/latest.tmp") continue;
    ++saves;
    ASSERT_LT(i + 1, fsyncs.size());
    EXPECT_EQ(fsyncs[i + 1], dir) << "after the fsync of latest.tmp: the directory";
  }
  EXPECT_EQ(saves, 3);
}

namespace {
// A per-rank checkpoint (one process) to break in each test, copied to `name`.
std::string per_rank_copy(const std::string& name) {
  static const std::string src = [] {
    // Per process: ctest runs each test in its own process, several at once.
    const std::string d =
        (fs::temp_directory_path() / ("cai_per_rank_src_" + std::to_string(::getpid()))).string();
    fs::remove_all(d);
    train_run(d, "", DType::F32, true);
    return d + "/step-000000009";
  }();
  const std::string dst = (fs::temp_directory_path() / ("cai_bad_" + name)).string();
  fs::remove_all(dst);
  fs::copy(src, dst, fs::copy_options::recursive);
  return dst;
}

// load_checkpoint(dir) throws an error containing each of `parts`.
void expect_load_error(const std::string& dir, const std::vector<std::string>& parts) {
  try {
    checkpoint::load_checkpoint(dir);
    FAIL() << "loaded " << dir;
  } catch (const Error& e) {
    for (const std::string& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << p << " in: " << e.what();
  }
}

nlohmann::json read_index(const std::string& dir) {
  std::ifstream f(dir + "/checkpoint.index.json");
  return nlohmann::json::parse(f);
}
void write_index(const std::string& dir, const nlohmann::json& j) {
  std::ofstream(dir + "/checkpoint.index.json") << j.dump(1);
}
const char* kModelShard = "model-rank00000-of-00001.safetensors";
}  // namespace

TEST(CheckpointErrors, TruncatedShardNamesTheFile) {
  const std::string d = per_rank_copy("truncated");
  const std::string f = d + "/" + kModelShard;
  fs::resize_file(f, fs::file_size(f) / 2);
  expect_load_error(d, {f, "outside the"});
}

TEST(CheckpointErrors, MissingShardNamesTheFile) {
  const std::string d = per_rank_copy("missing");
  fs::remove(d + "/optimizer-rank00000-of-00001.safetensors");
  expect_load_error(d, {d + "/optimizer-rank00000-of-00001.safetensors", "does not exist"});
}

TEST(CheckpointErrors, IndexNamingAnAbsentFile) {
  const std::string d = per_rank_copy("absent");
  auto j = read_index(d);
  j["model"]["pos_embed"]["slices"][0]["file"] = "model-rank00003-of-00004.safetensors";
  write_index(d, j);
  expect_load_error(d,
                    {"'pos_embed'", d + "/model-rank00003-of-00004.safetensors", "does not exist"});
  j["model"]["pos_embed"]["slices"][0]["file"] = "../elsewhere.safetensors";
  write_index(d, j);
  expect_load_error(d, {"'pos_embed'", "not a file of that directory"});
  // Fuzzer-found: a name beyond NAME_MAX made std::filesystem throw its own error type.
  j["model"]["pos_embed"]["slices"][0]["file"] = std::string(300, '[') + ".safetensors";
  write_index(d, j);
  expect_load_error(d, {"'pos_embed'", "not a file of that directory"});
  expect_load_error(d + "/" + std::string(300, 'x'), {"does not exist"});
}

TEST(CheckpointErrors, SlicesThatDoNotCoverTheTensor) {
  const std::string d = per_rank_copy("uncovered");
  auto j = read_index(d);
  j["model"]["cls_token"]["slices"][0]["end"] = 7;  // of 16 elements
  write_index(d, j);
  expect_load_error(d, {"'cls_token'", kModelShard, "index expects F32 [7]"});
  j = read_index(d);
  j["model"]["cls_token"]["slices"][0]["end"] = 16;
  j["model"]["cls_token"]["slices"].push_back(j["model"]["cls_token"]["slices"][0]);
  write_index(d, j);
  expect_load_error(d, {"'cls_token'", "overlapping"});
}

TEST(CheckpointErrors, ShapesThatDisagree) {
  const std::string d = per_rank_copy("shape");
  // The index says another shape than the slices hold.
  auto j = read_index(d);
  j["model"]["pos_embed"]["shape"] = {1, 17, 8};
  write_index(d, j);
  expect_load_error(d, {"'pos_embed'", "slice [0, 272)", "of 136 elements"});
  // A tensor-parallel cut that does not divide the shape.
  j["model"]["pos_embed"]["shape"] = {1, 17, 16};
  j["model"]["pos_embed"]["slices"][0]["tp"] = {{"rank", 0}, {"size", 3}, {"cuts", {{2, 1, 3, 1}}}};
  write_index(d, j);
  expect_load_error(d, {"'pos_embed'", "cut does not fit [1, 17, 16]"});
  // A model of another width (layout or config changed): the checkpoint and the shape named.
  const std::string good = per_rank_copy("shape_model");
  try {
    train_run("", good, DType::F32, false, 32);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("in " + good + ", the model has"), std::string::npos)
        << e.what();
  }
}

TEST(CheckpointErrors, CrashedSaveLeavesThePreviousCheckpoint) {
  const std::string root = (fs::temp_directory_path() / "cai_crashed_save").string();
  fs::remove_all(root);
  train_run(root, "", DType::F32, true);  // keeps step 6 and 9
  const auto before = checkpoint::load_checkpoint(root + "/step-000000009").model;
  // What jobs killed during a save leave: temporaries with some shards and no index.
  for (const char* t : {"/step-000000009.tmp", "/step-000000012.tmp"}) {
    fs::create_directories(root + t);
    fs::copy(root + "/step-000000009/" + kModelShard, root + t + "/" + kModelShard);
  }
  EXPECT_EQ(checkpoint::resolve_checkpoint(root), root + "/step-000000009");
  EXPECT_NO_THROW(checkpoint::load_checkpoint(root));
  expect_load_error(root + "/step-000000012.tmp", {"holds no checkpoint"});
  // Resumed from step 6, the run saves step 9 again: the stale temporary is replaced, the old
  // step 9 goes only once the new one is complete, keep_last counts no temporary.
  const TrainRun again = train_run(root, root + "/step-000000006", DType::F32, true);
  EXPECT_EQ(again.losses.size(), 4u);
  EXPECT_FALSE(fs::exists(root + "/step-000000009.tmp"));
  EXPECT_TRUE(fs::exists(root + "/step-000000006/trainer_state.json"));
  const auto after = checkpoint::load_checkpoint(root).model;
  for (const auto& [k, v] : before)
    EXPECT_EQ(std::memcmp(after.at(k).raw(), v.raw(), v.nbytes()), 0) << k;
}

TEST(CheckpointErrors, ExportConsolidatedIsTimmNamedWeights) {
  const std::string d = per_rank_copy("export");
  const std::string out = d + "-export";
  fs::remove_all(out);
  checkpoint::export_consolidated(d, out);
  const auto a = checkpoint::load_model_weights(out).tensors;
  const auto b = checkpoint::load_checkpoint(d).model;
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [k, v] : b) {
    ASSERT_EQ(a.at(k).shape(), v.shape()) << k;
    EXPECT_EQ(std::memcmp(a.at(k).raw(), v.raw(), v.nbytes()), 0) << k;
  }
  EXPECT_THROW(checkpoint::export_consolidated(d, out), Error);  // never written over
}

TEST(Checkpoint, ModelWeightsLoadByTimmNamesAndShapes) {
  nn::ViTConfig c;
  c.img_size = 8, c.patch_size = 4, c.in_chans = 1, c.num_classes = 3, c.embed_dim = 8;
  c.depth = 1, c.num_heads = 2;
  nn::ViT a(c), b(c);
  a.init(1);
  b.init(2);
  std::map<std::string, Tensor> w;
  for (nn::Parameter* p : a.parameters()) w[p->name] = p->value;
  checkpoint::load_model_state(b, w);
  for (nn::Parameter* p : b.parameters())
    EXPECT_EQ(std::memcmp(p->value.raw(), a.parameter(p->name).value.raw(), p->value.nbytes()), 0);
  // A head of another class count: refused naming it, or kept as initialised when skipped.
  w["head.weight"] = Tensor::zeros({5, 8});
  try {
    checkpoint::load_model_state(b, w);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'head.weight' is [5, 8] in the weights"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(checkpoint::load_model_state(b, w, {"head.weight", "head.bias"}));
  w["extra"] = Tensor::zeros({1});
  EXPECT_THROW(checkpoint::load_model_state(b, w, {"head.weight", "head.bias"}), Error);
  w.erase("pos_embed");
  EXPECT_THROW(checkpoint::load_model_state(b, w, {"head.weight", "head.bias"}, true), Error);
}

namespace {
// What a directory holds: every file's path and contents.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    std::ifstream f(e.path());
    out[e.path().string()] = e.is_regular_file() ? std::string(std::istreambuf_iterator<char>(f),
                                                               std::istreambuf_iterator<char>())
                                                 : "(directory)";
  }
  return out;
}

// A checkpoint directory made by hand: only trainer_state.json (run_id "": before run records).
void fake_step(const std::string& dir, int64_t step, const std::string& run_id) {
  const std::string d = fmt::format("{}/step-{:09d}", dir, step);
  fs::create_directories(d);
  nlohmann::json j = {
      {"epoch", 0},        {"step_in_epoch", step}, {"global_step", step}, {"scheduler_last", step},
      {"loss_scaler", {}}, {"layout", ""},          {"version", ""}};
  if (!run_id.empty()) j["run_id"] = run_id;
  std::ofstream(d + "/trainer_state.json") << j.dump();
}

checkpoint::RunRecord run_record(const std::string& id, int64_t seed, const std::string& model,
                                 const std::string& hash) {
  checkpoint::RunRecord r;
  r.run_id = id;
  r.seed = seed;
  r.model = model;
  r.config_hash = hash;
  r.layout = "dp 1 × pp 1 × tp 1";
  return r;
}

std::string claim_error(const std::string& dir, const checkpoint::RunRecord& run,
                        const std::string& resume = {}) {
  try {
    checkpoint::claim_run_dir(dir, run, resume, false);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

// Issue 42: keep_last removed the oldest step directories by name, another run's included.
TEST(RunIdentity, KeepLastRemovesOnlyTheOwningRunsCheckpoints) {
  const std::string dir = (fs::temp_directory_path() / "cai_run_keep_last").string();
  fs::remove_all(dir);
  checkpoint::claim_run_dir(dir, run_record("run-a", 1, "vit_a", "aaaa"), "", false);
  fake_step(dir, 1, "run-b");  // another run's
  fake_step(dir, 2, "");       // written before run records
  const auto foreign = snapshot(dir + "/step-000000001"),
             legacy = snapshot(dir + "/step-000000002");
  train_run(dir, "", DType::F32, false, 16, {}, 0, "run-a");  // steps 3, 6, 9; keep_last 2
  EXPECT_FALSE(fs::exists(dir + "/step-000000003"));
  for (const char* s : {"/step-000000006", "/step-000000009"}) {
    ASSERT_TRUE(fs::exists(dir + s + "/trainer_state.json")) << s;
    EXPECT_EQ(checkpoint::load_checkpoint(dir + s).state.run_id, "run-a") << s;
  }
  EXPECT_EQ(snapshot(dir + "/step-000000001"), foreign);
  EXPECT_EQ(snapshot(dir + "/step-000000002"), legacy);
  // A job saving as another run than the one run.json names removes nothing at all
  // (claim_run_dir would have refused it the directory).
  const std::string other = dir + "_not_owner";
  fs::remove_all(other);
  checkpoint::claim_run_dir(other, run_record("run-a", 1, "vit_a", "aaaa"), "", false);
  train_run(other, "", DType::F32, false, 16, {}, 0, "run-c");
  for (const char* s : {"/step-000000003", "/step-000000006", "/step-000000009"})
    EXPECT_TRUE(fs::exists(other + s)) << s;
}

// Issue 42: a new run into another run's directory replaced its checkpoints and `latest`.
TEST(RunIdentity, ANewRunIsRefusedAnotherRunsDirectory) {
  const std::string dir = (fs::temp_directory_path() / "cai_run_refused").string();
  fs::remove_all(dir);
  const checkpoint::RunRecord a =
      checkpoint::claim_run_dir(dir, run_record("run-a", 1, "vit_a", "aaaa"), "", false);
  EXPECT_EQ(a.run_id, "run-a");
  EXPECT_FALSE(a.started.empty());
  const checkpoint::RunRecord b = run_record("run-b", 2, "vit_b", "bbbb");
  // Run a saved nothing (it failed at start, or was stopped in its first epoch): b takes over.
  const std::string empty = dir + "_no_checkpoints";
  fs::remove_all(empty);
  checkpoint::claim_run_dir(empty, a, "", false);
  EXPECT_EQ(checkpoint::claim_run_dir(empty, b, "", false).run_id, "run-b");
  EXPECT_EQ(checkpoint::read_run_record(empty)->run_id, "run-b");
  // Once a has a checkpoint, b is refused and nothing changes.
  fake_step(dir, 3, "run-a");
  std::ofstream(dir + "/latest") << "step-000000003\n";
  const auto before = snapshot(dir);
  const std::string err = claim_error(dir, b);
  for (const std::string& part :
       {dir, std::string("belongs to another run"), std::string("run run-a (model vit_a, seed 1, "),
        std::string("config hash aaaa"), "started " + a.started, std::string("step-000000003"),
        std::string("run run-b (model vit_b, seed 2, "), std::string("config hash bbbb"),
        std::string("--resume"), std::string("another checkpoint.dir"),
        std::string("checkpoint.overwrite = true")})
    EXPECT_NE(err.find(part), std::string::npos) << part << " in: " << err;
  EXPECT_EQ(snapshot(dir), before);
  // Step directories without a record (written before run records, or by hand): refused too.
  const std::string legacy = dir + "_legacy";
  fs::remove_all(legacy);
  fake_step(legacy, 5, "");
  EXPECT_NE(claim_error(legacy, b).find("a run without a run record (step-000000005"),
            std::string::npos);
  // A resume from elsewhere does not make another run's directory this one's either.
  EXPECT_NE(claim_error(dir, b, legacy + "/step-000000005").find("belongs to another run"),
            std::string::npos);
  EXPECT_EQ(snapshot(dir), before);

  // checkpoint.overwrite: the old run's step directories and `latest` go, the record is b's.
  EXPECT_EQ(checkpoint::claim_run_dir(dir, b, "", true).run_id, "run-b");
  EXPECT_FALSE(fs::exists(dir + "/step-000000003"));
  EXPECT_FALSE(fs::exists(dir + "/latest"));
  const auto now = checkpoint::read_run_record(dir);
  ASSERT_TRUE(now);
  EXPECT_EQ(now->run_id, "run-b");
  EXPECT_EQ(now->seed, 2);
  EXPECT_EQ(now->model, "vit_b");
  EXPECT_EQ(now->config_hash, "bbbb");
}

TEST(RunIdentity, AResumeContinuesTheDirectorysRun) {
  const std::string dir = (fs::temp_directory_path() / "cai_run_resume").string();
  fs::remove_all(dir);
  const checkpoint::RunRecord a =
      checkpoint::claim_run_dir(dir, run_record("run-a", 1, "vit_a", "aaaa"), "", false);
  fake_step(dir, 4, "run-a");
  std::ofstream(dir + "/latest") << "step-000000004\n";
  // --resume DIR (or a checkpoint in it): the record stays the directory's run's, plus the resume.
  const checkpoint::RunRecord c = run_record("run-c", 3, "vit_c", "cccc");
  for (const std::string& from : {dir, dir + "/step-000000004"}) {
    const checkpoint::RunRecord r = checkpoint::claim_run_dir(dir, c, from, false);
    EXPECT_EQ(r.run_id, "run-a");
    EXPECT_EQ(r.started, a.started);
    EXPECT_EQ(r.seed, 1);
  }
  const auto rec = checkpoint::read_run_record(dir);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->run_id, "run-a");
  ASSERT_EQ(rec->resumed.size(), 2u);
  EXPECT_EQ(rec->resumed[1].checkpoint, dir + "/step-000000004");
  EXPECT_EQ(rec->resumed[1].config_hash, "cccc");
  // Overwrite never applies to the run being resumed.
  EXPECT_EQ(checkpoint::claim_run_dir(dir, c, dir, true).run_id, "run-a");
  EXPECT_TRUE(fs::exists(dir + "/step-000000004"));
  // Resumed into another (empty) directory, the run goes on there under its id.
  const std::string moved = dir + "_moved";
  fs::remove_all(moved);
  EXPECT_EQ(checkpoint::claim_run_dir(moved, c, dir, false).run_id, "run-a");
  EXPECT_EQ(checkpoint::read_run_record(moved)->run_id, "run-a");
  // A directory of steps without a record, resumed: adopted (a record for the run).
  const std::string legacy = dir + "_legacy";
  fs::remove_all(legacy);
  fake_step(legacy, 2, "");
  EXPECT_EQ(checkpoint::claim_run_dir(legacy, c, legacy + "/step-000000002", false).run_id,
            "run-c");
  EXPECT_TRUE(fs::exists(legacy + "/step-000000002"));
  EXPECT_EQ(checkpoint::read_run_record(legacy)->run_id, "run-c");
  // A record that does not parse is named.
  std::ofstream(legacy + "/run.json") << "{";
  EXPECT_NE(claim_error(legacy, c).find(legacy + "/run.json"), std::string::npos);
}

// Issue 42: two jobs could share one checkpoint.dir unnoticed.
TEST(RunIdentity, TheLockKeepsASecondJobOut) {
  const std::string dir = (fs::temp_directory_path() / "cai_run_lock").string();
  fs::remove_all(dir);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  checkpoint::DirLock first(dir);
  EXPECT_TRUE(first.held());
  try {
    checkpoint::DirLock second(dir);  // another open file description: flock says no
    FAIL() << "locked twice";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("in use by another job"), std::string::npos) << m;
    EXPECT_NE(m.find(fmt::format("pid {} on host {}", ::getpid(), host)), std::string::npos) << m;
  }
  first.release();
  checkpoint::DirLock third(dir);
  EXPECT_TRUE(third.held());
}

// trainer_state.json's counters are JSON integers in int64_t and loss_scaler a list of numbers
// (nlohmann alone would cast 1e300 or 2.5 to int64_t); errors name the file and the key.
TEST(CheckpointErrors, TrainingStateCountersAndScalerAreChecked) {
  const std::string ok =
      R"({"epoch": 1, "step_in_epoch": 2, "global_step": 6, "scheduler_last": 6,
          "loss_scaler": [1024.0, 1, 0]})";
  const checkpoint::TrainingState s = checkpoint::parse_training_state(ok, "ts.json");
  EXPECT_EQ(s.global_step, 6);
  EXPECT_EQ(s.scaler, (std::vector<double>{1024, 1, 0}));
  auto refused = [](const std::string& text, const char* says) {
    try {
      checkpoint::parse_training_state(text, "ts.json");
      ADD_FAILURE() << "accepted " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  const std::string tail = R"(, "step_in_epoch": 0, "scheduler_last": 0, "loss_scaler": []})";
  refused(R"({"epoch": 1e300, "global_step": 0)" + tail,
          "ts.json: epoch is 1e+300, expected an integer");
  refused(R"({"epoch": 2.5, "global_step": 0)" + tail, "epoch is 2.5, expected an integer");
  refused(R"({"epoch": 0, "global_step": 18446744073709551615)" + tail,
          "global_step = 18446744073709551615 is beyond 64-bit integers");
  refused(R"({"epoch": -1, "global_step": 0)" + tail, "negative epoch/step values");
  refused(R"({"epoch": 0, "global_step": 0, "step_in_epoch": 0, "scheduler_last": 0,
              "loss_scaler": [1, "x"]})",
          "loss_scaler is [1,\"x\"], expected a list of numbers");
  refused("[1, 2]", "ts.json: not a JSON object");
  refused("{", "ts.json: not valid JSON");
}
