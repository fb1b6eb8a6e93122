// The fuzz targets: one per parser, each with valid seeds built here. File-based readers (IDX,
// CIFAR-10, image folders, the sharded index) get their input written into a scratch directory
// (tmp_dir, /dev/shm when there is one) and read back through the public loader.
#include <zlib.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "cai/checkpoint/checkpoint.h"
#include "cai/checkpoint/safetensors.h"
#include "cai/config/config.h"
#include "cai/core/error.h"
#include "cai/data/data.h"
#include "cluster.h"
#include "cmd_benchmark.h"
#include "cmd_run.h"
#include "fuzz.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wsign-compare"
#define STB_IMAGE_WRITE_STATIC
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb_image_write.h>
#pragma GCC diagnostic pop

namespace cai::fuzz {

#ifdef CAI_FUZZ_HAVE_TRACE
Target trace_target();
Target metrics_target(const std::string& tmp);
#endif

Target loss_scaler_state_target();  // targets_state.cpp

namespace {

namespace fs = std::filesystem;

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f.good()) throw std::runtime_error("fuzz: cannot write " + path);
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

std::vector<std::string> files_in(const char* dir, const std::string& ext) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!dir || !fs::is_directory(dir, ec)) return out;
  std::vector<fs::path> ps;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ext) ps.push_back(e.path());
  std::sort(ps.begin(), ps.end());
  for (const auto& p : ps) out.push_back(read_bytes(p.string()));
  return out;
}

std::string gzip(const std::string& raw) {
  z_stream z{};
  deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&z, raw.size()) + 32, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data()));
  z.avail_in = static_cast<uInt>(raw.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string be32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>(v >> (24 - 8 * i));
  return s;
}

std::string idx_images(uint32_t n, uint32_t rows, uint32_t cols) {
  std::string s = be32(0x803) + be32(n) + be32(rows) + be32(cols);
  for (uint32_t i = 0; i < n * rows * cols; ++i) s.push_back(static_cast<char>(i * 37));
  return s;
}

std::string idx_labels(uint32_t n) {
  std::string s = be32(0x801) + be32(n);
  for (uint32_t i = 0; i < n; ++i) s.push_back(static_cast<char>(i % 10));
  return s;
}

// Reads every sample a loaded dataset has (at most 4), as the loader would.
void touch(const data::Dataset& ds) {
  std::vector<float> buf(static_cast<size_t>(ds.channels() * ds.height() * ds.width()));
  const int64_t n = ds.size();
  for (int64_t i : {int64_t{0}, n / 2, n - 1})
    if (i >= 0 && i < n) {
      const int32_t label = ds.get(i, buf.data());
      if (label < 0 || label >= ds.num_classes())
        throw std::logic_error("fuzz: label " + std::to_string(label) + " outside the classes");
    }
}

Target idx_target(const std::string& tmp, bool mutate_images) {
  const std::string dir = tmp + (mutate_images ? "/idx-images" : "/idx-labels");
  fs::create_directories(dir);
  const std::string img = dir + "/images", lab = dir + "/labels";
  Target t;
  t.name = mutate_images ? "idx_images" : "idx_labels";
  t.text = false;
  if (mutate_images) {
    write_file(lab, idx_labels(3));
    t.seeds = {idx_images(3, 4, 5), gzip(idx_images(3, 4, 5)), idx_images(3, 1, 1)};
  } else {
    write_file(img, idx_images(3, 4, 5));
    t.seeds = {idx_labels(3), gzip(idx_labels(3))};
  }
  t.run = [img, lab, mutate_images](const std::string& in) {
    write_file(mutate_images ? img : lab, in);
    touch(*data::load_idx(img, lab, "fuzz"));
  };
  return t;
}

