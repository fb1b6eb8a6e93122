// Datasets: IDX (raw and gzip) round trips and error messages, the real Fashion-MNIST, CIFAR-10
// binary records, image folders of PNG files, subsets and normalisation statistics.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cai/core/error.h"
#include "cai/data/data.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#define STB_IMAGE_WRITE_STATIC
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb_image_write.h>
#pragma GCC diagnostic pop

using namespace cai;
using namespace cai::data;
namespace fs = std::filesystem;

namespace {

// A fresh directory under the system temp dir, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path = fs::temp_directory_path() /
           fmt::format("cai_data_{}_{}_{}", ::getpid(), info->test_suite_name(), info->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

void put_be32(std::vector<uint8_t>& v, uint32_t x) {
  for (int s = 24; s >= 0; s -= 8) v.push_back(static_cast<uint8_t>(x >> s));
}

std::vector<uint8_t> idx_images(const std::vector<std::vector<uint8_t>>& imgs, int rows, int cols) {
  std::vector<uint8_t> v;
  put_be32(v, 0x00000803);
  put_be32(v, static_cast<uint32_t>(imgs.size()));
  put_be32(v, static_cast<uint32_t>(rows));
  put_be32(v, static_cast<uint32_t>(cols));
  for (const auto& im : imgs) v.insert(v.end(), im.begin(), im.end());
  return v;
}

std::vector<uint8_t> idx_labels(const std::vector<uint8_t>& labels) {
  std::vector<uint8_t> v;
  put_be32(v, 0x00000801);
  put_be32(v, static_cast<uint32_t>(labels.size()));
  v.insert(v.end(), labels.begin(), labels.end());
  return v;
}

void write_raw(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

void write_gz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile g = gzopen(path.c_str(), "wb");
  ASSERT_NE(g, nullptr) << path;
  ASSERT_EQ(gzwrite(g, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(g), Z_OK);
}

std::vector<uint8_t> read_gz(const std::string& path) {
  std::vector<uint8_t> out;
  gzFile g = gzopen(path.c_str(), "rb");
  if (!g) return out;
  uint8_t buf[1 << 16];
  int n;
  while ((n = gzread(g, buf, sizeof buf)) > 0) out.insert(out.end(), buf, buf + n);
  gzclose(g);
  return out;
}

// The message of the cai::Error thrown by f ("" when nothing is thrown).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Three 2x3 images with distinct pixels and labels 0, 7, 3.
struct Synthetic {
  std::vector<std::vector<uint8_t>> imgs = {
      {0, 1, 2, 3, 4, 5}, {255, 128, 64, 32, 16, 8}, {10, 20, 30, 40, 50, 60}};
  std::vector<uint8_t> labels = {0, 7, 3};
};

void expect_synthetic(const Dataset& ds) {
  Synthetic s;
  ASSERT_EQ(ds.size(), 3);
  EXPECT_EQ(ds.channels(), 1);
  EXPECT_EQ(ds.height(), 2);
  EXPECT_EQ(ds.width(), 3);
  EXPECT_EQ(ds.num_classes(), 10);
  for (int i = 0; i < 3; ++i) {
    float px[6];
    EXPECT_EQ(ds.get(i, px), s.labels[i]);
    for (int k = 0; k < 6; ++k) EXPECT_FLOAT_EQ(px[k], s.imgs[i][k] / 255.0f) << i << "," << k;
  }
}

}  // namespace

TEST(Idx, RawRoundTrip) {
  TempDir d;
  Synthetic s;
  write_raw(d / "img", idx_images(s.imgs, 2, 3));
  write_raw(d / "lab", idx_labels(s.labels));
  auto ds = load_idx(d / "img", d / "lab", "synthetic");
  expect_synthetic(*ds);
  EXPECT_EQ(ds->describe(), "synthetic (3 2x3x1)");
  EXPECT_NE(error_of([&] {
              float px[6];
              ds->get(3, px);
            }),
            "");
}

TEST(Idx, GzipRoundTripChosenByContent) {
  TempDir d;
  Synthetic s;
  // Compressed content without a .gz name and raw content with one: the magic decides.
  write_gz(d / "img", idx_images(s.imgs, 2, 3));
  write_raw(d / "lab.gz", idx_labels(s.labels));
  expect_synthetic(*load_idx(d / "img", d / "lab.gz"));
}

TEST(Idx, MnistDirPrefersGzAndListsWhatItLookedFor) {
  TempDir d;
  Synthetic s;
  write_gz(d / "train-images-idx3-ubyte.gz", idx_images(s.imgs, 2, 3));
  write_raw(d / "train-images-idx3-ubyte", idx_images({{1, 1, 1, 1, 1, 1}}, 2, 3));  // ignored
  write_raw(d / "train-labels-idx1-ubyte", idx_labels(s.labels));
  auto ds = load_mnist_dir(d.path.string(), true, "toy");
  expect_synthetic(*ds);
  EXPECT_EQ(ds->describe(), "toy train (3 2x3x1)");
  const std::string msg = error_of([&] { load_mnist_dir(d.path.string(), false); });
  EXPECT_NE(msg.find("[mnist]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("t10k-images-idx3-ubyte.gz"), std::string::npos) << msg;
  // Both candidates are listed: the .gz and the raw name (at the end of the message).
  const std::string raw = (d.path / "t10k-images-idx3-ubyte").string();
  ASSERT_GE(msg.size(), raw.size()) << msg;
  EXPECT_EQ(msg.substr(msg.size() - raw.size()), raw) << msg;
}

TEST(Idx, TruncatedFileNamesFileOffsetAndExpectedBytes) {
  TempDir d;
  Synthetic s;
  auto img = idx_images(s.imgs, 2, 3);  // 16 + 18 bytes
  img.resize(30);
  write_raw(d / "short-images", img);
  write_raw(d / "lab", idx_labels(s.labels));
  std::string msg = error_of([&] { load_idx(d / "short-images", d / "lab"); });
  EXPECT_NE(msg.find("[idx]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("short-images"), std::string::npos) << msg;
  EXPECT_NE(msg.find("offset 30"), std::string::npos) << msg;
  EXPECT_NE(msg.find("18 bytes"), std::string::npos) << msg;  // 3 images of 2x3
  EXPECT_NE(msg.find("34 bytes"), std::string::npos) << msg;

  // The same through gzip: offsets are in the decompressed data.
  write_gz(d / "short-images.gz", img);
  msg = error_of([&] { load_idx(d / "short-images.gz", d / "lab"); });
  EXPECT_NE(msg.find("short-images.gz"), std::string::npos) << msg;
  EXPECT_NE(msg.find("offset 30 (decompressed)"), std::string::npos) << msg;

  // A header cut inside the dimensions.
  write_raw(d / "short-header", {0, 0, 8, 3, 0, 0});
  msg = error_of([&] { load_idx(d / "short-header", d / "lab"); });
  EXPECT_NE(msg.find("short-header"), std::string::npos) << msg;
  EXPECT_NE(msg.find("offset 6"), std::string::npos) << msg;
  EXPECT_NE(msg.find("16 bytes of header"), std::string::npos) << msg;

  // A truncated gzip stream (the compressed file itself cut short).
  std::vector<uint8_t> big = idx_images(std::vector<std::vector<uint8_t>>(200, s.imgs[1]), 2, 3);
  for (size_t k = 16; k < big.size(); ++k) big[k] = static_cast<uint8_t>(k * 2654435761u >> 13);
  write_gz(d / "cut.gz", big);
  const auto gz_size = fs::file_size(d / "cut.gz");
  fs::resize_file(d / "cut.gz", gz_size / 2);
  msg = error_of([&] { load_idx(d / "cut.gz", d / "lab"); });
  EXPECT_NE(msg.find("cut.gz"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(decompressed)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1216 bytes"), std::string::npos) << msg;  // 16 + 200 * 6 expected
}

TEST(Idx, BadMagicNamesFileAndOffset) {
  TempDir d;
  Synthetic s;
  write_raw(d / "img", idx_images(s.imgs, 2, 3));
  write_raw(d / "lab", idx_labels(s.labels));
  // Labels given as images: magic 0x00000801 where 0x00000803 is expected.
  std::string msg = error_of([&] { load_idx(d / "lab", d / "img"); });
  EXPECT_NE(msg.find("[idx]"), std::string::npos) << msg;
  EXPECT_NE(msg.find(d / "lab"), std::string::npos) << msg;
  EXPECT_NE(msg.find("offset 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("0x00000801"), std::string::npos) << msg;
  EXPECT_NE(msg.find("0x00000803"), std::string::npos) << msg;
  // A text file.
  std::ofstream(d / "text") << "hello world, not an IDX file";
  msg = error_of([&] { load_idx(d / "img", d / "text"); });
  EXPECT_NE(msg.find(d / "text"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bad magic"), std::string::npos) << msg;
  // Trailing bytes are corruption too.
  auto lab = idx_labels(s.labels);
  lab.push_back(1);
  write_raw(d / "lab-long", lab);
  msg = error_of([&] { load_idx(d / "img", d / "lab-long"); });
  EXPECT_NE(msg.find("trailing"), std::string::npos) << msg;
  EXPECT_NE(msg.find("offset 11"), std::string::npos) << msg;
  // A missing file.
  msg = error_of([&] { load_idx(d / "nope", d / "lab"); });
  EXPECT_NE(msg.find(d / "nope"), std::string::npos) << msg;
}

TEST(Idx, HugeDimensionsDoNotWrapAround) {
  // 2^20 × 2^19 × 2^25 images would be 2^64 bytes: the product wraps to 0 in 64 bits, so a
  // 16-byte file would have matched it. Each multiplication is checked instead.
  TempDir d;
  Synthetic s;
  std::vector<uint8_t> img = {0, 0, 8, 3, 0, 0x10, 0, 0, 0, 0x08, 0, 0, 0x02, 0, 0, 0};
  write_raw(d / "img", img);
  write_raw(d / "lab", idx_labels(s.labels));
  const std::string msg = error_of([&] { load_idx(d / "img", d / "lab"); });
  EXPECT_NE(msg.find("implausibly large"), std::string::npos) << msg;
  EXPECT_NE(msg.find(d / "img"), std::string::npos) << msg;
}

TEST(Idx, GzipIsNotInflatedBeyondTheDeclaredSize) {
  // A small gzip file declaring 3 labels followed by 64 MiB of zeros: reading stops one byte
  // past the declared size (the error reports 1 trailing byte, not 64 MiB).
  TempDir d;
  Synthetic s;
  write_raw(d / "img", idx_images(s.imgs, 2, 3));
  auto lab = idx_labels(s.labels);
  lab.resize(lab.size() + (64u << 20), 0);
  write_gz(d / "bomb.gz", lab);
  EXPECT_LT(fs::file_size(d / "bomb.gz"), 1u << 20);
  const std::string msg = error_of([&] { load_idx(d / "img", d / "bomb.gz"); });
  EXPECT_NE(msg.find("1 unexpected trailing bytes"), std::string::npos) << msg;
}

TEST(Idx, CountMismatch) {
  TempDir d;
  Synthetic s;
  write_raw(d / "img", idx_images(s.imgs, 2, 3));
  write_raw(d / "lab", idx_labels({1, 2}));
  const std::string msg = error_of([&] { load_idx(d / "img", d / "lab"); });
  EXPECT_NE(msg.find("3 images"), std::string::npos) << msg;
  EXPECT_NE(msg.find("2 labels"), std::string::npos) << msg;
  EXPECT_NE(msg.find(d / "lab"), std::string::npos) << msg;
}

TEST(Idx, NumClassesFollowsTheLabels) {
  TempDir d;
  write_raw(d / "img", idx_images({{0}, {0}}, 1, 1));
  write_raw(d / "lab", idx_labels({2, 14}));
  auto ds = load_idx(d / "img", d / "lab");
  EXPECT_EQ(ds->num_classes(), 15);
  float px;
  EXPECT_EQ(ds->get(1, &px), 14);
}

TEST(FashionMnist, RealFilesLoad) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  auto train = load_mnist_dir(dir, true, "fashion-mnist");
  auto test = load_mnist_dir(dir, false, "fashion-mnist");
  ASSERT_EQ(train->size(), 60000);
  ASSERT_EQ(test->size(), 10000);
  for (const auto& ds : {train, test}) {
    EXPECT_EQ(ds->channels(), 1);
    EXPECT_EQ(ds->height(), 28);
    EXPECT_EQ(ds->width(), 28);
    EXPECT_EQ(ds->num_classes(), 10);
  }
  EXPECT_EQ(train->describe(), "fashion-mnist train (60000 28x28x1)");

  // Compare with the files read independently: label byte 8 + i, pixels from byte 16.
  const auto labels = read_gz(dir + "/train-labels-idx1-ubyte.gz");
  const auto images = read_gz(dir + "/train-images-idx3-ubyte.gz");
  ASSERT_EQ(labels.size(), 60008u);
  ASSERT_EQ(images.size(), 16u + 60000u * 784u);
  std::vector<float> px(784);
  std::vector<int> counts(10, 0);
  for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{12345}, int64_t{59999}}) {
    const int32_t label = train->get(i, px.data());
    EXPECT_EQ(label, labels[8 + i]) << i;
    float lo = 1, hi = 0;
    for (int k = 0; k < 784; ++k) {
      EXPECT_EQ(px[k], images[16 + i * 784 + k] / 255.0f);
      lo = std::min(lo, px[k]);
      hi = std::max(hi, px[k]);
    }
    EXPECT_GE(lo, 0.0f);
    EXPECT_LE(hi, 1.0f);
    EXPECT_GT(hi, 0.0f);
  }
  EXPECT_EQ(train->get(0, px.data()), 9);  // Fashion-MNIST's first training image is an ankle boot
  for (int64_t i = 0; i < 60000; i += 7) ++counts[train->get(i, px.data())];
  for (int c = 0; c < 10; ++c) EXPECT_GT(counts[c], 0) << c;
}

TEST(Cifar10, SyntheticRecords) {
  TempDir d;
  std::vector<uint8_t> bytes;
  for (int r = 0; r < 2; ++r) {
    bytes.push_back(static_cast<uint8_t>(r == 0 ? 6 : 9));
    for (int k = 0; k < 3072; ++k) bytes.push_back(static_cast<uint8_t>((k * 7 + r * 100) % 256));
  }
  write_raw(d / "test_batch.bin", bytes);
  auto ds = load_cifar10(d.path.string(), false);
  ASSERT_EQ(ds->size(), 2);
  EXPECT_EQ(ds->channels(), 3);
  EXPECT_EQ(ds->height(), 32);
  EXPECT_EQ(ds->width(), 32);
  EXPECT_EQ(ds->num_classes(), 10);
  std::vector<float> px(3072);
  EXPECT_EQ(ds->get(0, px.data()), 6);
  EXPECT_EQ(ds->get(1, px.data()), 9);
  // Record 1: the red plane then green then blue, 32x32 each: (c, y, x) is byte 1 + c*1024+y*32+x.
  for (int k : {0, 1, 31, 32, 1023, 1024, 2048, 3071})
    EXPECT_FLOAT_EQ(px[k], ((k * 7 + 100) % 256) / 255.0f) << k;

  // Train needs all five batches.
  write_raw(d / "data_batch_1.bin", bytes);
  std::string msg = error_of([&] { load_cifar10(d.path.string(), true); });
  EXPECT_NE(msg.find("data_batch_2.bin"), std::string::npos) << msg;
  for (int k = 2; k <= 5; ++k) write_raw(d / fmt::format("data_batch_{}.bin", k), bytes);
  EXPECT_EQ(load_cifar10(d.path.string(), true)->size(), 10);

  // A size that is not a multiple of 3073.
  auto cut = bytes;
  cut.resize(3073 + 100);
  write_raw(d / "test_batch.bin", cut);
  msg = error_of([&] { load_cifar10(d.path.string(), false); });
  EXPECT_NE(msg.find("test_batch.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("3173"), std::string::npos) << msg;
  EXPECT_NE(msg.find("3073"), std::string::npos) << msg;

  // A label >= 10 in the second record.
  auto bad = bytes;
  bad[3073] = 10;
  write_raw(d / "test_batch.bin", bad);
  msg = error_of([&] { load_cifar10(d.path.string(), false); });
  EXPECT_NE(msg.find("test_batch.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("offset 3073"), std::string::npos) << msg;
}

// A small gzip file that inflates past a CIFAR-10 batch (10,000 records) is refused after one
// byte more, not decompressed whole: 10,001 records of zeros and 64 MiB beyond them.
TEST(Cifar10, GzipIsNotInflatedBeyondABatch) {
  TempDir d;
  std::vector<uint8_t> bomb(10001u * 3073u + (64u << 20), 0);
  write_gz(d / "test_batch.bin", bomb);
  EXPECT_LT(fs::file_size(d / "test_batch.bin"), 1u << 20);
  const std::string msg = error_of([&] { load_cifar10(d.path.string(), false); });
  EXPECT_NE(msg.find("more than 30730000 bytes (decompressed), the 10000 records of a CIFAR-10"),
            std::string::npos)
      << msg;
  // A whole batch still loads.
  write_gz(d / "test_batch.bin", std::vector<uint8_t>(10000u * 3073u, 0));
  EXPECT_EQ(load_cifar10(d.path.string(), false)->size(), 10000);
}

TEST(ImageFolder, ClassesFromSortedFoldersAndResize) {
  TempDir d;
  fs::create_directories(d.path / "cat");
  fs::create_directories(d.path / "ant");
  fs::create_directories(d.path / "bee");
  // ant: a solid red 4x4 PNG and a BMP; bee: one PNG with uppercase extension; cat: 2x2 PNG with a
  // gradient, plus a text file that is not an image.
  std::vector<uint8_t> red(4 * 4 * 3);
  for (int k = 0; k < 16; ++k) red[k * 3] = 255;
  ASSERT_TRUE(stbi_write_png((d / "ant/b.png").c_str(), 4, 4, 3, red.data(), 4 * 3));
  std::vector<uint8_t> gray(6 * 2, 100);  // 6x2 grayscale, decoded as RGB
  ASSERT_TRUE(stbi_write_bmp((d / "ant/a.bmp").c_str(), 6, 2, 1, gray.data()));
  std::vector<uint8_t> blue(3 * 3 * 3, 0);
  for (int k = 0; k < 9; ++k) blue[k * 3 + 2] = 200;
  ASSERT_TRUE(stbi_write_png((d / "bee/x.PNG").c_str(), 3, 3, 3, blue.data(), 3 * 3));
  // 2x2 gray: [[0, 255], [0, 255]] upsampled to 4x4 with half-pixel centres gives columns
  // 0, 0.25, 0.75, 1 (times 255).
  std::vector<uint8_t> grad = {0, 255, 0, 255};
  ASSERT_TRUE(stbi_write_png((d / "cat/g.png").c_str(), 2, 2, 1, grad.data(), 2));
  std::ofstream(d / "cat/notes.txt") << "not an image";

  auto ds = load_image_folder(d.path.string(), 4);
  ASSERT_EQ(ds->size(), 4);
  EXPECT_EQ(ds->num_classes(), 3);
  EXPECT_EQ(ds->channels(), 3);
  EXPECT_EQ(ds->height(), 4);
  EXPECT_EQ(ds->width(), 4);
  std::vector<float> px(3 * 16);
  // Sorted: ant/a.bmp, ant/b.png, bee/x.PNG, cat/g.png.
  EXPECT_EQ(ds->get(0, px.data()), 0);
  for (float v : px) EXPECT_NEAR(v, 100 / 255.0f, 1e-6f);
  EXPECT_EQ(ds->get(1, px.data()), 0);
  for (int k = 0; k < 16; ++k) {
    EXPECT_FLOAT_EQ(px[k], 1.0f);
    EXPECT_FLOAT_EQ(px[16 + k], 0.0f);
    EXPECT_FLOAT_EQ(px[32 + k], 0.0f);
  }
  EXPECT_EQ(ds->get(2, px.data()), 1);
  for (int k = 0; k < 16; ++k) {  // 3x3 resized to 4x4: a constant stays constant
    EXPECT_FLOAT_EQ(px[k], 0.0f);
    EXPECT_NEAR(px[32 + k], 200 / 255.0f, 1e-6f);
  }
  EXPECT_EQ(ds->get(3, px.data()), 2);
  const float cols[4] = {0.0f, 0.25f, 0.75f, 1.0f};
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 4; ++y)
      for (int x = 0; x < 4; ++x) EXPECT_NEAR(px[c * 16 + y * 4 + x], cols[x], 1e-6f);

  // A corrupt image fails when decoded, naming the file.
  std::ofstream(d / "cat/z.jpg") << "definitely not a jpeg";
  auto ds2 = load_image_folder(d.path.string(), 4);
  ASSERT_EQ(ds2->size(), 5);
  const std::string msg = error_of([&] { ds2->get(4, px.data()); });
  EXPECT_NE(msg.find("[image_folder]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("z.jpg"), std::string::npos) << msg;
}

// Found by the fuzzer (issue 16): a few header bytes announcing 30000x30000 made stb allocate
// gigabytes (and spend seconds) before finding the pixels missing.
TEST(ImageFolder, HugeDimensionsAreRefusedBeforeDecoding) {
  TempDir d;
  fs::create_directories(d.path / "a");
  std::ofstream(d / "a/big.png", std::ios::binary) << "P6\n30000 30000\n255\n"
                                                   << std::string(64, 'x');
  auto ds = load_image_folder(d.path.string(), 8);
  std::vector<float> out(3 * 8 * 8);
  const std::string msg = error_of([&] { ds->get(0, out.data()); });
  EXPECT_NE(msg.find("30000x30000 pixels"), std::string::npos) << msg;
  EXPECT_NE(msg.find(d / "a/big.png"), std::string::npos) << msg;
}

TEST(ImageFolder, PngChunkLengthBeyondTheFileIsRefused) {
  // The fuzzer's case: a 5x4 PNG whose IDAT chunk declares 0x7800002c bytes (stb would grow its
  // buffer to about 2 GB before reading).
  TempDir d;
  fs::create_directories(d.path / "a");
  const unsigned char png[] = {0x89, 'P', 'N', 'G',  0x0d, 0x0a, 0x1a, 0x0a, 0,    0,    0,
                               13,   'I', 'H', 'D',  'R',  0,    0,    0,    5,    0,    0,
                               0,    4,   8,   2,    0,    0,    0,    0xc9, 0x51, 0x62, 0x17,
                               0x78, 0,   0,   0x2c, 'I',  'D',  'A',  'T',  0,    0x5e, 0x63};
  std::ofstream(d / "a/chunk.png", std::ios::binary)
      .write(reinterpret_cast<const char*>(png), sizeof png);
  auto ds = load_image_folder(d.path.string(), 8);
  std::vector<float> out(3 * 8 * 8);
  const std::string msg = error_of([&] { ds->get(0, out.data()); });
  EXPECT_NE(msg.find("PNG chunk at byte 33 declares 2013265964 bytes"), std::string::npos) << msg;
}

TEST(ImageFolder, JpegHuffmanTableOfMoreThan256CodesIsRefused) {
  // libFuzzer + UBSan's case, reduced: a DHT segment whose 16 code counts sum to 300 (stb_image
  // wrote one code size per code into its 257-entry array, past the end).
  TempDir d;
  fs::create_directories(d.path / "a");
  std::string jpg = {'\xFF', '\xD8', '\xFF', '\xC4',
                     '\x01', '\x3F', '\x00'};  // SOI; DHT, 319 bytes
  const unsigned char counts[16] = {0, 0, 0, 0, 0, 0, 0, 0, 100, 100, 100, 0, 0, 0, 0, 0};
  jpg.append(reinterpret_cast<const char*>(counts), 16);
  jpg.append(300, '\x01');
  jpg.append("\xFF\xD9", 2);
  std::ofstream(d / "a/huff.jpg", std::ios::binary).write(jpg.data(), std::ssize(jpg));
  auto ds = load_image_folder(d.path.string(), 8);
  std::vector<float> out(3 * 8 * 8);
  const std::string msg = error_of([&] { ds->get(0, out.data()); });
  EXPECT_NE(msg.find("JPEG Huffman table at byte 6 declares 300 codes (at most 256)"),
            std::string::npos)
      << msg;
  // The second finding: the counts cut off by the end of the file (stb reads them as 0).
  const std::string cut = {'\xFF', '\xD8', '\xFF', '\xC4', '\x01', '\xA2', '\x13', '\x91',
                           '\xD9', '\xAB', '\x49', '\xA4', '\x7F', '\xFF', '\xD9'};
  std::ofstream(d / "a/huff.jpg", std::ios::binary).write(cut.data(), std::ssize(cut));
  const std::string msg2 = error_of([&] { ds->get(0, out.data()); });
  EXPECT_NE(msg2.find("JPEG Huffman table at byte 6 declares 1369 codes"), std::string::npos)
      << msg2;
}

TEST(ImageFolder, JpegHuffmanCheckSkipsFillBytesBeforeTheStart) {
  // libFuzzer + UBSan (the image target with its fuzz limits): the same DHT overflow as above,
  // behind FF FF FF D8. stb skips 0xFF fill bytes before every marker, the start-of-image one
  // too, so the file is a JPEG to stb; the check took only FF D8 at byte 0 for one.
  TempDir d;
  fs::create_directories(d.path / "a");
  std::string jpg = {'\xFF', '\xFF', '\xFF', '\xD8', '\xFF', '\xC4', '\x00', '\x15', '\x00'};
  jpg += std::string(16, '\x13');  // 16 x 19 = 304 codes
  jpg += std::string(304, '\x01');
  jpg += {'\xFF', '\xD9'};
  std::ofstream(d / "a/x.png", std::ios::binary).write(jpg.data(), std::ssize(jpg));
  auto ds = load_image_folder(d.path.string(), 8);
  std::vector<float> out(3 * 8 * 8);
  const std::string msg = error_of([&] { ds->get(0, out.data()); });
  EXPECT_NE(msg.find("JPEG Huffman table at byte 8 declares 304 codes (at most 256)"),
            std::string::npos)
      << msg;
}

TEST(ImageFolder, StbSeesTheFilesBytesAfterLongFill) {
  // libFuzzer + UBSan (input 874,256): a JPEG start behind 176 0xFF fill bytes. stb's FILE reader
  // rewinds only within its first 128-byte buffer, so after its JPEG test it decoded other bytes
  // than the file's (stale 0xFF counts: a Huffman table of over 256 codes the check never saw).
  // The loader now hands stb the file's bytes from memory: the table is the file's, 38 codes.
  // Debian's stb 2.27 then refused the image as corrupt; the vendored 2.30 decodes it (its
  // entropy decoder yields zeros once the stream runs out of bits). Either way nothing is read
  // out of bounds (this test under ASan + UBSan, and the fuzz target): an error names the file,
  // or the pixels are finite values of the image's size.
  TempDir d;
  fs::create_directories(d.path / "a");
  std::string jpg(176, '\xFF');
  jpg += {'\xD8', '\xFF', '\xE0', '\x00', '\x10', '\x4A', '\x00', '\x35', '\xFF'};
  jpg += std::string(29, '\x14');
  jpg += {'\xFF', '\xC0', '\x00', '\x11', '\x08', '\x00', '\x04', '\x00', '\x05', '\x03',
          '\x01', '\x22', '\x00', '\x02', '\x11', '\x01', '\x03', '\x11', '\x01', '\xFF',
          '\xC4', '\x01', '\xA2', '\x00', '\x00', '\x01', '\x05', '\x01', '\x01', '\x05',
          '\x01', '\x00', '\x02', '\x04', '\x04', '\x03', '\x04', '\x07'};
  ASSERT_EQ(jpg.size(), 252u);
  std::ofstream(d / "a/x.png", std::ios::binary).write(jpg.data(), std::ssize(jpg));
  auto ds = load_image_folder(d.path.string(), 8);
  std::vector<float> out(3 * 8 * 8);
  std::fill(out.begin(), out.end(), NAN);
  const std::string msg = error_of([&] { ds->get(0, out.data()); });
  if (!msg.empty()) {
    EXPECT_NE(msg.find(d / "a/x.png"), std::string::npos) << msg;
  } else {
    for (float v : out) ASSERT_TRUE(std::isfinite(v)) << "a pixel the decode did not write";
  }
}

TEST(ImageFolder, PnmHeaderNumberOfTenDigitsIsRefused) {
  // libFuzzer + UBSan: stb_image's PNM header reader overflowed an int on "P6\n9999999999...".
  TempDir d;
  fs::create_directories(d.path / "a");
  std::ofstream(d / "a/x.png", std::ios::binary) << "P6\n# c\n4 99999999999 255\n";
  auto ds = load_image_folder(d.path.string(), 8);
  std::vector<float> out(3 * 8 * 8);
  const std::string msg = error_of([&] { ds->get(0, out.data()); });
  EXPECT_NE(msg.find("PNM header number at byte 9 has 11 digits (at most 9)"), std::string::npos)
      << msg;
  // And a 16-bit PNM (stb's conversion then read past its buffer: ASan).
  std::ofstream(d / "a/x.png", std::ios::binary) << "P5\n6 \n02\n5560\n \x05\n";
  const std::string msg2 = error_of([&] { ds->get(0, out.data()); });
  EXPECT_NE(msg2.find("PNM maxval 5560 at byte 9: only 8-bit"), std::string::npos) << msg2;
}

// A P6 (binary PPM) image of w x h pixels, every byte 0x80.
std::string ppm(int w, int h) {
  return fmt::format("P6\n{} {}\n255\n", w, h) + std::string(size_t(3) * w * h, '\x80');
}

TEST(ImageFolder, SidesBeyond8192AreRefusedByStb) {
  // The product's side limit (STBI_MAX_DIMENSIONS, ImageLimits::max_side = 8192): stb checks it
  // in every decoder, also for headers stbi_info cannot read. 8193x1 is far below the 2^24-pixel
  // check, so only the side limit refuses it; 8192x1 decodes.
  TempDir d;
  fs::create_directories(d.path / "a");
  std::ofstream(d / "a/x.png", std::ios::binary) << ppm(8193, 1);
  auto ds = load_image_folder(d.path.string(), 8);
  std::vector<float> out(3 * 8 * 8);
  const std::string msg = error_of([&] { ds->get(0, out.data()); });
  EXPECT_NE(msg.find("cannot decode"), std::string::npos) << msg;
  EXPECT_NE(msg.find("too large"), std::string::npos) << msg;
  EXPECT_NE(msg.find(d / "a/x.png"), std::string::npos) << msg;
  std::ofstream(d / "a/x.png", std::ios::binary) << ppm(8192, 1);
  EXPECT_EQ(ds->get(0, out.data()), 0);
  EXPECT_FLOAT_EQ(out[0], 128.0f / 255.0f);
}

TEST(ImageFolder, LowerLimitsRefuseSmallerImages) {
  // What the fuzz harness sets (tests/fuzz/targets.cpp): a 64x64 image is refused by a pixel
  // limit of 4095 (from the header, before decoding) and by a side limit of 63 (stb's check),
  // and decodes at 4096 pixels and 64 a side. Each dataset keeps its own limits, and the side
  // limit of one get() does not leak into the next on the same thread.
  TempDir d;
  fs::create_directories(d.path / "a");
  std::ofstream(d / "a/x.png", std::ios::binary) << ppm(64, 64);
  std::vector<float> out(3 * 8 * 8);
  auto few_pixels = load_image_folder(d.path.string(), 8, {.max_pixels = 4095});
  std::string msg = error_of([&] { few_pixels->get(0, out.data()); });
  EXPECT_NE(msg.find("64x64 pixels is more than the 4095 this loader decodes"), std::string::npos)
      << msg;
  auto short_side = load_image_folder(d.path.string(), 8, {.max_side = 63});
  msg = error_of([&] { short_side->get(0, out.data()); });
  EXPECT_NE(msg.find("too large"), std::string::npos) << msg;
  auto exact = load_image_folder(d.path.string(), 8, {.max_pixels = 4096, .max_side = 64});
  EXPECT_EQ(exact->get(0, out.data()), 0);
  EXPECT_FLOAT_EQ(out[5], 128.0f / 255.0f);
  std::ofstream(d / "a/x.png", std::ios::binary) << ppm(8000, 2);  // > 63, < 8192 a side
  auto product = load_image_folder(d.path.string(), 8);
  EXPECT_EQ(product->get(0, out.data()), 0);
}

TEST(ImageFolder, LimitsAboveTheProductsAreErrors) {
  TempDir d;
  fs::create_directories(d.path / "a");
  std::ofstream(d / "a/x.png", std::ios::binary) << ppm(2, 2);
  std::string msg = error_of([&] { load_image_folder(d.path.string(), 8, {.max_side = 8193}); });
  EXPECT_NE(msg.find("max_side = 8193 must be in [1, 8192]"), std::string::npos) << msg;
  msg = error_of(
      [&] { load_image_folder(d.path.string(), 8, {.max_pixels = (int64_t{1} << 24) + 1}); });
  EXPECT_NE(msg.find("max_pixels = 16777217 must be in [1, 16777216]"), std::string::npos) << msg;
  msg = error_of([&] { load_image_folder(d.path.string(), 8, {.max_pixels = 0}); });
  EXPECT_NE(msg.find("max_pixels = 0 must be in"), std::string::npos) << msg;
}

TEST(ImageFolder, EmptyFoldersAreErrors) {
  TempDir d;
  std::string msg = error_of([&] { load_image_folder(d.path.string(), 8); });
  EXPECT_NE(msg.find("no class sub-folders"), std::string::npos) << msg;
  fs::create_directories(d.path / "a");
  std::ofstream(d / "a/readme.txt") << "x";
  msg = error_of([&] { load_image_folder(d.path.string(), 8); });
  EXPECT_NE(msg.find("no images"), std::string::npos) << msg;
  msg = error_of([&] { load_image_folder(d / "missing", 8); });
  EXPECT_NE(msg.find("not a directory"), std::string::npos) << msg;
}

TEST(Subset, FirstNClamped) {
  TempDir d;
  Synthetic s;
  write_raw(d / "img", idx_images(s.imgs, 2, 3));
  write_raw(d / "lab", idx_labels(s.labels));
  auto ds = load_idx(d / "img", d / "lab");
  auto two = subset(ds, 2);
  EXPECT_EQ(two->size(), 2);
  EXPECT_EQ(two->height(), 2);
  float px[6];
  EXPECT_EQ(two->get(1, px), 7);
  EXPECT_NE(error_of([&] { two->get(2, px); }), "");
  EXPECT_EQ(subset(ds, 100)->size(), 3);
}

TEST(Normalization, KnownAndUnknown) {
  const auto f = normalization_for("fashion_mnist");
  ASSERT_EQ(f.mean.size(), 1u);
  EXPECT_FLOAT_EQ(f.mean[0], 0.2860f);
  EXPECT_FLOAT_EQ(f.std[0], 0.3530f);
  EXPECT_FLOAT_EQ(normalization_for("mnist").mean[0], 0.1307f);
  EXPECT_FLOAT_EQ(normalization_for("mnist").std[0], 0.3081f);
  const auto c = normalization_for("cifar10");
  ASSERT_EQ(c.mean.size(), 3u);
  EXPECT_FLOAT_EQ(c.mean[2], 0.4465f);
  EXPECT_FLOAT_EQ(c.std[1], 0.2435f);
  const auto i = normalization_for("imagenet");
  EXPECT_FLOAT_EQ(i.mean[0], 0.485f);
  EXPECT_FLOAT_EQ(i.std[2], 0.225f);
  const std::string msg = error_of([] { normalization_for("svhn"); });
  EXPECT_NE(msg.find("svhn"), std::string::npos) << msg;
  for (const char* known : {"fashion_mnist", "mnist", "cifar10", "imagenet"})
    EXPECT_NE(msg.find(known), std::string::npos) << msg;
}
