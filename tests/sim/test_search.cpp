// The layout search: the bound keeps the exhaustive ranking; the config's [parallel] section is
// the starting point (a layout of 16 processes searched on 4, the global batch kept, said in one
// line); the --out header; refusals named when nothing fits; the cluster's size checked first.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "cai/core/error.h"
#include "search.h"
#include "sim_test_inputs.h"

using namespace cai::sim;
using cai::sim::test::cluster;
using cai::sim::test::fmnist;

// Every layout's bound is at most its simulated step, and the bounded search ranks its first
// places as simulating every layout does.
TEST(Bound, SearchKeepsTheExhaustiveRanking) {
  const Cluster dgx = load_cluster(std::string(CAI_CLUSTER_DIR) + "/dgx-h100-64.toml");
  const auto cfg = fmnist({});
  SearchOptions all;
  all.exhaustive = true;
  const SearchResult every = search_layouts(cfg, 8, dgx, all);
  ASSERT_GT(every.ranked.size(), 20u);
  for (const Candidate& c : every.ranked) EXPECT_LE(c.bound_ms, c.step_ms * (1 + 1e-9)) << c.layout;
  bool nd = false;
  for (const Candidate& c : every.ranked) nd = nd || c.config.tensor_mode == "3d";
  EXPECT_TRUE(nd) << "tp 3d 8 is one of the layouts";
  // Every schedule the executor runs is searched (interleaved with 4 chunks on 2 stages needs 8
  // of the tiny model's 6 layers: refused).
  std::set<std::string> styles;
  for (const Candidate& c : every.ranked)
    if (c.config.pipeline > 1)
      styles.insert(fmt::format("{}{}", c.config.pp_style, c.config.num_model_chunks));
  EXPECT_EQ(styles, (std::set<std::string>{"gpipe1", "1f1b1", "interleaved2", "zbh11", "zbv2"}));
  SearchOptions top;
  top.keep = 5;
  const SearchResult bounded = search_layouts(cfg, 8, dgx, top);
  EXPECT_LT(bounded.simulated, every.simulated);
  EXPECT_EQ(bounded.simulated + bounded.bounded, every.simulated);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(bounded.ranked[i].layout, every.ranked[i].layout);
    EXPECT_EQ(bounded.ranked[i].step_ms, every.ranked[i].step_ms);
  }
}

// The config's own layout is where the search starts, not a constraint: tensor 4 × pipeline 4
// does not fit 4 processes, and the search still ranks the layouts of 4, keeping the batch of one
// replica (64), and says so.
TEST(Search, StartsFromALayoutThatDoesNotFit) {
  const Cluster c = cluster("h200-4");
  const auto cfg =
      fmnist({"parallel.tensor.mode=1d", "parallel.tensor.size=4", "parallel.pipeline=4",
              "parallel.num_microbatches=4", "train.batch_size=64"});
  SearchOptions top;
  top.keep = 3;
  const SearchResult r = search_layouts(cfg, 4, c, top);
  ASSERT_GE(r.ranked.size(), 2u);
  for (const Candidate& k : r.ranked) {
    const int64_t used = k.config.tensor_size * k.config.pipeline;
    ASSERT_EQ(4 % used, 0) << k.layout;
    const int64_t dp = 4 / used;
    // One replica's batch of 64 (micro-batches × accumulation without a pipeline).
    EXPECT_EQ(k.config.batch_size * k.config.gradient_accumulation * dp, 64) << k.layout;
    if (k.config.pipeline > 1) {
      EXPECT_EQ(k.config.gradient_accumulation, 1) << k.layout;
    }
    EXPECT_EQ(k.layout.rfind(fmt::format("dp {} × pp {} × tp ", dp, k.config.pipeline), 0), 0u)
        << k.layout;
    cai::config::validate(k.config, 4);  // vit_train takes it on 4 processes
  }
  EXPECT_EQ(r.base_layout, "pp 4 × tp 1d 4, zero 0, 1f1b m 4");
  EXPECT_EQ(r.base_processes, 16);
  EXPECT_EQ(r.global_batch, 64);
  const std::string line = search_start_line(r, 4);
  EXPECT_NE(line.find("config layout: pp 4 × tp 1d 4, zero 0, 1f1b m 4 (16 processes a replica, "
                      "which does not divide 4), the starting point: every layout of 4 processes "
                      "searched; global batch 64 kept (train.batch_size 64 × 1 replica"),
            std::string::npos)
      << line;
}

