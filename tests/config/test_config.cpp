// The training config (cai/config: vit_train's --config): keys, types, ranges, choices,
// overrides, environment expansion and the "not supported yet" errors.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "cai/config/config.h"
#include "cai/core/error.h"
#include "cai/core/toml_text.h"

using namespace cai;
using namespace cai::config;

namespace {
// Expects parse/validate to throw with every fragment in the message.
void expect_error(const std::string& toml, const std::vector<std::string>& fragments,
                  const std::vector<std::string>& overrides = {}, int world = 1) {
  try {
    validate(parse_config(toml, "test.toml", overrides), world);
    ADD_FAILURE() << "no error for:\n" << toml;
  } catch (const Error& e) {
    for (const auto& f : fragments)
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos)
          << "'" << f << "' not in: " << e.what();
  }
}
}  // namespace

TEST(Config, DefaultsAndValuesParse) {
  TrainConfig c = parse_config(R"(
[train]
batch_size = 64
learning_rate = 1e-3
warmup_epochs = 2
optimizer = "lamb"
[model]
hidden_size = 96
num_heads = 3
mlp_ratio = 4
[parallel]
tensor = { mode = "none", size = 1 }
[data]
dataset = "mnist"
)",
                               "t", {});
  EXPECT_EQ(c.batch_size, 64);
  EXPECT_DOUBLE_EQ(c.warmup_epochs, 2.0);  // an integer is accepted for a float key
  EXPECT_EQ(c.optimizer, "lamb");
  EXPECT_EQ(c.vit().embed_dim, 96);
  EXPECT_EQ(c.vit().in_chans, 1);
  EXPECT_EQ(c.num_epochs, TrainConfig{}.num_epochs);
  EXPECT_NO_THROW(validate(c, 1));
}

// Non-ASCII text where toml++ 3.3.0 asks whether it is whitespace reached its
// __builtin_unreachable() (undefined behaviour; found by libFuzzer + UBSan, cai/core/tomlpp.h):
// now a parse error naming file, line and column. The inputs are libFuzzer's and smaller ones;
// non-ASCII in strings and comments parses, a --set value that is no TOML value is a string.
// The pipeline's NCCL channels take 2 thread blocks by default, and the GEMMs of a pipeline run
// leave twice that many SMs (auto, -1); other runs leave none; a setting wins; a margin below -1
// or a negative block count is refused.
TEST(Config, GemmSmMarginFollowsThePipelinesChannels) {
  EXPECT_EQ(parse_config("", "t.toml", {}).p2p_max_ctas, 2);
  EXPECT_EQ(gemm_sm_margin_for(parse_config("", "t.toml", {})), 0);
  EXPECT_EQ(gemm_sm_margin_for(parse_config("", "t.toml", {"parallel.pipeline=2"})), 4);
  EXPECT_EQ(gemm_sm_margin_for(
                parse_config("", "t.toml", {"parallel.pipeline=2", "parallel.p2p_max_ctas=0"})),
            0);
  EXPECT_EQ(gemm_sm_margin_for(
                parse_config("", "t.toml", {"parallel.pipeline=2", "parallel.gemm_sm_margin=0"})),
            0);
  EXPECT_EQ(gemm_sm_margin_for(parse_config("", "t.toml", {"parallel.gemm_sm_margin=8"})), 8);
  EXPECT_THROW(parse_config("", "t.toml", {"parallel.gemm_sm_margin=-2"}), cai::Error);
  EXPECT_THROW(parse_config("", "t.toml", {"parallel.p2p_max_ctas=-1"}), cai::Error);
}

