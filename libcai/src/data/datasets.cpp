// IDX (MNIST, Fashion-MNIST) and CIFAR-10 binary datasets, subsets and normalisation statistics.
// The image-folder dataset lives in image_folder.cpp (next to the stb_image implementation).
#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cai/core/error.h"
#include "cai/data/data.h"
#include "kernels/base/philox.h"

namespace cai::data {
namespace {

namespace fs = std::filesystem;

// A whole file's content; gzip-compressed files (magic 1f 8b) are decompressed.
struct FileBytes {
  std::vector<uint8_t> bytes;
  bool gzip = false;
  std::string gzip_error;  // set when zlib reported a problem (e.g. the stream ends early)
};

// `declared` (optional) tells, from the bytes read so far, how many the whole file should have
// (0: not known yet): a gzip stream is not inflated further than one byte past that, so a small
// compressed file cannot expand without bound.
FileBytes read_file(const std::string& path, const char* op,
                    size_t (*declared)(const std::vector<uint8_t>&) = nullptr) {
  FileBytes r;
  std::error_code ec;
  CAI_CHECK(fs::is_regular_file(path, ec), "[{}] {}: no such file", op, path);
  std::FILE* f = std::fopen(path.c_str(), "rb");
  CAI_CHECK(f, "[{}] {}: cannot open: {}", op, path, std::strerror(errno));
  unsigned char magic[2] = {0, 0};
  const size_t got = std::fread(magic, 1, 2, f);
  r.gzip = got == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  if (!r.gzip) {
    std::fseek(f, 0, SEEK_END);
    const long size = std::ftell(f);
    std::fseek(f, 0, SEEK_SET);
    if (size > 0) {
      r.bytes.resize(static_cast<size_t>(size));
      const size_t n = std::fread(r.bytes.data(), 1, r.bytes.size(), f);
      const bool err = std::ferror(f) != 0;
      std::fclose(f);
      CAI_CHECK(!err && n == r.bytes.size(), "[{}] {}: read error after {} of {} bytes", op, path,
                n, r.bytes.size());
    } else {
      std::fclose(f);
    }
    return r;
  }
  std::fclose(f);
  gzFile g = gzopen(path.c_str(), "rb");
  CAI_CHECK(g, "[{}] {}: gzopen failed", op, path);
  gzbuffer(g, 1 << 17);
  constexpr unsigned kChunk = 1u << 20;
  for (;;) {
    const size_t at = r.bytes.size();
    unsigned want = kChunk;
    if (declared) {
      const size_t total = declared(r.bytes);
      if (total > 0) {
        if (at > total) break;  // one byte past the declared size is enough to report it
        want = static_cast<unsigned>(std::min<size_t>(kChunk, total + 1 - at));
      } else if (at < 64) {
        want = 8;  // the header first, 8 bytes at a time
      }
    }
    r.bytes.resize(at + want);
    const int n = gzread(g, r.bytes.data() + at, want);
    if (n < 0) {
      int errnum = 0;
      const char* msg = gzerror(g, &errnum);
      r.bytes.resize(at);
      r.gzip_error = msg ? msg : "gzread failed";
      break;
    }
    r.bytes.resize(at + static_cast<size_t>(n));
    if (n == 0) break;
  }
  if (r.gzip_error.empty()) {
    int errnum = Z_OK;
    const char* msg = gzerror(g, &errnum);
    if (errnum != Z_OK) r.gzip_error = msg ? msg : "zlib error";
  }
  gzclose(g);
  return r;
}

std::string where(const FileBytes& fb) {
  return fb.gzip ? " (decompressed)" : "";
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// The size an IDX file's header declares (0 while the header is incomplete or implausible).
template <int kDims>
size_t idx_declared(const std::vector<uint8_t>& b) {
  const size_t header = 4 + 4 * kDims;
  if (b.size() < header) return 0;
  uint64_t numel = 1;
  for (int d = 0; d < kDims; ++d) {
    const uint64_t v = be32(b.data() + 4 + 4 * d);
    if (v != 0 && numel >= (uint64_t{1} << 40) / v) return header;  // parse_idx refuses it
    numel *= v;
  }
  return header + numel;
}

// Parses an IDX header with `ndims` dimensions of uint8 data; returns the dims and checks the
// file holds exactly the data they announce.
std::vector<int64_t> parse_idx(const FileBytes& fb, const std::string& path, int ndims,
                               const char* what) {
  const uint32_t expected_magic = 0x00000800u | static_cast<uint32_t>(ndims);
  const size_t size = fb.bytes.size();
  CAI_CHECK(size >= 4,
            "[idx] {}: data ends at byte offset {}{}, expected a 4-byte IDX magic 0x{:08x} "
            "({}) at offset 0",
            path, size, where(fb), expected_magic, what);
  const uint32_t magic = be32(fb.bytes.data());
  CAI_CHECK(magic == expected_magic,
            "[idx] {}: bad magic 0x{:08x} at byte offset 0{}, expected 0x{:08x} ({}: uint8 data, "
            "{} dimension(s))",
            path, magic, where(fb), expected_magic, what, ndims);
  const size_t header = 4 + 4 * static_cast<size_t>(ndims);
  CAI_CHECK(size >= header,
            "[idx] {}: data ends at byte offset {}{}, expected {} bytes of header ({} "
            "big-endian 32-bit dimensions after the magic)",
            path, size, where(fb), header, ndims);
  std::vector<int64_t> dims(ndims);
  uint64_t numel = 1;
  for (int d = 0; d < ndims; ++d) {
    dims[d] = be32(fb.bytes.data() + 4 + 4 * d);
    CAI_CHECK(dims[d] > 0 || d == 0, "[idx] {}: dimension {} at byte offset {}{} is 0", path, d,
              4 + 4 * d, where(fb));
    // Checked before multiplying: 2^20 × 2^19 × 2^25 must not wrap around to 0.
    CAI_CHECK(dims[d] == 0 || numel < (uint64_t{1} << 40) / static_cast<uint64_t>(dims[d]),
              "[idx] {}: dimensions {} are implausibly large (2^40 elements at most)", path,
              fmt::join(std::vector<int64_t>(dims.begin(), dims.begin() + d + 1), "x"));
    numel *= static_cast<uint64_t>(dims[d]);
  }
  CAI_CHECK(size >= header + numel,
            "[idx] {}: truncated: data ends at byte offset {}{}, expected {} bytes of {} ({}) "
            "from offset {}, i.e. {} bytes in all",
            path, size, where(fb), numel, what, fmt::join(dims, "x"), header, header + numel);
  CAI_CHECK(size == header + numel,
            "[idx] {}: {} unexpected trailing bytes from byte offset {}{}: the header announces "
            "{} bytes of {} ({})",
            path, size - header - numel, header + numel, where(fb), numel, what,
            fmt::join(dims, "x"));
  CAI_CHECK(fb.gzip_error.empty(), "[idx] {}: corrupt gzip stream after {} decompressed bytes: {}",
            path, size, fb.gzip_error);
  return dims;
}

class IdxDataset final : public Dataset {
 public:
  IdxDataset(std::string name, std::vector<uint8_t> images, size_t image_offset, int64_t n,
             int64_t rows, int64_t cols, std::vector<uint8_t> labels, int64_t num_classes)
      : name_(std::move(name)),
        images_(std::move(images)),
        image_offset_(image_offset),
        n_(n),
        rows_(rows),
        cols_(cols),
        labels_(std::move(labels)),
        num_classes_(num_classes) {}
  int64_t size() const override { return n_; }
  int64_t channels() const override { return 1; }
  int64_t height() const override { return rows_; }
  int64_t width() const override { return cols_; }
  int64_t num_classes() const override { return num_classes_; }
  int32_t get(int64_t i, float* out) const override {
    CAI_CHECK(i >= 0 && i < n_, "[idx] sample {} out of range for {}", i, describe());
    const size_t per = static_cast<size_t>(rows_ * cols_);
    const uint8_t* p = images_.data() + image_offset_ + static_cast<size_t>(i) * per;
    for (size_t k = 0; k < per; ++k) out[k] = static_cast<float>(p[k]) / 255.0f;
    return labels_[static_cast<size_t>(i)];
  }
  std::string describe() const override {
    return fmt::format("{} ({} {}x{}x1)", name_, n_, rows_, cols_);
  }

 private:
  std::string name_;
  std::vector<uint8_t> images_;  // the whole decompressed file; pixels from image_offset_
  size_t image_offset_;
  int64_t n_, rows_, cols_;
  std::vector<uint8_t> labels_;
  int64_t num_classes_;
};

constexpr int64_t kCifarPixels = 3 * 32 * 32;
constexpr int64_t kCifarRecord = 1 + kCifarPixels;
constexpr int64_t kCifarBatchRecords = 10000;  // records in each file of the binary version

class Cifar10Dataset final : public Dataset {
 public:
  Cifar10Dataset(std::string name, std::vector<uint8_t> records)
      : name_(std::move(name)),
        records_(std::move(records)),
        n_(static_cast<int64_t>(records_.size()) / kCifarRecord) {}
  int64_t size() const override { return n_; }
  int64_t channels() const override { return 3; }
  int64_t height() const override { return 32; }
  int64_t width() const override { return 32; }
  int64_t num_classes() const override { return 10; }
  int32_t get(int64_t i, float* out) const override {
    CAI_CHECK(i >= 0 && i < n_, "[cifar10] sample {} out of range for {}", i, describe());
    const uint8_t* rec = records_.data() + static_cast<size_t>(i * kCifarRecord);
    // The record is already CHW: the red plane, then green, then blue, each 32x32 row-major.
    for (int64_t k = 0; k < kCifarPixels; ++k) out[k] = static_cast<float>(rec[1 + k]) / 255.0f;
    return rec[0];
  }
  std::string describe() const override { return fmt::format("{} ({} 32x32x3)", name_, n_); }

 private:
  std::string name_;
  std::vector<uint8_t> records_;
  int64_t n_;
};

class SubsetDataset final : public Dataset {
 public:
  SubsetDataset(std::shared_ptr<Dataset> base, int64_t n) : base_(std::move(base)), n_(n) {}
  int64_t size() const override { return n_; }
  int64_t channels() const override { return base_->channels(); }
  int64_t height() const override { return base_->height(); }
  int64_t width() const override { return base_->width(); }
  int64_t num_classes() const override { return base_->num_classes(); }
  int32_t get(int64_t i, float* out) const override {
    CAI_CHECK(i >= 0 && i < n_, "[subset] sample {} out of range for {}", i, describe());
    return base_->get(i, out);
  }
  std::string describe() const override {
    return fmt::format("first {} of {}", n_, base_->describe());
  }

 private:
  std::shared_ptr<Dataset> base_;
  int64_t n_;
};

}  // namespace

std::shared_ptr<Dataset> load_idx(const std::string& images_path, const std::string& labels_path,
                                  const std::string& name) {
  FileBytes img = read_file(images_path, "idx", idx_declared<3>);
  const std::vector<int64_t> idims = parse_idx(img, images_path, 3, "images");
  FileBytes lab = read_file(labels_path, "idx", idx_declared<1>);
  const std::vector<int64_t> ldims = parse_idx(lab, labels_path, 1, "labels");
  CAI_CHECK(idims[0] == ldims[0], "[idx] {} holds {} images but {} holds {} labels", images_path,
            idims[0], labels_path, ldims[0]);
  CAI_CHECK(idims[0] > 0, "[idx] {}: holds no images", images_path);
  std::vector<uint8_t> labels(lab.bytes.begin() + 8, lab.bytes.end());
  const int64_t max_label = *std::max_element(labels.begin(), labels.end());
  // MNIST-like sets have 10 classes; a set with larger labels gets max label + 1.
  const int64_t num_classes = std::max<int64_t>(10, max_label + 1);
  return std::make_shared<IdxDataset>(name, std::move(img.bytes), 16, idims[0], idims[1], idims[2],
                                      std::move(labels), num_classes);
}

std::shared_ptr<Dataset> load_mnist_dir(const std::string& dir, bool train,
                                        const std::string& name) {
  const std::string prefix = train ? "train" : "t10k";
  auto find = [&](const std::string& base) {
    const fs::path gz = fs::path(dir) / (base + ".gz");
    const fs::path raw = fs::path(dir) / base;
    std::error_code ec;
    if (fs::is_regular_file(gz, ec)) return gz.string();
    if (fs::is_regular_file(raw, ec)) return raw.string();
    fail("[mnist] {}: no {} {} file: looked for {} and {}", dir, train ? "train" : "test",
         base.find("images") != std::string::npos ? "images" : "labels", gz.string(), raw.string());
  };
  const std::string images = find(prefix + "-images-idx3-ubyte");
  const std::string labels = find(prefix + "-labels-idx1-ubyte");
  return load_idx(images, labels, fmt::format("{} {}", name, train ? "train" : "test"));
}

std::shared_ptr<Dataset> load_cifar10(const std::string& dir, bool train) {
  std::vector<std::string> files;
  if (train) {
    for (int k = 1; k <= 5; ++k) files.push_back(fmt::format("data_batch_{}.bin", k));
  } else {
    files.push_back("test_batch.bin");
  }
  std::vector<uint8_t> records;
  for (const std::string& f : files) {
    const std::string path = (fs::path(dir) / f).string();
    std::error_code ec;
    CAI_CHECK(fs::is_regular_file(path, ec),
              "[cifar10] {}: missing {} (the CIFAR-10 binary version has data_batch_1..5.bin for "
              "train and test_batch.bin for test)",
              dir, path);
    // A batch of the binary version holds 10,000 records: a gzip stream is not inflated past
    // one byte more (a small compressed file cannot expand without bound).
    FileBytes fb = read_file(path, "cifar10", [](const std::vector<uint8_t>&) {
      return static_cast<size_t>(kCifarBatchRecords) * kCifarRecord;
    });
    const size_t size = fb.bytes.size();
    CAI_CHECK(size <= static_cast<size_t>(kCifarBatchRecords) * kCifarRecord,
              "[cifar10] {}: more than {} bytes{}, the {} records of a CIFAR-10 batch", path,
              static_cast<size_t>(kCifarBatchRecords) * kCifarRecord, where(fb),
              kCifarBatchRecords);
    CAI_CHECK(size > 0 && size % kCifarRecord == 0,
              "[cifar10] {}: size {} bytes{} is not a positive multiple of the {}-byte record (1 "
              "label byte + 3072 pixel bytes); the last record starts at byte offset {}",
              path, size, where(fb), kCifarRecord, size / kCifarRecord * kCifarRecord);
    CAI_CHECK(fb.gzip_error.empty(), "[cifar10] {}: corrupt gzip stream: {}", path, fb.gzip_error);
    for (size_t off = 0; off < size; off += kCifarRecord)
      CAI_CHECK(fb.bytes[off] < 10,
                "[cifar10] {}: label {} at byte offset {}{} (record {}), expected a label < 10",
                path, fb.bytes[off], off, where(fb), off / kCifarRecord);
    records.insert(records.end(), fb.bytes.begin(), fb.bytes.end());
  }
  return std::make_shared<Cifar10Dataset>(train ? "cifar10 train" : "cifar10 test",
                                          std::move(records));
}

namespace {
class SyntheticDataset final : public Dataset {
 public:
  SyntheticDataset(int64_t n, int64_t c, int64_t size, int64_t k, uint64_t seed, std::string name)
      : n_(n), c_(c), size_(size), k_(k), seed_(seed), name_(std::move(name)) {}
  int64_t size() const override { return n_; }
  int64_t channels() const override { return c_; }
  int64_t height() const override { return size_; }
  int64_t width() const override { return size_; }
  int64_t num_classes() const override { return k_; }
  int32_t get(int64_t i, float* out) const override {
    CAI_CHECK(i >= 0 && i < n_, "[synthetic] sample {} out of range for {}", i, describe());
    // Block 0 of the sample's Philox stream holds the label and the image's key; pixel j is an
    // integer hash of (key, j) in [0, 1). Cheap on purpose (about 1 ns a value against Philox's
    // 9: a ViT-B/16 batch of 256 is 38.5 M values): a benchmark on synthetic data must not wait
    // for its loader.
    const auto b = philox::block(seed_, static_cast<uint64_t>(i), 0);
    const uint32_t key = b.v[1];
    const int64_t m = c_ * size_ * size_;
    for (int64_t j = 0; j < m; ++j) {
      uint32_t x = (static_cast<uint32_t>(j) * 0x9e3779b9u) ^ key;
      x ^= x >> 16, x *= 0x7feb352du, x ^= x >> 15, x *= 0x846ca68bu, x ^= x >> 16;
      out[j] = static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
    }
    return static_cast<int32_t>(b.v[0] % static_cast<uint32_t>(k_));
  }
  std::string describe() const override {
    return fmt::format("{} ({} {}x{}x{}, {} classes)", name_, n_, size_, size_, c_, k_);
  }