// A layout that fits keeps its global batch on nproc: tensor 1d 2 with batch 32 and accumulation
// 2 on 4 processes is dp 2, 128 samples a step, in every candidate, which splits its per-dp batch
// into 1, 2, 4, 8 or 16 accumulated micro-batches without a pipeline (the search varies it).
TEST(Search, KeepsTheGlobalBatchOfAFittingLayout) {
  const auto cfg = fmnist({"parallel.tensor.mode=1d", "parallel.tensor.size=2",
                           "train.batch_size=32", "train.gradient_accumulation=2"});
  SearchOptions top;
  top.keep = 3;
  const SearchResult r = search_layouts(cfg, 4, cluster("cpu-2"), top);
  EXPECT_EQ(r.base_layout, "dp 2 × pp 1 × tp 1d 2, zero 0, accumulation 2 × 32");
  EXPECT_EQ(r.global_batch, 128);
  for (const Candidate& k : r.ranked) {
    EXPECT_EQ(k.config.batch_size * k.config.gradient_accumulation *
                  (4 / (k.config.tensor_size * k.config.pipeline)),
              128)
        << k.layout;
    if (k.config.pipeline > 1) {
      EXPECT_EQ(k.config.gradient_accumulation, 1) << k.layout;
    }
  }
  // Every accumulation is searched (exhaustively: the bound leaves out the slower ones).
  SearchOptions all;
  all.exhaustive = true;
  std::set<int64_t> accumulations;
  for (const Candidate& k : search_layouts(cfg, 4, cluster("cpu-2"), all).ranked) {
    accumulations.insert(k.config.gradient_accumulation);
    if (k.config.gradient_accumulation > 1) {
      EXPECT_NE(k.layout.find(fmt::format(", accumulation {} × {}", k.config.gradient_accumulation,
                                          k.config.batch_size)),
                std::string::npos)
          << k.layout;
    }
  }
  EXPECT_EQ(accumulations, (std::set<int64_t>{1, 2, 4, 8, 16}));
}

// ZeRO-Offload on one GPU (issue #48): the 6.4B ViT fits no layout of one 80 GB GPU without
// offload; with parallel.cpu_offload = true the search tries ZeRO 1-3 with offload on the one
// replica and finds layouts that fit, ZeRO-3 with checkpointing at a GPU peak <= 40 GiB by the
// plan, every one within the host's 128 GiB per GPU; a host with less memory refuses them, with
// the reason counted.
TEST(Search, OffloadFitsTheBigViTOnOneGpu) {
  auto big = cai::config::load_config(std::string(CAI_CONFIG_DIR) + "/vit_6b_imagenet.toml", {});
  const Cluster h100 = cluster("h100-1");
  EXPECT_THROW((void)search_layouts(big, 1, h100), cai::Error);
  big.cpu_offload = true;
  SearchOptions all;
  all.exhaustive = true;
  const SearchResult r = search_layouts(big, 1, h100, all);
  ASSERT_FALSE(r.ranked.empty());
  bool small = false;
  for (const Candidate& k : r.ranked) {
    EXPECT_GE(k.config.zero_stage, 1) << k.layout;
    EXPECT_TRUE(k.config.cpu_offload) << k.layout;
    EXPECT_NE(k.layout.find("(offload)"), std::string::npos) << k.layout;
    EXPECT_LE(k.peak_mem_bytes, h100.gpu.memory_bytes) << k.layout;
    EXPECT_GT(k.host_mem_bytes, 0) << k.layout;
    EXPECT_LE(k.host_mem_bytes, h100.host.memory_bytes) << k.layout;
    EXPECT_EQ(k.config.batch_size * k.config.gradient_accumulation, 64) << k.layout;
    cai::config::validate(k.config, 1);  // vit_train takes it on one process
    if (k.config.zero_stage == 3 && k.config.checkpoint && k.peak_mem_bytes <= (40ll << 30))
      small = true;
  }
  EXPECT_TRUE(small) << "ZeRO-3 + offload + checkpointing under 40 GiB";
  EXPECT_EQ(r.host_too_big, 0);
  // A host of 64 GiB per GPU holds no 6.4B ViT's fp32 values, gradients and Adam state (~95 GiB).
  Cluster tight = h100;
  tight.host.memory_bytes = 64ll << 30;
  try {
    (void)search_layouts(big, 1, tight);
    FAIL() << "the offloaded 6.4B ViT fits 64 GiB of host memory";
  } catch (const cai::Error& e) {
    EXPECT_NE(std::string(e.what()).find("host memory per GPU"), std::string::npos) << e.what();
  }
}