TEST(Config, NonAsciiOutsideStringsIsAParseErrorNotUndefinedBehaviour) {
  for (const std::string bad :
       {"[train]\nbatch_size = 8 \xC3\xA9\n", "\xEF\xBB\xBF\xEF\xBB\xBF",
        "[data]\npath = \"a\\\xC3\xA9\"\n", "''=7777$'p\xD2\x91-=\x04",
        "q=1\"ccc\xEF\xB7\xBBq7=", "n=5.'3St\xC7\xA2xc\"", "a=-''.'\xEF\xB9\xBF#'",
        "1=2hhhZZZ=1hhhh''['\xEF\xBB\xB6\x05", "2={26=6=F={{={\"\xC7\x9F\n 71",
        "-=--=-\x03--=''''-=\xEF\xBB\xBE"
        "0",
        "-=7\x07=\"\xCF\x80"
        "7{{[{:{-"}) {
    try {
      parse_config(bad, "odd.toml", {});
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const cai::Error& e) {
      EXPECT_NE(std::string(e.what()).find("[config] odd.toml:"), std::string::npos) << e.what();
    }
  }
  const TrainConfig c = parse_config(
      "# r\xC3\xA9sum\xC3\xA9\n[data]\npath = \"/home/jos\xC3\xA9/\xC2\xA1"
      "data\"\n",
      "ok.toml", {"train.metrics_file=/tmp/\xC3\xA9.jsonl"});
  EXPECT_EQ(c.path,
            "/home/jos\xC3\xA9/\xC2\xA1"
            "data");
  EXPECT_EQ(c.metrics_file, "/tmp/\xC3\xA9.jsonl");
}

// libFuzzer + UBSan (fuzz_vit_train_config_set, issue 42): inside an array toml++ reads `1."..."`
// as one bare token and asks is_non_ascii_horizontal_whitespace about U+01EA (unreachable in
// toml++ 3.3.0); the scanner took the '.' for a dotted key's and the quote for a string's start.
TEST(Config, NonAsciiInABareTokenInsideAnArrayIsRefusedBeforeToml) {
  const std::string fuzzed(
      "\133\062\040\054\061\056\042\307\252\050\134\011\000\000\006\042\134\011\000\000\000\134\011"
      "\000\000\000\000\000\000\000\000\000\000\000\054\061\054\063\054",
      39);
  EXPECT_NE(toml_text_problem("v = " + fuzzed).find("0xC7"), std::string::npos)
      << toml_text_problem("v = " + fuzzed);
  EXPECT_THROW(parse_config("", "fuzz.toml", {"train.batch_size=" + fuzzed}), cai::Error);
  for (const std::string bad : {"x = [2, 1.\"\xC7\xAA\"]\n", "x = [\n  2,\n  1.'\xC7\xAA'\n]\n",
                                "x = [{a = 1}, 1.\"\xC7\xAA\"]\n"}) {
    EXPECT_NE(toml_text_problem(bad).find("0xC7"), std::string::npos) << bad;
    EXPECT_THROW(parse_config(bad, "odd.toml", {}), cai::Error) << bad;
  }
  // Valid TOML the scanner must still let through: strings in (multi-line) arrays and in inline
  // tables inside arrays, dotted keys in inline tables and table headers.
  for (const std::string good :
       {"x = [\"\xC3\xA9\", '\xC3\xA9']\n", "x = [\n  \"\xC3\xA9\",\n  \"b\",\n]\n",
        "x = [{a.b = \"\xC3\xA9\"}, {c = '\xC3\xA9'}]\n", "[a.\"\xC3\xA9\"]\nk = \"\xC3\xA9\"\n",
        "[[t]]\nx.\"\xC3\xA9\" = 1\n"})
    EXPECT_EQ(toml_text_problem(good), "") << good;
}

TEST(Config, UnknownKeysAndSectionsNameWhatIsAllowed) {
  expect_error("[train]\nbatchsize = 3\n", {"unknown key 'train.batchsize'", "batch_size"});
  expect_error("[optimiser]\nlr = 3\n", {"unknown section or key 'optimiser'", "[train]"});
  expect_error("[parallel]\ntensor = { mode = \"1d\", width = 2 }\n",
               {"unknown key 'parallel.tensor.width'", "mode, size, depth"});
}

