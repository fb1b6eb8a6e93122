// Image-folder dataset (one sub-folder per class) decoded with stb_image. stb_image is compiled
// here, static to this translation unit: the library does not link libstb. The header is
// stb_image v2.30 beside this file (nothings/stb, public domain), not Debian's 2.27: 2.30 stops
// its JPEG entropy decoder when a block asks for more bits than the stream has (2.27 shifted by
// more than 31 there: libFuzzer + UBSan, docs/FUZZING.md fix 19).
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cai/core/error.h"
#include "cai/data/data.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#define STBI_NO_HDR
#define STBI_NO_LINEAR
// Every stb decoder refuses a side beyond this before allocating (some formats' headers are not
// readable by stbi_info, so the pixel-count check below cannot see them first). stb only compares
// sides with it at run time, so it is the calling thread's ImageLimits::max_side (8192 by
// default), set by get() around its stb calls.
namespace {
thread_local int stbi_max_side = cai::data::ImageLimits{}.max_side;
}
#define STBI_MAX_DIMENSIONS stbi_max_side
#include "stb_image.h"
#pragma GCC diagnostic pop

namespace cai::data {
namespace {

namespace fs = std::filesystem;

// Sets the calling thread's stb side limit for one get() and restores it after.
class MaxSideScope {
 public:
  explicit MaxSideScope(int side) : saved_(stbi_max_side) { stbi_max_side = side; }
  ~MaxSideScope() { stbi_max_side = saved_; }
  MaxSideScope(const MaxSideScope&) = delete;
  MaxSideScope& operator=(const MaxSideScope&) = delete;