 private:
  int64_t n_, c_, size_, k_;
  uint64_t seed_;
  std::string name_;
};
}  // namespace

std::shared_ptr<Dataset> synthetic(int64_t n, int64_t channels, int64_t size, int64_t num_classes,
                                   uint64_t seed, const std::string& name) {
  CAI_CHECK(n > 0 && channels > 0 && size > 0,
            "[synthetic] {} samples of {} channels × {} × {}: every size must be positive", n,
            channels, size, size);
  CAI_CHECK(num_classes > 0 && num_classes < (int64_t{1} << 31),
            "[synthetic] num_classes {} must be in [1, 2^31)", num_classes);
  return std::make_shared<SyntheticDataset>(n, channels, size, num_classes, seed, name);
}

std::shared_ptr<Dataset> subset(std::shared_ptr<Dataset> base, int64_t n) {
  CAI_CHECK(base, "[subset] null dataset");
  CAI_CHECK(n >= 0, "[subset] n = {} must be >= 0", n);
  n = std::min(n, base->size());
  return std::make_shared<SubsetDataset>(std::move(base), n);
}

Normalization normalization_for(const std::string& dataset) {
  std::string key = dataset;
  for (char& ch : key) ch = ch == '-' ? '_' : static_cast<char>(std::tolower(ch));
  if (key == "fashion_mnist") return {{0.2860f}, {0.3530f}};
  if (key == "mnist") return {{0.1307f}, {0.3081f}};
  if (key == "cifar10") return {{0.4914f, 0.4822f, 0.4465f}, {0.2470f, 0.2435f, 0.2616f}};
  if (key == "imagenet") return {{0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}};
  fail("[normalization] unknown dataset '{}': known are fashion_mnist, mnist, cifar10, imagenet",
       dataset);
}

}  // namespace cai::data
