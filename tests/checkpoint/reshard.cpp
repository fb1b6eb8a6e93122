// Run under mpirun: a checkpoint written by one layout resumes in another. Layout A trains and
// saves after step 2; layout B (any other dp × pp × tp, ZeRO stage, sequence parallelism) loads it
// into a fresh model and optimizer and trains steps 3 and 4; both must follow the single-process
// run (losses of every step and the gathered parameters, fp32, ≤ 1e-5 relative).
//   mpirun -np W test_checkpoint_reshard --dir D --save tp,pp,zero,sp[,mode[,style]] --load ...
//     style: the pipeline schedule (1f1b, the default; zbv: 2 chunks per rank in a V, zbh1,
//     interleaved: 2 chunks)
//     [--per-rank]   every rank writes its own shards (else the consolidated format)
//     [--offload-save] [--offload-load]   that side runs ZeRO-Offload (its zero stage >= 1)
//     --save single / --load single: that side is one process (rank 0, no communicator)
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "cai/checkpoint/checkpoint.h"
#include "cai/core/error.h"
#include "cai/data/data.h"
#include "cai/dist/communicator.h"
#include "cai/nn/vit.h"
#include "cai/optim/lr_scheduler.h"
#include "cai/optim/optimizer.h"
#include "cai/parallel/hybrid.h"
#include "cai/train/trainer.h"

using namespace cai;

namespace {

struct Layout {
  int tp = 1, pp = 1, zero = 0, sp = 0;
  std::string mode = "1d";     // tensor-parallel mode (1d, 2d, 2.5d, 3d)
  std::string style = "1f1b";  // pipeline schedule
  bool offload = false;        // ZeRO-Offload (--offload-save / --offload-load)
  int chunks() const { return style == "zbv" || style == "interleaved" ? 2 : 1; }
  std::string str() const {
    return fmt::format("tp {} ({}){} pp {} ({}) zero {}{}", tp, mode, sp ? " (sp)" : "", pp, style,
                       zero, offload ? " (cpu offload)" : "");
  }
};

Layout parse_layout(const std::string& s) {
  Layout l;
  char c;
  std::istringstream in(s);
  in >> l.tp >> c >> l.pp >> c >> l.zero >> c >> l.sp;
  CAI_CHECK(!in.fail(), "bad layout '{}': expected tp,pp,zero,sp[,mode[,style]]", s);
  std::string rest;
  if (in >> c && c == ',' && std::getline(in, rest)) {
    const auto comma = rest.find(',');
    l.mode = rest.substr(0, comma);
    if (comma != std::string::npos) l.style = rest.substr(comma + 1);
  }
  return l;
}

class Losses : public train::Hook {
 public:
  std::vector<double> v;
  void after_step(train::Trainer&, const train::StepInfo& s) override { v.push_back(s.loss); }
};

struct Result {
  std::vector<double> losses;
  std::map<std::string, Tensor> params;
};

// comm null: one process. save_dir: checkpoint every 2 steps; resume: continue from there.
Result run(dist::Communicator* comm, const Layout& l, const std::string& save_dir,
           const std::string& resume, bool per_rank) {
  const int world = comm ? comm->size() : 1;
  std::shared_ptr<parallel::HybridParallelPlugin> hybrid;
  if (comm) {
    parallel::HybridParallelConfig hc;
    hc.tp_size = l.tp;
    hc.pp_size = l.pp;
    hc.sequence_parallel = l.sp != 0;
    hc.tp_mode = l.mode;
    hc.pipeline.num_microbatches = 2;
    hc.pipeline.style = l.style;
    hc.pipeline.chunks = l.chunks();
    hc.dp.zero_stage = l.zero;
    hc.dp.cpu_offload = l.offload;
    hc.dp.ddp_bucket_cap_mb = 0.01;
    hc.dp.zero_bucket_size_in_m = 0.003;
    hybrid = std::make_shared<parallel::HybridParallelPlugin>(*comm, hc);
  }
  const dist::ProcessMesh mesh(world, comm ? l.tp : 1, comm ? l.pp : 1);
  const int64_t global_batch = 24, steps = 4;
  auto ds =
      data::subset(data::load_mnist_dir("/usr/share/datasets/fashion-mnist", true, "fashion-mnist"),
                   global_batch * steps);
  data::LoaderConfig lc;
  lc.batch_size = global_batch / mesh.dp_size();
  lc.world = mesh.dp_size(), lc.rank = mesh.coord(comm ? comm->rank() : 0).dp;
  lc.seed = 9, lc.num_workers = 0;
  lc.transform.normalize = data::normalization_for("fashion_mnist");
  data::DataLoader loader(ds, lc);
  nn::ViTConfig c;
  c.img_size = 28, c.patch_size = 7, c.in_chans = 1, c.num_classes = 10, c.embed_dim = 24;
  c.depth = 3, c.num_heads = 4, c.mlp_ratio = 2.0, c.drop_rate = 0.1f, c.drop_path_rate = 0.1f;
  nn::ViT model(c, hybrid ? hybrid->tensor_parallel() : nullptr);
  model.init(7);
  checkpoint::Checkpoint ck;
  if (!resume.empty()) {
    ck = checkpoint::load_checkpoint(resume);
    checkpoint::load_model_state(model, ck.model, {}, false, ck.path);
  }
  std::shared_ptr<train::Plugin> plugin =
      hybrid ? std::shared_ptr<train::Plugin>(hybrid) : std::make_shared<train::Plugin>();
  plugin->setup(model);
  auto opt = optim::make_optimizer(
      optim::OptimizerOptions{},
      optim::weight_decay_groups(plugin->optimizer_parameters(model), 1e-2, 0.05));
  auto sched = optim::make_scheduler("cosine", *opt, steps, 1);
  train::TrainerConfig tc;
  tc.clip_grad_norm = 0.5;
  tc.seed = 5;
  train::Booster booster(plugin);
  auto t =
      booster.boost(model, *opt, train::Criterion{0.1f}, loader, nullptr, sched.get(), false, tc);
  auto losses = std::make_shared<Losses>();
  t->add_hook(losses);
  if (!save_dir.empty()) {
    checkpoint::CheckpointConfig cc;
    cc.dir = save_dir;
    cc.every_steps = 2;
    cc.layout = mesh.describe();
    cc.per_rank = per_rank;
    t->add_hook(std::make_shared<checkpoint::CheckpointHook>(cc, sched.get()));
  }
  if (!resume.empty()) {
    plugin->load_optimizer_state(model, *opt, ck.optimizer);
    sched->set_last(ck.state.scheduler_last);
    t->resume_at(ck.state.epoch, ck.state.step_in_epoch, ck.state.global_step);
  }
  t->fit();
  Result r;
  r.losses = losses->v;
  r.params = plugin->full_model_state(model);
  return r;
}

double rel(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b) {
  double num = 0, den = 0;
  for (const auto& [k, v] : a) {
    const auto x = v.to_vector(), y = b.at(k).to_vector();
    for (size_t i = 0; i < x.size(); ++i)
      num += (double(x[i]) - y[i]) * (double(x[i]) - y[i]), den += double(x[i]) * x[i];
  }
  return std::sqrt(num / den);
}

}  // namespace