Target cifar_target(const std::string& tmp) {
  const std::string dir = tmp + "/cifar";
  fs::create_directories(dir);
  std::string rec;
  for (int r = 0; r < 2; ++r) {
    rec.push_back(static_cast<char>(r + 3));
    for (int i = 0; i < 3072; ++i) rec.push_back(static_cast<char>(i * 7 + r));
  }
  Target t;
  t.name = "cifar10";
  t.text = false;
  t.seeds = {rec, gzip(rec)};
  t.run = [dir](const std::string& in) {
    write_file(dir + "/test_batch.bin", in);
    touch(*data::load_cifar10(dir, false));
  };
  return t;
}

void append_bytes(void* ctx, void* data, int size) {
  static_cast<std::string*>(ctx)->append(static_cast<const char*>(data), static_cast<size_t>(size));
}

Target image_target(const std::string& tmp) {
  const std::string dir = tmp + "/images";
  fs::create_directories(dir + "/class_a");
  const int w = 5, h = 4;
  std::vector<unsigned char> rgb(w * h * 3), gray(w * h);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<unsigned char>(i * 11);
  for (size_t i = 0; i < gray.size(); ++i) gray[i] = static_cast<unsigned char>(i * 13);
  std::string png, png_gray, bmp, jpg, tga;
  stbi_write_png_to_func(append_bytes, &png, w, h, 3, rgb.data(), w * 3);
  stbi_write_png_to_func(append_bytes, &png_gray, w, h, 1, gray.data(), w);
  stbi_write_bmp_to_func(append_bytes, &bmp, w, h, 3, rgb.data());
  stbi_write_jpg_to_func(append_bytes, &jpg, w, h, 3, rgb.data(), 90);
  stbi_write_tga_to_func(append_bytes, &tga, w, h, 3, rgb.data());
  std::string ppm = "P6\n5 4\n255\n" + std::string(rgb.begin(), rgb.end());
  Target t;
  t.name = "image";
  t.text = false;
  t.seeds = {png, png_gray, bmp, jpg, tga, ppm};
  const std::string file = dir + "/class_a/x.png";
  // Fuzz-only limits (the product's are 2^24 pixels, 8192 a side; unit tests in
  // tests/data_tests/test_datasets.cpp keep them): a header declaring a large image is refused
  // before decoding, so that each input is parsed (every header, chunk, marker and Huffman path)
  // but at most a 256x256 image, or one of 512 a side whose size stbi_info cannot read, is
  // decoded. Under ASan a 4096x4096 decode took seconds (23-39 inputs/s, one input 15 s).
  const data::ImageLimits limits{.max_pixels = 256 * 256, .max_side = 512};
  t.run = [dir, file, limits](const std::string& in) {
    write_file(file, in);
    touch(*data::load_image_folder(dir, 8, limits));
  };
  return t;
}

std::map<std::string, Tensor> small_tensors() {
  std::map<std::string, Tensor> m;
  Tensor a = Tensor::empty({2, 3}, DType::F32);
  for (int i = 0; i < 6; ++i) static_cast<float*>(a.raw())[i] = static_cast<float>(i);
  Tensor b = Tensor::empty({4}, DType::BF16);
  std::memset(b.raw(), 0x3f, b.nbytes());
  Tensor c = Tensor::empty({1, 2}, DType::I32);
  std::memset(c.raw(), 1, c.nbytes());
  Tensor d = Tensor::empty({0, 5}, DType::F16);
  m.emplace("blocks.0.weight", a);
  m.emplace("blocks.0.bias", b);
  m.emplace("step", c);
  m.emplace("empty", d);
  return m;
}

