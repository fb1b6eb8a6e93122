// safetensors files and sharded checkpoints: round trips in every dtype, Hugging Face's index,
// atomic directories, and every corruption a reader must refuse, named in the error.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "cai/checkpoint/safetensors.h"
#include "cai/core/error.h"

using namespace cai;
using namespace cai::checkpoint;
namespace fs = std::filesystem;

namespace {
std::string tmpdir(const std::string& name) {
  const std::string d = (fs::temp_directory_path() / ("cai_st_" + name)).string();
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

Tensor ramp(const Shape& s, DType t, float scale = 1.0f) {
  std::vector<float> v(shape_numel(s));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * (static_cast<float>(i) - 3.5f);
  if (t == DType::I32) {
    std::vector<int32_t> w(v.size());
    for (size_t i = 0; i < v.size(); ++i) w[i] = static_cast<int32_t>(i) - 7;
    return Tensor::from_vector(w, s);
  }
  return Tensor::from_vector(v, s).to(t);
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// A file from a header text and a data size.
std::string file_with(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + header + std::string(data_bytes, '\x01');
}

void expect_error(const std::string& bytes, const std::string& needle) {
  try {
    parse_safetensors(bytes, "probe.safetensors");
    ADD_FAILURE() << "accepted; expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find(needle), std::string::npos) << w;
    EXPECT_NE(w.find("probe.safetensors"), std::string::npos) << w;
  }
}
}  // namespace

TEST(Safetensors, RoundTripEveryDtypeWithMetadata) {
  const std::string d = tmpdir("roundtrip");
  std::map<std::string, Tensor> ts = {{"a.weight", ramp({3, 5}, DType::F32)},
                                      {"b.bias", ramp({7}, DType::BF16)},
                                      {"c", ramp({2, 2, 3}, DType::F16)},
                                      {"d.count", ramp({4}, DType::I32)},
                                      {"empty", Tensor::zeros({0, 3})}};
  save_safetensors(d + "/m.safetensors", ts, {{"format", "pt"}});
  const auto f = load_safetensors(d + "/m.safetensors");
  ASSERT_EQ(f.tensors.size(), ts.size());
  for (const auto& [k, v] : ts) EXPECT_TRUE(same_bytes(v, f.tensors.at(k))) << k;
  EXPECT_EQ(f.metadata.at("format"), "pt");
  // The header is padded to 8 bytes (what the Rust reader expects of aligned data).
  std::ifstream in(d + "/m.safetensors", std::ios::binary);
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  EXPECT_EQ(len[0] % 8, 0);
}

TEST(Safetensors, ShardedWithAHuggingFaceIndex) {
  const std::string d = tmpdir("sharded");
  std::map<std::string, Tensor> ts;
  for (int i = 0; i < 5; ++i) ts["blocks." + std::to_string(i) + ".w"] = ramp({64}, DType::F32, i);
  const auto files = save_sharded(d, ts, 600);  // 256 B per tensor: 2 per file
  ASSERT_EQ(files.size(), 4u);                  // 3 shards + the index
  EXPECT_TRUE(fs::exists(d + "/model-00001-of-00003.safetensors"));
  const auto f = load_model_weights(d);
  ASSERT_EQ(f.tensors.size(), 5u);
  for (const auto& [k, v] : ts) EXPECT_TRUE(same_bytes(v, f.tensors.at(k))) << k;
  // One file when it fits.
  const std::string d1 = tmpdir("single");
  EXPECT_EQ(save_sharded(d1, ts, 1 << 20), std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(load_model_weights(d1).tensors.size(), 5u);
  // An index naming a tensor its file lacks, and a total_size that disagrees.
  std::ofstream(d + "/model.safetensors.index.json")
      << R"({"metadata": {"total_size": 1280}, "weight_map": {"x": "model-00001-of-00003.safetensors"}})";
  EXPECT_THROW(load_model_weights(d), Error);
  std::ofstream(d + "/model.safetensors.index.json")
      << R"({"weight_map": {"blocks.0.w": "../etc/passwd"}})";
  EXPECT_THROW(load_model_weights(d), Error);
}

TEST(Safetensors, CorruptFilesAreRefusedNamingWhatIsWrong) {
  expect_error(std::string(5, '\0'), "shorter than the 8-byte header length");
  expect_error(file_with("{\"a\": 1}", 0).substr(0, 8) + "{", "beyond the file");
  expect_error(file_with("{not json}", 0), "not valid JSON");
  expect_error(file_with(R"({"w": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})", 8),
               "dtype \"F64\"");
  expect_error(file_with(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 12]}})", 12),
               "tensor 'w' is fp32 [2] (8 bytes) but its data_offsets span 12");
  expect_error(file_with(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4),
               "outside the 4 data bytes");
  expect_error(file_with(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                    "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                         12),
               "overlaps");
  expect_error(file_with(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8),
               "has a hole");
  expect_error(
      file_with(
          R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 64], "data_offsets": [0, 0]}})",
          0),
      "overflows");
  expect_error(file_with(R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}})", 0),
               "bad dimension");
  expect_error(file_with(R"({"w": {"dtype": "F32", "shape": [1]}})", 4), "needs dtype, shape");
  // Truncated: every prefix of a good file is refused.
  const std::string d = tmpdir("truncated");
  save_safetensors(d + "/t.safetensors", {{"w", ramp({3, 3}, DType::F32)}});
  std::ifstream in(d + "/t.safetensors", std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (size_t n = 0; n < good.size(); ++n)
    EXPECT_THROW(parse_safetensors(good.substr(0, n), "prefix"), Error) << n;
  EXPECT_NO_THROW(parse_safetensors(good, "whole"));
}

