#include "golden.h"

#include <cmath>
#include <cstring>
#include <fstream>

#include "cai/core/error.h"

namespace cai::test {

std::string data_path(const std::string& file) {
  return std::string(CAI_TEST_DATA_DIR) + "/" + file;
}

std::map<std::string, Tensor> load_golden(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  CAI_CHECK(f.good(), "[golden] cannot open {}", path);
  char magic[8];
  f.read(magic, 8);
  CAI_CHECK(f && std::memcmp(magic, "CAIGOLD1", 8) == 0, "[golden] {} is not a CAIGOLD1 file",
            path);
  auto u32 = [&] {
    uint32_t v = 0;
    f.read(reinterpret_cast<char*>(&v), 4);
    CAI_CHECK(f.good(), "[golden] {} is truncated at offset {}", path,
              static_cast<long long>(f.tellg()));
    return v;
  };
  std::map<std::string, Tensor> out;
  const uint32_t n = u32();
  for (uint32_t i = 0; i < n; ++i) {
    std::string name(u32(), '\0');
    f.read(name.data(), static_cast<std::streamsize>(name.size()));
    const uint32_t dtype = u32(), ndim = u32();
    Shape shape(ndim);
    f.read(reinterpret_cast<char*>(shape.data()), 8 * ndim);
    Tensor t = Tensor::empty(shape, dtype == 0 ? DType::F32 : DType::I32);
    f.read(static_cast<char*>(t.raw()), static_cast<std::streamsize>(t.nbytes()));
    CAI_CHECK(f.good(), "[golden] {} is truncated in tensor '{}'", path, name);
    out.emplace(name, t);
  }
  return out;
}

nn::ViTConfig vit_config(const std::map<std::string, Tensor>& golden) {
  const auto ci = golden.at("config.ints").to_vector();
  nn::ViTConfig c;
  c.img_size = int64_t(ci[0]), c.patch_size = int64_t(ci[1]), c.in_chans = int64_t(ci[2]);
  c.num_classes = int64_t(ci[3]), c.embed_dim = int64_t(ci[4]), c.depth = int64_t(ci[5]);
  c.num_heads = int64_t(ci[6]);
  c.mlp_ratio = ci[7] / ci[4];
  return c;
}

double tolerance_ratio(const Tensor& a, const Tensor& b, double rtol, double atol) {
  CAI_CHECK(a.numel() == b.numel(), "[compare] {} vs {}", a.str(), b.str());
  const auto va = a.to_vector(), vb = b.to_vector();
  double worst = 0.0;
  for (size_t i = 0; i < va.size(); ++i) {
    const double r = std::abs(double(va[i]) - vb[i]) / (atol + rtol * std::abs(double(vb[i])));
    if (!(r <= worst)) worst = std::isnan(r) ? INFINITY : r;
  }
  return worst;
}

double rel_error(const Tensor& a, const Tensor& b) {
  const auto va = a.to_vector(), vb = b.to_vector();
  CAI_CHECK(va.size() == vb.size(), "[compare] {} vs {}", a.str(), b.str());
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < va.size(); ++i) {
    num += (double(va[i]) - vb[i]) * (double(va[i]) - vb[i]);
    den += double(vb[i]) * vb[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

}  // namespace cai::test