Target safetensors_target(const std::string& tmp) {
  const std::string f1 = tmp + "/seed1.safetensors", f2 = tmp + "/seed2.safetensors";
  checkpoint::save_safetensors(f1, small_tensors(), {{"format", "pt"}});
  checkpoint::save_safetensors(f2, {{"x", Tensor::empty({3}, DType::F16)}});
  Target t;
  t.name = "safetensors";
  t.text = true;  // the header is JSON
  // Issue 42: F32 [2^62] with data_offsets [0, 0] (2^64 bytes, 0 when the count wraps).
  const std::string wrapped =
      R"({"w": {"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 0]}})";
  std::string wrapped_file(8, '\0');  // the 8-byte little-endian header length, then the header
  wrapped_file[0] = static_cast<char>(wrapped.size());
  t.seeds = {read_bytes(f1), read_bytes(f2), wrapped_file + wrapped};
  t.run = [](const std::string& in) {
    auto f = checkpoint::parse_safetensors(in, "fuzz.safetensors");
    for (const auto& [name, x] : f.tensors) {
      // The bytes from the shape in checked arithmetic, not x.nbytes(): numel * 4 wraps to 0
      // for 2^62 F32 elements, the very size the reader must refuse.
      bool empty = false;
      for (int64_t d : x.shape()) {
        if (d < 0) throw std::logic_error("fuzz: negative dimension");
        empty = empty || d == 0;
      }
      uint64_t bytes = empty ? 0 : dtype_size(x.dtype());
      for (int64_t d : x.shape())
        if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes) || bytes > in.size())
          throw std::logic_error("fuzz: tensor larger than the file");
    }
  };
  return t;
}

Target index_target(const std::string& tmp) {
  const std::string dir = tmp + "/sharded";
  fs::remove_all(dir);
  const auto files = checkpoint::save_sharded(dir, small_tensors(), 16);
  Target t;
  t.name = "safetensors_index";
  t.text = true;
  const std::string index = dir + "/model.safetensors.index.json";
  t.seeds = {read_bytes(index)};
  t.run = [dir, index](const std::string& in) {
    write_file(index, in);
    checkpoint::load_model_weights(dir);
  };
  return t;
}

// A per-rank checkpoint written by hand in the format save_checkpoint(per_rank) writes: "w"
// [4, 6] cut in 2 tensor-parallel parts along dim 0, each part in 2 element ranges (2 dp ranks),
// "b" [6] whole, optimizer state "w.exp_avg" and "step"; the index JSON is the fuzzed input.
Target per_rank_index_target(const std::string& tmp) {
  const std::string dir = tmp + "/per_rank";
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto range = [](float from, int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = from + static_cast<float>(i);
    return Tensor::from_vector(v, {n});
  };
  nlohmann::json model, opt;
  model["b"] = {{"shape", {6}}, {"slices", nlohmann::json::array()}};
  model["w"] = {{"shape", {4, 6}}, {"slices", nlohmann::json::array()}};
  opt["w.exp_avg"] = model["w"];
  opt["step"] = {{"shape", {1}}, {"slices", nlohmann::json::array()}};
  for (int tp = 0; tp < 2; ++tp)
    for (int dp = 0; dp < 2; ++dp) {
      const int r = tp * 2 + dp;
      const std::string mf = fmt::format("model-rank{:05d}-of-00004.safetensors", r);
      const std::string of = fmt::format("optimizer-rank{:05d}-of-00004.safetensors", r);
      std::map<std::string, Tensor> m{{"w", range(100.0f * r, 6)}}, o{{"w.exp_avg", range(r, 6)}};
      const nlohmann::json spec = {{"rank", tp}, {"size", 2}, {"cuts", {{0, 1, 2, 1}}}};
      model["w"]["slices"].push_back(
          {{"file", mf}, {"tp", spec}, {"begin", dp * 6}, {"end", dp * 6 + 6}});
      opt["w.exp_avg"]["slices"].push_back(
          {{"file", of}, {"tp", spec}, {"begin", dp * 6}, {"end", dp * 6 + 6}});
      const nlohmann::json whole = {{"rank", 0}, {"size", 1}, {"cuts", nlohmann::json::array()}};
      if (tp == 0) {
        m["b"] = range(-3.0f * dp, 3);
        model["b"]["slices"].push_back(
            {{"file", mf}, {"tp", whole}, {"begin", dp * 3}, {"end", dp * 3 + 3}});
      }
      if (r == 0) {
        o["step"] = range(2.0f, 1);
        opt["step"]["slices"].push_back({{"file", of}, {"tp", whole}, {"begin", 0}, {"end", 1}});
      }
      checkpoint::save_safetensors(dir + "/" + mf, m);
      checkpoint::save_safetensors(dir + "/" + of, o);
    }
  write_file(dir + "/trainer_state.json",
             R"({"epoch": 0, "step_in_epoch": 2, "global_step": 2, "scheduler_last": 2,
                 "loss_scaler": [], "layout": "dp 2 × pp 1 × tp 2", "version": "fuzz"})");
  const nlohmann::json index = {{"format", "colossalai-cpp per-rank checkpoint 1"},
                                {"world_size", 4},
                                {"layout", "dp 2 × pp 1 × tp 2"},
                                {"model", model},
                                {"optimizer", opt}};
  Target t;
  t.name = "per_rank_index";
  t.text = true;
  t.seeds = {index.dump(1)};
  const std::string path = dir + "/checkpoint.index.json";
  t.run = [dir, path](const std::string& in) {
    write_file(path, in);
    const auto c = checkpoint::load_checkpoint(dir);
    for (const auto* part : {&c.model, &c.optimizer})
      for (const auto& [name, x] : *part)
        if (x.numel() > (int64_t{1} << 20)) throw std::logic_error("fuzz: tensor beyond the files");
  };
  return t;
}