// Issue 42: F32 [2^62] is 2^64 bytes, which wrapped to 0 in 64 bits and matched data_offsets
// [0, 0]; allocating the tensor then threw std::length_error out of the reader (`vit_train
// --export-to` died on it).
TEST(Safetensors, ByteCountBeyond64BitsIsRefusedNamingTheTensor) {
  const std::string header =
      R"({"w": {"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 0]}})";
  expect_error(file_with(header, 0),
               "tensor 'w' is fp32 [4611686018427387904] (4611686018427387904 elements of 4 "
               "bytes: more than 2^64) but its data_offsets span 0 bytes");
  // As `--export-to` meets it: a model.safetensors in a directory.
  const std::string d = tmpdir("wrapped");
  std::ofstream(d + "/model.safetensors", std::ios::binary) << file_with(header, 0);
  try {
    load_model_weights(d);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(d + "/model.safetensors: tensor 'w'"), std::string::npos)
        << e.what();
  }
  // A dimension beyond int64_t beside a 0 (no elements at all) is no shape either.
  expect_error(file_with(R"({"w": {"dtype": "F32", "shape": [0, 9223372036854775808],
                                "data_offsets": [0, 0]}})",
                         0),
               "tensor 'w' shape [0,9223372036854775808] overflows");
}

// Issue 42: the Hugging Face index was written unchecked (a full disk left a truncated index and
// no error), and a directory under a file escaped as std::filesystem::filesystem_error.
TEST(Safetensors, ShardedWriteErrorsAreCaiErrorsNamingThePath) {
  std::map<std::string, Tensor> ts;
  for (int i = 0; i < 3; ++i) ts["blocks." + std::to_string(i) + ".w"] = ramp({64}, DType::F32, i);
  auto expect_write_error = [&](const std::string& dir, const std::string& needle) {
    try {
      save_sharded(dir, ts, 300);  // 256 B per tensor: 3 shards and an index
      ADD_FAILURE() << "wrote " << dir << "; expected an error containing '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  // A disk that fills up at the index: /dev/full fails every write with ENOSPC.
  const std::string full = tmpdir("index_full");
  fs::create_symlink("/dev/full", full + "/model.safetensors.index.json");
  expect_write_error(full, "error writing " + full + "/model.safetensors.index.json");
  // A directory whose parent is a file.
  const std::string file = tmpdir("index_parent") + "/file";
  std::ofstream(file) << "not a directory";
  expect_write_error(file + "/out", "cannot create the directory " + file + "/out");
}

TEST(Safetensors, AtomicDirectoriesAppearWholeOrNotAtAll) {
  const std::string root = tmpdir("atomic");
  {
    AtomicDir a(root + "/ckpt");
    save_safetensors(a.path() + "/m.safetensors", {{"w", ramp({2}, DType::F32)}});
    EXPECT_FALSE(fs::exists(root + "/ckpt"));
  }  // never committed: gone, and nothing at the final name
  EXPECT_FALSE(fs::exists(root + "/ckpt"));
  EXPECT_EQ(std::distance(fs::directory_iterator(root), fs::directory_iterator()), 0);
  AtomicDir b(root + "/ckpt");
  save_safetensors(b.path() + "/m.safetensors", {{"w", ramp({2}, DType::F32)}});
  b.commit();
  EXPECT_TRUE(fs::exists(root + "/ckpt/m.safetensors"));
  EXPECT_THROW(AtomicDir(root + "/ckpt"), Error);  // never written over
  // Replacing (the same step saved again): the new contents, nothing else left beside them.
  AtomicDir c(root + "/ckpt", root + "/ckpt.tmp", true);
  save_safetensors(c.path() + "/n.safetensors", {{"w", ramp({3}, DType::F32)}});
  EXPECT_TRUE(fs::exists(root + "/ckpt/m.safetensors"));  // the old one until the commit
  c.commit();
  EXPECT_TRUE(fs::exists(root + "/ckpt/n.safetensors"));
  EXPECT_FALSE(fs::exists(root + "/ckpt/m.safetensors"));
  EXPECT_EQ(std::distance(fs::directory_iterator(root), fs::directory_iterator()), 1);
}