TEST(Config, BadValuesNameTheKeyAndTheAllowedValues) {
  expect_error("[train]\nbatch_size = \"big\"\n", {"train.batch_size", "not an integer"});
  expect_error("[train]\nbatch_size = 0\n", {"train.batch_size = 0 is outside [1, inf]"});
  expect_error("[train]\noptimizer = \"adagrad\"\n",
               {"train.optimizer", "adagrad", "sgd, adam, adamw, hybrid_adam, lamb"});
  expect_error("[model]\ndropout = 1.5\n", {"model.dropout = 1.5"});
  expect_error("[model]\nhidden_size = 10\nnum_heads = 3\n",
               {"hidden size 10 must be divisible by num_heads 3"});
  expect_error("[data]\ndataset = \"cifar10\"\n[model]\nin_chans = 1\n",
               {"model.in_chans = 1", "3 channels"});
  expect_error("[train]\nbatch_size = 4\n[[broken\n", {"test.toml:3"});
  expect_error("[model]\nact = \"relu\"\n", {"model.act", "relu", "gelu, gelu_tanh"});
  EXPECT_EQ(parse_config("[model]\nact = \"gelu_tanh\"\n", "t", {}).vit().act, "gelu_tanh");
}

TEST(Config, TensorModesListTheValidSizes) {
  expect_error("[parallel]\ntensor = { mode = \"2d\", size = 8 }\n",
               {"mode = \"2d\", size = 8", "square", "valid sizes are 4, 9, 16"});
  expect_error("[parallel]\ntensor = { mode = \"3d\", size = 4 }\n",
               {"cube", "valid sizes are 8, 27, 64"});
  expect_error("[parallel]\ntensor = { mode = \"2.5d\", size = 8, depth = 3 }\n",
               {"depth = 3", "size / depth to be a square", "valid sizes are 12, 27"});
  expect_error("[parallel]\ntensor = { mode = \"2d\", size = 4, depth = 2 }\n",
               {"parallel.tensor.depth = 2", "2.5d"});
  expect_error("[parallel]\ntensor = { mode = \"2d\", size = 4 }\nsequence_parallel = true\n",
               {"sequence_parallel", "1d"});
  expect_error("[train]\nbatch_size = 6\n[parallel]\ntensor = { mode = \"3d\", size = 8 }\n",
               {"batch_size = 6", "4 batch chunks"});
  for (const char* ok :
       {"tensor = { mode = \"2d\", size = 4 }", "tensor = { mode = \"2.5d\", size = 8, depth = 2 }",
        "tensor = { mode = \"3d\", size = 8 }"})
    EXPECT_NO_THROW(
        validate(parse_config(fmt::format("[train]\nbatch_size = 8\n[model]\nnum_heads = 4\n"
                                          "hidden_size = 64\n[parallel]\n{}\n",
                                          ok),
                              "t", {}),
                 8))
        << ok;
}

TEST(Config, PrecisionModes) {
  for (const char* mode : {"fp32", "bf16", "fp16"})
    EXPECT_NO_THROW(
        validate(parse_config(fmt::format("[precision]\nmode = \"{}\"\n", mode), "t", {}), 1))
        << mode;
  expect_error("[precision]\nmode = \"fp8\"\n", {"precision.mode", "fp8", "fp32, fp16, bf16"});
  expect_error("[precision]\nmode = \"fp16\"\ninitial_scale = 8.0\nmin_scale = 16.0\n",
               {"min_scale (16) <= initial_scale (8)"});
}