Target config_target() {
  Target t;
  t.name = "vit_train_config";
  t.seeds = files_in(CAI_CONFIG_DIR, ".toml");
  t.seeds.push_back(
      "[train]\nbatch_size = 8\nlearning_rate = 1e-3\n[model]\nname = \"vit_tiny\"\n"
      "[parallel]\nnum_layers_per_stage = [1, 2]\ntensor = { mode = \"2.5d\", size = 8, depth = 2 "
      "}\n[precision]\nmode = \"bf16\"\nmax_scale = 65536.0\n[data]\ndataset = \"synthetic\"\n"
      "[checkpoint]\ndir = \"ckpt\"\nmax_shard_mb = 0.5\n");
  t.run = [](const std::string& in) { config::parse_config(in, "fuzz.toml", {}); };
  return t;
}

// --set section.key=value: the value is the fuzzed part (key picked by its first byte).
Target config_set_target() {
  static const char* const keys[] = {"train.batch_size",
                                     "train.learning_rate",
                                     "model.name",
                                     "model.mlp_ratio",
                                     "parallel.num_layers_per_stage",
                                     "parallel.tensor.mode",
                                     "precision.backoff_factor",
                                     "data.dataset"};
  Target t;
  t.name = "vit_train_config_set";
  const char* const values[] = {"128",       "2e-3",   "vit_base", "4.0",
                                "[1, 2, 3]", "\"1d\"", "0.5",      "cifar10"};
  for (size_t k = 0; k < std::size(values); ++k)
    t.seeds.push_back(std::string(1, static_cast<char>(k)) + values[k]);
  t.run = [](const std::string& in) {
    if (in.empty()) return;
    const std::string key = keys[static_cast<unsigned char>(in[0]) % std::size(keys)];
    config::parse_config("", "fuzz.toml", {key + "=" + in.substr(1)});
  };
  return t;
}

Target hostfile_target() {
  Target t;
  t.name = "hostfile";
  t.seeds = {"node1 slots=8\nnode2 slots=8\n", "# two hosts\na\nb # trailing\n\n  c slots=2\n",
             "gpu-01.example.com slots=4\n"};
  t.run = [](const std::string& in) {
    for (const auto& e : app::parse_hostfile(in, "fuzz-hosts"))
      if (e.slots != -1 && e.slots < 1)
        throw std::logic_error("fuzz: host " + e.name +
                               " accepted with slots=" + std::to_string(e.slots));
  };
  return t;
}