int main(int argc, char** argv) {
  dist::MpiEnvironment env(&argc, &argv);
  std::string dir = "/tmp/cai_reshard";
  Layout save, load;
  bool save_single = false, load_single = false, per_rank = false, offload[2] = {false, false};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--offload-save" || a == "--offload-load") {
      offload[a == "--offload-load"] = true;
      continue;
    }
    if (a == "--per-rank") {
      per_rank = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", a.c_str());
      return 2;
    }
    const std::string v = argv[++i];
    if (a == "--dir")
      dir = v;
    else if (a == "--save" && v == "single")
      save_single = true;
    else if (a == "--save")
      save = parse_layout(v);
    else if (a == "--load" && v == "single")
      load_single = true;
    else if (a == "--load")
      load = parse_layout(v);
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  save.offload = offload[0];
  load.offload = offload[1];
  try {
    auto world = env.world(60.0);
    const bool root = world->rank() == 0;
    if (root) std::filesystem::remove_all(dir);
    world->barrier();
    const Result ref = run(nullptr, Layout{}, "", "", false);
    // A single-process side runs on rank 0 alone.
    const bool runs_a = !save_single || root, runs_b = !load_single || root;
    Result a, b;
    if (runs_a) a = run(save_single ? nullptr : world.get(), save, dir, "", per_rank);
    world->barrier();
    const std::string ck = dir + "/step-000000002";
    bool ok = std::filesystem::exists(ck + "/checkpoint.index.json") == per_rank;
    if (runs_b) b = run(load_single ? nullptr : world.get(), load, "", ck, per_rank);
    double err_a = 0, err_b = 0, perr_a = 0, perr_b = 0;
    if (runs_a) {
      ok = ok && ref.losses.size() == 4 && a.losses.size() == 4;
      for (size_t i = 0; ok && i < 4; ++i)
        err_a = std::max(err_a, std::abs(a.losses[i] - ref.losses[i]) / ref.losses[i]);
      perr_a = ok ? rel(ref.params, a.params) : 1;
    }
    if (runs_b) {
      ok = ok && b.losses.size() == 2;
      for (size_t i = 0; ok && i < 2; ++i)
        err_b = std::max(err_b, std::abs(b.losses[i] - ref.losses[2 + i]) / ref.losses[2 + i]);
      perr_b = ok ? rel(ref.params, b.params) : 1;
    }
    ok = ok && err_a <= 1e-5 && err_b <= 1e-5 && perr_a <= 1e-5 && perr_b <= 1e-5;
    const double all = world->all_reduce_scalar(ok ? 1.0 : 0.0, dist::ReduceOp::Min);
    if (root)
      std::printf(
          "saved by %s (%s), resumed at step 2 by %s (%d ranks): loss err %.2e / %.2e, "
          "parameter err %.2e / %.2e: %s\n",
          save_single ? "one process" : save.str().c_str(), per_rank ? "per-rank" : "consolidated",
          load_single ? "one process" : load.str().c_str(), world->size(), err_a, err_b, perr_a,
          perr_b, all == 1.0 ? "OK" : "MISMATCH");
    return all == 1.0 ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "test_checkpoint_reshard: %s\n", e.what());
    dist::MpiEnvironment::abort(1);
  }
}