TEST(Config, PipelineSettingsAreChecked) {
  EXPECT_NO_THROW(validate(
      parse_config("[parallel]\npipeline = 2\nnum_microbatches = 4\npp_style = \"gpipe\"\n", "t",
                   {}),
      4));
  expect_error("[parallel]\npipeline = 2\n", {"1 processes are not divisible", "pipeline 2"});
  expect_error("[parallel]\npipeline = 2\nzero_stage = 2\n", {"zero_stage = 2", "ZeRO 0 or 1"}, {},
               2);
  expect_error("[parallel]\npipeline = 2\n[train]\ngradient_accumulation = 2\n",
               {"gradient_accumulation = 2", "num_microbatches"}, {}, 2);
  expect_error("[parallel]\nnum_model_chunks = 2\n", {"needs parallel.pp_style = \"interleaved\""});
  expect_error("[parallel]\npipeline = 2\npp_style = \"interleaved\"\n", {"num_model_chunks >= 2"},
               {}, 2);
  // Zero-bubble styles: zbh1 on one chunk, zbv on exactly two (its V placement).
  EXPECT_NO_THROW(
      validate(parse_config("[parallel]\npipeline = 2\nnum_microbatches = 4\npp_style = \"zbh1\"\n",
                            "t", {}),
               2));
  EXPECT_NO_THROW(validate(parse_config("[parallel]\npipeline = 2\nnum_microbatches = 4\npp_style "
                                        "= \"zbv\"\nnum_model_chunks = 2\n",
                                        "t", {}),
                           2));
  expect_error("[parallel]\npipeline = 2\npp_style = \"zbv\"\n",
               {"pp_style = \"zbv\" places 2 model chunks", "num_model_chunks = 2 (got 1)"}, {}, 2);
  expect_error("[parallel]\npipeline = 2\npp_style = \"zbv\"\nnum_model_chunks = 3\n",
               {"num_model_chunks = 2 (got 3)"}, {}, 2);
  expect_error("[parallel]\npipeline = 2\npp_style = \"zbh1\"\nnum_model_chunks = 2\n",
               {"num_model_chunks = 2 needs parallel.pp_style = \"interleaved\""}, {}, 2);
  expect_error("[parallel]\npp_style = \"zb\"\n", {"parallel.pp_style", "zbh1", "zbv"});
  expect_error("[parallel]\nnum_microbatches = 2\nmicrobatch_size = 8\n", {"not both"});
  expect_error("[parallel]\nnum_layers_per_stage = [2, \"x\"]\n",
               {"parallel.num_layers_per_stage", "an array of integers"});
  TrainConfig c = parse_config("[parallel]\nnum_layers_per_stage = [3, 3]\n", "t", {});
  EXPECT_EQ(c.num_layers_per_stage, (std::vector<int>{3, 3}));
}

TEST(Config, DataParallelSettingsAreChecked) {
  EXPECT_NO_THROW(validate(parse_config("[parallel]\nzero_stage = 3\n", "t", {}), 4));
  expect_error("[parallel]\nzero_stage = 2\n[train]\noptimizer = \"lamb\"\n",
               {"zero_stage = 2", "lamb", "trust ratio"});
  expect_error("[parallel]\ncpu_offload = true\n", {"cpu_offload", "zero_stage >= 1"});
  expect_error("[parallel]\nzero_stage = 4\n", {"parallel.zero_stage = 4 is outside [0, 3]"});
  // The copy-engine all-reduce: fp32 stage 0/1 buckets on GPUs only.
  const std::string ce = "[parallel]\nddp_copy_engine = true\n";
  EXPECT_NO_THROW(validate(parse_config(ce + "[train]\ndevice = \"cuda\"\n", "t", {}), 2));
  expect_error(ce, {"ddp_copy_engine", "train.device = \"cuda\" (got \"cpu\")"});
  expect_error(ce + "zero_stage = 2\n[train]\ndevice = \"cuda\"\n", {"zero_stage 0 or 1 (got 2)"});
  expect_error(ce + "gradient_comm_dtype = \"bf16\"\n[train]\ndevice = \"cuda\"\n",
               {"gradient_comm_dtype = \"fp32\" (got \"bf16\")"});
  // The copy-engine exchange: fp32 stage 0 buckets on GPUs, not with the copy-engine all-reduce.
  const std::string ex = "[parallel]\nddp_exchange = true\n";
  EXPECT_NO_THROW(validate(parse_config(ex + "[train]\ndevice = \"cuda\"\n", "t", {}), 2));
  expect_error(ex, {"ddp_exchange", "train.device = \"cuda\" (got \"cpu\")"});
  expect_error(ex + "zero_stage = 1\n[train]\ndevice = \"cuda\"\n", {"zero_stage = 0 (got 1)"});
  expect_error(ex + "gradient_comm_dtype = \"bf16\"\n[train]\ndevice = \"cuda\"\n",
               {"gradient_comm_dtype = \"fp32\" (got \"bf16\")"});
  expect_error(ex + "ddp_copy_engine = true\n[train]\ndevice = \"cuda\"\n",
               {"ddp_copy_engine = false (got true)"});
  // The bucket hold: a share of the gradients, for the all-reduced buckets of stages 0 and 1.
  const std::string hold = "[parallel]\nddp_bucket_hold = 0.85\n";
  EXPECT_NO_THROW(validate(parse_config(hold + "zero_stage = 1\n", "t", {}), 2));
  expect_error("[parallel]\nddp_bucket_hold = 1.5\n",
               {"parallel.ddp_bucket_hold = 1.5 is outside [0, 1]"});
  expect_error(hold + "zero_stage = 2\n",
               {"parallel.ddp_bucket_hold = 0.85", "not zero_stage = 2"});
}