 private:
  int saved_;
};

// PNG: every chunk's length must fit in what is left of the file (stb grows its buffer to the
// declared IDAT length before reading it: a 101-byte file could ask for 2 GB).
void check_png_chunks(const std::string& path, const std::vector<unsigned char>& d) {
  if (d.size() < 8 || d[0] != 0x89 || d[1] != 'P' || d[2] != 'N' || d[3] != 'G') return;
  const int64_t total = static_cast<int64_t>(d.size());
  for (int64_t pos = 8; pos + 8 <= total;) {
    const unsigned char* h = d.data() + pos;
    const int64_t len =
        (int64_t{h[0]} << 24) | (int64_t{h[1]} << 16) | (int64_t{h[2]} << 8) | int64_t{h[3]};
    if (len > total - pos - 12)
      fail("[image_folder] {}: PNG chunk at byte {} declares {} bytes, but the file has {} left",
           path, pos, len, total - pos - 12);
    pos += 12 + len;
  }
}

// The whole file: stb decodes it from memory. Its FILE reader rewinds only within its first
// 128-byte buffer: after a format test that read further (a JPEG start behind 176 0xFF fill
// bytes), stb went on decoding other bytes than the file's (libFuzzer + UBSan), so the checks
// here and stb must see the same bytes.
std::vector<unsigned char> read_all(const std::string& path) {
  std::vector<unsigned char> d;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail("[image_folder] cannot open {}", path);
  unsigned char buf[65536];
  for (size_t got; (got = std::fread(buf, 1, sizeof buf, f)) > 0;)
    d.insert(d.end(), buf, buf + got);
  std::fclose(f);
  if (d.size() > static_cast<size_t>(INT_MAX))
    fail("[image_folder] {}: {} bytes is more than the {} stb_image reads", path, d.size(),
         INT_MAX);
  return d;
}

// PNM (P5/P6): stb_image reads the header's width, height and maxval into an int digit by digit
// without an overflow check (libFuzzer + UBSan: 999999999 * 10). A number of 10 or more digits
// is refused first (no valid side or maxval has that many: stb refuses sides beyond 8192).
void check_pnm_header(const std::string& path, const std::vector<unsigned char>& d) {
  if (d.size() < 2 || d[0] != 'P' || (d[1] != '5' && d[1] != '6')) return;
  size_t pos = 2;
  auto space = [](unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
  };
  for (int k = 0; k < 3; ++k) {
    while (pos < d.size() && (space(d[pos]) || d[pos] == '#')) {
      if (d[pos] == '#')
        while (pos < d.size() && d[pos] != '\n' && d[pos] != '\r') ++pos;
      else
        ++pos;
    }
    const size_t start = pos;
    while (pos < d.size() && d[pos] >= '0' && d[pos] <= '9') ++pos;
    if (pos - start >= 10)
      fail("[image_folder] {}: PNM header number at byte {} has {} digits (at most 9)", path, start,
           pos - start);
    if (pos == start) return;  // stb reports it
    // 16-bit PNM (maxval > 255): stb's format conversion then reads past its buffer (libFuzzer +
    // ASan: P5 with maxval 5560). This loader reads 8-bit images.
    if (k == 2 && std::stoi(std::string(d.begin() + static_cast<long>(start),
                                        d.begin() + static_cast<long>(pos))) > 255)
      fail("[image_folder] {}: PNM maxval {} at byte {}: only 8-bit PNM (maxval <= 255) is read",
           path,
           std::string(d.begin() + static_cast<long>(start), d.begin() + static_cast<long>(pos)),
           start);
  }
}

// JPEG: every Huffman table (DHT segment) may hold at most 256 codes. Debian's stb_image sums the
// 16 code counts without that check and writes one size per code into a 257-entry array
// (libFuzzer + UBSan: a 3.5 kB JPEG with counts summing to 300 wrote past it).
void check_jpeg_huffman_tables(const std::string& path, const std::vector<unsigned char>& d) {
  // stb finds the start-of-image marker after any number of 0xFF fill bytes (FF FF FF D8 is a
  // JPEG to it: libFuzzer + UBSan found the same overflow behind such a start).
  size_t pos = 0;
  while (pos < d.size() && d[pos] == 0xFF) ++pos;
  if (pos == 0 || pos >= d.size() || d[pos] != 0xD8) return;  // not a JPEG
  ++pos;
  while (pos + 4 <= d.size()) {
    const unsigned m = d[pos + 1];
    if (d[pos] != 0xFF || m == 0xFF) {  // entropy-coded data, fill bytes
      ++pos;
      continue;
    }
    if (m == 0x00 || m == 0x01 || m == 0xD8 || (m >= 0xD0 && m <= 0xD7)) {  // no length
      pos += 2;
      continue;
    }
    if (m == 0xD9) break;
    const size_t len = (size_t{d[pos + 2]} << 8) | d[pos + 3];
    if (m == 0xC4) {
      const size_t end = std::min(d.size(), pos + 2 + len);
      for (size_t q = pos + 4; q < end;) {
        size_t codes = 0;  // stb reads a count cut off by the end of the file as 0
        for (size_t i = 1; i <= 16 && q + i < d.size(); ++i) codes += d[q + i];
        if (codes > 256)
          fail("[image_folder] {}: JPEG Huffman table at byte {} declares {} codes (at most 256)",
               path, q, codes);
        q += 17 + codes;
      }
    }
    pos += 2 + std::max<size_t>(len, 2);
  }
}

bool is_image_file(const fs::path& p) {
  std::string ext = p.extension().string();
  for (char& ch : ext) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg" || ext == ".bmp";
}

class ImageFolderDataset final : public Dataset {
 public:
  ImageFolderDataset(std::string dir, int64_t image_size, ImageLimits limits,
                     std::vector<std::string> classes, std::vector<std::string> files,
                     std::vector<int32_t> labels)
      : dir_(std::move(dir)),
        size_(image_size),
        limits_(limits),
        classes_(std::move(classes)),
        files_(std::move(files)),
        labels_(std::move(labels)) {}
  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  int64_t channels() const override { return 3; }
  int64_t height() const override { return size_; }
  int64_t width() const override { return size_; }
  int64_t num_classes() const override { return static_cast<int64_t>(classes_.size()); }
  int32_t get(int64_t i, float* out) const override {
    CAI_CHECK(i >= 0 && i < size(), "[image_folder] sample {} out of range for {}", i, describe());
    const std::string& path = files_[static_cast<size_t>(i)];
    int w = 0, h = 0, comp = 0;
    // The header's size first: a few bytes can announce 30000x30000, which stb would allocate
    // (and spend seconds on) before finding the data missing.
    const std::vector<unsigned char> bytes = read_all(path);
    check_jpeg_huffman_tables(path, bytes);  // before stbi_info, which reads these headers too
    check_pnm_header(path, bytes);
    const int len = static_cast<int>(bytes.size());
    const MaxSideScope side(limits_.max_side);
    if (stbi_info_from_memory(bytes.data(), len, &w, &h, &comp) &&
        int64_t{w} * h > limits_.max_pixels)
      fail("[image_folder] {}: {}x{} pixels is more than the {} this loader decodes", path, w, h,
           limits_.max_pixels);
    check_png_chunks(path, bytes);
    // stb_image keeps its failure reason thread-local, so concurrent workers are fine.
    stbi_uc* px = stbi_load_from_memory(bytes.data(), len, &w, &h, &comp, 3);
    if (!px) fail("[image_folder] cannot decode {}: {}", path, stbi_failure_reason());
    std::vector<float> chw(static_cast<size_t>(3) * w * h);
    const size_t plane = static_cast<size_t>(w) * h;
    for (size_t k = 0; k < plane; ++k)
      for (size_t c = 0; c < 3; ++c)
        chw[c * plane + k] = static_cast<float>(px[k * 3 + c]) / 255.0f;
    stbi_image_free(px);
    TransformConfig resize;
    resize.resize = size_;
    apply_transform(resize, chw.data(), 3, h, w, out, false, 0, 0, 0);
    return labels_[static_cast<size_t>(i)];
  }
  std::string describe() const override {
    return fmt::format("image folder {} ({} {}x{}x3, {} classes)", dir_, files_.size(), size_,
                       size_, classes_.size());
  }