Target cluster_target() {
  Target t;
  t.name = "cluster";
  t.seeds = files_in(CAI_CLUSTER_DIR, ".toml");
  t.run = [](const std::string& in) {
    const sim::Cluster c = sim::parse_cluster(in, "fuzz.toml");
    if (c.gpu.memory_bytes < 0) throw std::logic_error("fuzz: negative memory");
  };
  return t;
}

Target calibration_target() {
  Target t;
  t.name = "calibration";
  t.seeds = {
      "{\"device\": \"x\", \"default\": {\"flops\": 0.5, \"bytes\": 0.7}, \"ops\": {\"gemm\": "
      "{\"flops\": 0.8}}, \"layer_scale\": {\"a|fwd b1\": 1.0}, \"samples\": {\"attn|fwd\": "
      "[[1e9, 1e6, 0.001], [4e9, 2e6, 0.003]], \"optimizer|step\": [[1000, 0, 1e-5]]}}"};
  for (auto& s : files_in(CAI_CALIBRATION_DIR, ".json")) t.seeds.push_back(std::move(s));
  t.run = [](const std::string& in) {
    const sim::Calibration c = sim::parse_calibration(in, "fuzz.json");
    for (const auto& [key, v] : c.samples)
      for (double f : {1.0, 1e9, 3e9, 1e18}) c.seconds_of(key, f, nullptr);
  };
  return t;
}

}  // namespace

// colossalai benchmark --compare's JSON (a --json of benchmark or colossalai-sim
// --benchmark-layouts).
Target benchmark_json_target(const std::string& tmp) {
  const std::string path = tmp + "/benchmark.json";
  Target t;
  t.name = "benchmark_json";
  t.seeds = {
      R"({"gpus": 4, "device": "cuda", "precision": "bf16", "model": "mlp", "layouts": [
        {"mode": null, "size": 1, "depth": 1, "status": "ok", "reason": "", "simulated": false,
         "forward_ms": 0.48, "backward_ms": 1.557, "optimizer_ms": 0, "step_ms": 2.037,
         "samples_per_s": 15711.4, "samples_per_s_per_gpu": 3927.8, "tflops": 405.0,
         "peak_mem_bytes": 508297216, "comm_bytes": 0},
        {"mode": "2.5d", "size": 4, "depth": 1, "status": "failed", "reason": "heads"}]})",
      R"({"gpus": 4, "cluster": "h200-4", "simulated": true, "layouts": [
        {"mode": "1d", "size": 4, "depth": 1, "status": "ok", "simulated": true, "dp": 1,
         "forward_ms": 0.34, "backward_ms": 0.479, "optimizer_ms": null, "step_ms": 0.82,
         "samples_per_s": 9761.2, "peak_mem_bytes": 243269632, "comm_bytes": 67108864,
         "dp_comm_bytes": 0, "fits_memory": true}]})"};
  t.run = [path](const std::string& in) {
    write_file(path, in);
    app::read_benchmark_json(path);
  };
  return t;
}

std::vector<Target> all_targets(const std::string& tmp) {
  fs::create_directories(tmp);
  std::vector<Target> ts = {config_target(),
                            config_set_target(),
                            hostfile_target(),
                            idx_target(tmp, true),
                            idx_target(tmp, false),
                            cifar_target(tmp),
                            image_target(tmp),
                            safetensors_target(tmp),
                            index_target(tmp),
                            per_rank_index_target(tmp),
                            cluster_target(),
                            calibration_target(),
                            benchmark_json_target(tmp),
                            loss_scaler_state_target()};
#ifdef CAI_FUZZ_HAVE_TRACE
  ts.push_back(trace_target());
  ts.push_back(metrics_target(tmp));
#endif
  return ts;
}

}  // namespace cai::fuzz