TEST(Config, OverridesApplyAfterTheFile) {
  TrainConfig c = parse_config("[train]\nbatch_size = 8\n", "t",
                               {"train.batch_size=32", "data.dataset=cifar10",
                                "model.checkpoint=true", "train.learning_rate=0.5"});
  EXPECT_EQ(c.batch_size, 32);
  EXPECT_EQ(c.dataset, "cifar10");  // a bare word is a string
  EXPECT_TRUE(c.checkpoint);
  EXPECT_DOUBLE_EQ(c.learning_rate, 0.5);
  expect_error("", {"--set train.nope=1", "unknown key 'train.nope'"}, {"train.nope=1"});
  expect_error("", {"not of the form"}, {"train.batch_size"});
  expect_error("", {"train.batch_size = \"x\" is not an integer"}, {"train.batch_size=x"});
}

TEST(Config, NamedModelsAreOverriddenOnlyByExplicitKeys) {
  TrainConfig c = parse_config(
      "[model]\nname = \"vit_base_patch16_224\"\nimg_size = 32\npatch_size = 4\n", "t", {});
  const auto v = c.vit();
  EXPECT_EQ(v.embed_dim, 768);
  EXPECT_EQ(v.depth, 12);
  EXPECT_EQ(v.img_size, 32);
  EXPECT_EQ(v.patch_size, 4);
  expect_error("[model]\nname = \"vit_colossal\"\n", {"unknown model 'vit_colossal'"});
}

TEST(Config, EnvironmentExpansion) {
  setenv("CAI_TEST_DATA_ROOT", "/data/x", 1);
  EXPECT_EQ(expand_env("${CAI_TEST_DATA_ROOT}/cifar", "data.path"), "/data/x/cifar");
  unsetenv("CAI_TEST_UNSET_VAR");
  try {
    expand_env("${CAI_TEST_UNSET_VAR}/a", "data.path");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CAI_TEST_UNSET_VAR is not set"), std::string::npos);
  }
}