 private:
  std::string dir_;
  int64_t size_;
  ImageLimits limits_;
  std::vector<std::string> classes_;
  std::vector<std::string> files_;
  std::vector<int32_t> labels_;
};

}  // namespace

std::shared_ptr<Dataset> load_image_folder(const std::string& dir, int64_t image_size,
                                           const ImageLimits& limits) {
  CAI_CHECK(image_size > 0, "[image_folder] image_size = {} must be > 0", image_size);
  const ImageLimits defaults;
  CAI_CHECK(limits.max_pixels > 0 && limits.max_pixels <= defaults.max_pixels,
            "[image_folder] max_pixels = {} must be in [1, {}]", limits.max_pixels,
            defaults.max_pixels);
  CAI_CHECK(limits.max_side > 0 && limits.max_side <= defaults.max_side,
            "[image_folder] max_side = {} must be in [1, {}]", limits.max_side, defaults.max_side);
  std::error_code ec;
  CAI_CHECK(fs::is_directory(dir, ec), "[image_folder] {} is not a directory", dir);
  std::vector<std::string> classes;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && !name.empty() && name[0] != '.') classes.push_back(name);
  }
  std::sort(classes.begin(), classes.end());
  CAI_CHECK(!classes.empty(),
            "[image_folder] {}: no class sub-folders (expected one folder per class holding "
            "PNG/JPEG/BMP files)",
            dir);
  std::vector<std::string> files;
  std::vector<int32_t> labels;
  for (size_t c = 0; c < classes.size(); ++c) {
    std::vector<std::string> found;
    const fs::path cdir = fs::path(dir) / classes[c];
    for (const auto& e :
         fs::recursive_directory_iterator(cdir, fs::directory_options::follow_directory_symlink))
      if (e.is_regular_file() && is_image_file(e.path())) found.push_back(e.path().string());
    std::sort(found.begin(), found.end());
    for (auto& f : found) {
      files.push_back(std::move(f));
      labels.push_back(static_cast<int32_t>(c));
    }
  }
  CAI_CHECK(!files.empty(),
            "[image_folder] {}: no images (.png, .jpg, .jpeg or .bmp) in its {} class folder(s)",
            dir, classes.size());
  return std::make_shared<ImageFolderDataset>(dir, image_size, limits, std::move(classes),
                                              std::move(files), std::move(labels));
}

}  // namespace cai::data
