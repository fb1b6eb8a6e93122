// Write time of a checkpoint, consolidated (gathered, rank 0 writes) against per-rank (every rank
// writes its shards), for a ViT-B sized model (86 M parameters, AdamW state) after one training
// step on the CPU. Prints one line per format and repetition.
//   mpirun -np 4 bench_checkpoint_save [--dir D] [--tp N] [--zero S] [--reps R]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

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
namespace fs = std::filesystem;

int main(int argc, char** argv) {
  dist::MpiEnvironment env(&argc, &argv);
  std::string dir = "/tmp/cai_bench_save";
  int tp = 1, zero = 2, reps = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--dir")
      dir = v;
    else if (a == "--tp")
      tp = std::stoi(v);
    else if (a == "--zero")
      zero = std::stoi(v);
    else if (a == "--reps")
      reps = std::stoi(v);
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  try {
    auto world = env.world(600.0);
    const bool root = world->rank() == 0;
    parallel::HybridParallelConfig hc;
    hc.tp_size = tp;
    hc.dp.zero_stage = zero;
    auto hybrid = std::make_shared<parallel::HybridParallelPlugin>(*world, hc);
    const dist::ProcessMesh mesh(world->size(), tp, 1);
    auto ds = data::subset(
        data::load_mnist_dir("/usr/share/datasets/fashion-mnist", true, "fashion-mnist"),
        static_cast<int64_t>(mesh.dp_size()));
    data::LoaderConfig lc;
    lc.batch_size = 1, lc.world = mesh.dp_size(), lc.rank = mesh.coord(world->rank()).dp;
    lc.num_workers = 0;
    data::DataLoader loader(ds, lc);
    nn::ViTConfig c;  // ViT-B/16's width and depth; small images keep the one step cheap
    c.img_size = 28, c.patch_size = 7, c.in_chans = 1, c.num_classes = 1000, c.embed_dim = 768;
    c.depth = 12, c.num_heads = 12, c.mlp_ratio = 4.0;
    nn::ViT model(c, hybrid->tensor_parallel());
    model.init(1);
    hybrid->setup(model);
    auto opt = optim::make_optimizer(
        optim::OptimizerOptions{},
        optim::weight_decay_groups(hybrid->optimizer_parameters(model), 1e-3, 0.05));
    train::TrainerConfig tc;
    tc.max_steps_per_epoch = 1;
    train::Booster booster(hybrid);
    auto t = booster.boost(model, *opt, train::Criterion{}, loader, nullptr, nullptr, false, tc);
    t->fit();
    if (root) {
      fs::remove_all(dir);
      std::printf("ViT-B (%lld parameters), %s, %d processes\n",
                  static_cast<long long>(c.num_parameters()), mesh.describe().c_str(),
                  world->size());
    }
    world->barrier();
    for (int r = 0; r < reps; ++r)
      for (bool per_rank : {false, true}) {
        checkpoint::CheckpointConfig cc;
        cc.dir = dir + (per_rank ? "/per_rank" : "/consolidated");
        cc.per_rank = per_rank;
        cc.layout = mesh.describe();
        checkpoint::TrainingState st;
        st.global_step = r + 1;
        world->barrier();
        const auto t0 = std::chrono::steady_clock::now();
        const std::string out = checkpoint::save_checkpoint(cc, *t, nullptr, st);
        world->barrier();
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (root) {
          uint64_t bytes = 0;
          for (const auto& e : fs::directory_iterator(out)) bytes += e.file_size();
          std::printf("%-12s save %d: %.2f s, %.0f MB, %.0f MB/s\n",
                      per_rank ? "per-rank" : "consolidated", r + 1, s, bytes / 1e6,
                      bytes / 1e6 / s);
        }
        // Load back (every rank) to check that both formats give the same full tensors.
        if (r == reps - 1 && per_rank) {
          auto since = [](auto t0) {
            return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          };
          world->barrier();
          const auto t1 = std::chrono::steady_clock::now();
          const auto a = checkpoint::load_checkpoint(out);
          const double ls = since(t1);
          world->barrier();
          const auto t2 = std::chrono::steady_clock::now();
          const auto b = checkpoint::load_checkpoint(dir + "/consolidated/" +
                                                     fs::path(out).filename().string());
          const double cs = since(t2);
          bool same = a.model.size() == b.model.size() && a.optimizer.size() == b.optimizer.size();
          for (const auto& [k, v] : a.model)
            same = same && std::memcmp(v.raw(), b.model.at(k).raw(), v.nbytes()) == 0;
          for (const auto& [k, v] : a.optimizer)
            same = same && std::memcmp(v.raw(), b.optimizer.at(k).raw(), v.nbytes()) == 0;
          if (root)
            std::printf(
                "load on every rank at once (full tensors; rank 0's time): per-rank %.2f s, "
                "consolidated %.2f s; equal: %s\n",
                ls, cs, same ? "yes" : "NO");
          if (!same) return 1;
        }
      }
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_checkpoint_save: %s\n", e.what());
    dist::MpiEnvironment::abort(1);
  }
}