TEST(Config, ShippedConfigsParse) {
  const std::string dir = std::string(CAI_CONFIG_DIR);
  int n = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    if (f.path().extension() != ".toml") continue;
    ++n;
    TrainConfig c;
    ASSERT_NO_THROW(c = load_config(f.path().string(), {})) << f.path();
    const std::string name = f.path().filename().string();
    if (name == "vit_6b_imagenet.toml") {  // pp 4 × tp 4 × dp 4
      EXPECT_NO_THROW(validate(c, 64)) << f.path();
      EXPECT_THROW(validate(c, 8), Error) << f.path();
    } else if (name == "vit_base_cifar10_hybrid.toml") {  // tensor 1D × pipeline 2
      EXPECT_NO_THROW(validate(c, 4)) << f.path();
      EXPECT_NO_THROW(validate(c, 8)) << f.path();
      EXPECT_THROW(validate(c, 2), Error) << f.path();
    } else {
      // fmnist_tiny and the fp16 CIFAR-10 ViT-Base configs: data parallel, and pipeline 2.
      EXPECT_NO_THROW(validate(c, c.pipeline)) << f.path();
    }
  }
  EXPECT_GE(n, 4);
}

// parallel.split_backward: each pipeline backward as BackwardInput + BackwardWeight.
TEST(Config, SplitBackwardNeedsAPipeline) {
  TrainConfig c = parse_config("[parallel]\npipeline = 2\nsplit_backward = true\n", "t", {});
  EXPECT_TRUE(c.split_backward);
  EXPECT_NO_THROW(validate(c, 2));
  EXPECT_FALSE(parse_config("[parallel]\npipeline = 2\n", "t", {}).split_backward);
  expect_error("[parallel]\nsplit_backward = true\n",
               {"parallel.split_backward = true", "parallel.pipeline > 1 (got 1)"});
  expect_error("[parallel]\npipeline = 2\nsplit_backward = 1\n", {"split_backward"});
  // The plan (and so the simulator and vit_train --dry-run) runs the split schedule.
  c.num_microbatches = 4;
  const plan::Layout l = plan_layout(c, 2);
  EXPECT_TRUE(l.split_backward);
  int b_in = 0, b_w = 0, whole = 0;
  for (const auto& prog : plan::make_plan(c.vit(), l).schedule.programs)
    for (const auto& in : prog) {
      b_in += in.op == schedule::Op::BackwardInput;
      b_w += in.op == schedule::Op::BackwardWeight;
      whole += in.op == schedule::Op::Backward;
    }
  EXPECT_EQ(b_in, 2 * 4);
  EXPECT_EQ(b_w, 2 * 4);
  EXPECT_EQ(whole, 0);
  c.split_backward = false;
  EXPECT_FALSE(plan_layout(c, 2).split_backward);
}