// --out's header names the pick, the config's layout it started from, the global batch and the
// command; the pick is the config with only its layout keys changed.
TEST(Search, OutHeaderAndTheConfigKept) {
  const auto cfg =
      fmnist({"parallel.tensor.mode=1d", "parallel.tensor.size=4", "parallel.pipeline=4",
              "train.learning_rate=0.004", "train.max_steps_per_epoch=3", "model.drop_path=0.1"});
  SearchOptions top;
  top.keep = 1;
  const SearchResult r = search_layouts(cfg, 4, cluster("cpu-2"), top);
  const std::string h = search_out_header(r, 4, "cpu-2");
  for (const std::string& s :
       {std::string("found for 4 processes on cpu-2:\n#   ") + r.ranked.front().layout,
        std::string("The config's own layout, pp 4 × tp 1d 4, zero 0, 1f1b, was the starting"),
        std::string("Global batch 128 (train.batch_size 128 × 1 replica"),
        std::string("# Run: colossalai run --nproc_per_node 4 vit_train --config THIS_FILE\n")})
    EXPECT_NE(h.find(s), std::string::npos) << s << "\n" << h;
  EXPECT_EQ(h.back(), '\n');
  const auto back =
      cai::config::parse_config(h + cai::config::to_toml(r.ranked.front().config), "out.toml", {});
  cai::config::validate(back, 4);
  EXPECT_EQ(back.learning_rate, 0.004);
  EXPECT_EQ(back.max_steps_per_epoch, 3);
  EXPECT_EQ(back.drop_path, 0.1);
  EXPECT_EQ(back.hidden_size, cfg.hidden_size);
  EXPECT_EQ(back.dataset, cfg.dataset);
  EXPECT_EQ(back.batch_size * (4 / (back.tensor_size * back.pipeline)), 128);
}

// parallel.split_backward belongs to a pipeline: layouts without one are searched without it
// (they were all refused).
TEST(Search, SplitBackwardOnlyWithAPipeline) {
  const auto cfg = fmnist({"parallel.pipeline=2", "parallel.split_backward=true"});
  SearchOptions all;
  all.exhaustive = true;
  const SearchResult r = search_layouts(cfg, 4, cluster("cpu-2"), all);
  int flat = 0;
  for (const Candidate& k : r.ranked) {
    EXPECT_EQ(k.config.split_backward, k.config.pipeline > 1) << k.layout;
    flat += k.config.pipeline == 1 ? 1 : 0;
  }
  EXPECT_GT(flat, 0);
}

// Nothing fits: the error names the config's layout, the smallest layout's memory and the most
// frequent refusals. More processes than the cluster holds: said before searching.
TEST(Search, NothingFitsSaysWhy) {
  const auto big =
      cai::config::load_config(std::string(CAI_CONFIG_DIR) + "/vit_6b_imagenet.toml", {});
  try {
    (void)search_layouts(big, 3, cluster("cpu-2"));
    FAIL() << "ViT-6B fits 3 processes of cpu-2";
  } catch (const cai::Error& e) {
    const std::string m = e.what();
    for (const char* s :
         {"no layout of 3 processes fits (the config's layout: pp 4 × tp 1d 4",
          "above the 11.0 GiB", "(the smallest, dp 1 × pp 3 × tp 1,", "the most frequent refusals:",
          "num_heads 64 is not divisible by the tensor-parallel size 3",
          "the global batch 64 does not split into 3 equal data-parallel parts"})
      EXPECT_NE(m.find(s), std::string::npos) << s << "\n" << m;
  }
  try {
    (void)search_layouts(fmnist({}), 8, cluster("cpu-2"));
    FAIL() << "8 processes fit cpu-2";
  } catch (const cai::Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "8 processes do not fit cluster cpu-2: it has 2 GPUs × 2 rank(s) each = 4"),
              std::string::npos)
        << e.what();
  }
}