TEST(Config, TensorParallelSettings) {
  // Overrides reach into the inline table.
  TrainConfig c = parse_config(
      "[parallel]\ntensor = { mode = \"none\", size = 1 }\n", "t",
      {"parallel.tensor.mode=1d", "parallel.tensor.size=2", "parallel.sequence_parallel=true"});
  EXPECT_EQ(c.tensor_mode, "1d");
  EXPECT_EQ(c.tensor_size, 2);
  EXPECT_TRUE(c.sequence_parallel);
  EXPECT_NO_THROW(validate(c, 2));
  EXPECT_NO_THROW(validate(c, 4));  // dp 2
  auto message = [](const TrainConfig& t, int world) {
    try {
      validate(t, world);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  TrainConfig heads = c;  // the default model: hidden 64, 4 heads
  heads.tensor_size = 8;
  EXPECT_NE(message(heads, 8).find("num_heads 4 is not divisible by the tensor-parallel size 8"),
            std::string::npos)
      << message(heads, 8);
  TrainConfig mode = c;  // size 2 is not a q × q grid
  mode.tensor_mode = "2d";
  mode.sequence_parallel = false;
  EXPECT_NE(message(mode, 2).find("2d needs a square size"), std::string::npos) << message(mode, 2);
  TrainConfig none = c;
  none.tensor_mode = "none";
  EXPECT_NE(message(none, 2).find("needs parallel.tensor.mode"), std::string::npos);
  TrainConfig sp = c;
  sp.tensor_size = 1;
  sp.tensor_mode = "1d";
  EXPECT_NE(message(sp, 1).find("sequence_parallel = true needs parallel.tensor.size > 1"),
            std::string::npos)
      << message(sp, 1);
}

TEST(Config, PlanLayoutFollowsTheConfig) {
  TrainConfig c = parse_config("", "t", {});
  c.pipeline = 2;
  c.num_microbatches = 4;
  c.zero_stage = 1;
  c.precision = "bf16";
  const plan::Layout l = plan_layout(c, 4);
  EXPECT_EQ(l.dp(), 2);
  EXPECT_EQ(l.pp, 2);
  EXPECT_EQ(l.num_microbatches, 4);
  EXPECT_EQ(l.precision, DType::BF16);
  EXPECT_TRUE(l.data_parallel_plugin);
  const auto p = plan::make_plan(c.vit(), l);
  ASSERT_EQ(p.stages.size(), 2u);
  EXPECT_GT(p.stages[0].memory.peak, 0);
  // One process without ZeRO runs without a data-parallel plugin: no bucket buffers.
  TrainConfig one = parse_config("", "t", {});
  EXPECT_FALSE(plan_layout(one, 1).data_parallel_plugin);
  EXPECT_EQ(plan::make_plan(one.vit(), plan_layout(one, 1)).stages[0].memory.buffers, 0);
}

TEST(Config, ResolvedTomlLoadsBack) {
  // to_toml opens each section once ([parallel] before [parallel.tensor]) and writes the model
  // as resolved, so the explorer can save its knobs as a config that vit_train loads.
  for (const std::string model : {"", "name = \"vit_base_patch16_224\"\nnum_classes = 10\n"}) {
    TrainConfig c =
        parse_config("[model]\n" + model +
                         "depth = 6\n[parallel]\npipeline = 2\ntensor = { mode = \"1d\", "
                         "size = 2 }\n",
                     "a.toml", {"parallel.zero_stage=1"});
    const TrainConfig d = parse_config(to_toml(c), "b.toml", {});
    EXPECT_EQ(d.pipeline, 2);
    EXPECT_EQ(d.tensor_mode, "1d");
    EXPECT_EQ(d.tensor_size, 2);
    EXPECT_EQ(d.zero_stage, 1);
    EXPECT_EQ(d.vit().depth, 6);
    EXPECT_EQ(d.vit().embed_dim, c.vit().embed_dim);
    EXPECT_EQ(d.vit().in_chans, c.vit().in_chans);
    EXPECT_EQ(to_toml(d), to_toml(c));
  }
}

TEST(Config, SyntheticDatasetIsModelSized) {
  TrainConfig c = parse_config(R"(
[model]
name = "vit_base_patch16_224"
num_classes = 1000
[data]
dataset = "synthetic"
synthetic_size = 2560
)",
                               "t", {});
  EXPECT_EQ(c.synthetic_size, 2560);
  EXPECT_EQ(c.vit().in_chans, 3);  // no dataset to say otherwise: RGB
  EXPECT_EQ(c.vit().img_size, 224);
  EXPECT_NO_THROW(validate(c, 1));  // any number of classes
  EXPECT_EQ(TrainConfig{}.synthetic_size, 50000);
  EXPECT_NO_THROW(validate(
      parse_config("[model]\nin_chans = 1\n[data]\ndataset = \"synthetic\"\n", "t", {}), 1));
  expect_error("[data]\ndataset = \"synthetic\"\nsynthetic_size = 0\n",
               {"data.synthetic_size = 0 is outside [1, inf]"});
  expect_error("[data]\nsynthetic_size = 100\n",
               {"data.synthetic_size = 100 needs data.dataset = \"synthetic\"", "fashion_mnist"});
  expect_error("[data]\ndataset = \"imagenet\"\n", {"data.dataset", "synthetic"});
  // --set works as for the other keys.
  EXPECT_EQ(
      parse_config("", "t", {"data.dataset=synthetic", "data.synthetic_size=7"}).synthetic_size, 7);
}
