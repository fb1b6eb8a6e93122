// kernels::cuda::copy_spans (through cai::copy_spans on CUDA tensors) against the host reference
// (cai::copy_spans on CPU tensors: one copy per span): ZeRO's rank-major pack and unpack of many
// odd-sized spans (more than one launch's kCopyMulti), fp32 -> fp32 exactly, fp32 -> bf16 and
// bf16 -> fp32 bit for bit as the host rounds; add_spans (accumulating) as the host adds. Runs on a
// GPU host; without a GPU it skips, saying why.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "cai/core/span_copy.h"
#include "cai/core/tensor.h"
#include "kernels/copy.h"
#include "kernels/device.h"

using namespace cai;
namespace kc = cai::kernels::cuda;

namespace {

class CudaCopySpans : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kc::device_count() == 0) GTEST_SKIP() << "no GPU: " << kc::runtime_info().device_error;
  }
};

// 150 parameters of 1..3000 elements cut into `ranks` chunks, packed rank-major into one buffer
// of dtype `bucket`, then unpacked into fp32: on the host and on the GPU from the same values.
// size_multiple: every parameter's size a multiple of it (4 * ranks: every span on 4-element
// boundaries, the kernel's four-at-a-time path).
void check(DType bucket, int ranks, int64_t size_multiple = 1) {
  std::mt19937 gen(17);
  std::uniform_int_distribution<int64_t> size(1, 3000);
  std::normal_distribution<float> val(0.0f, 3.0f);
  std::vector<Tensor> host;
  int64_t total = 0;
  for (int i = 0; i < 150; ++i) {
    std::vector<float> v(size(gen) * size_multiple);
    for (float& x : v) x = val(gen);
    total += static_cast<int64_t>(v.size());
    host.push_back(Tensor::from_vector(v, {static_cast<int64_t>(v.size())}));
  }
  std::vector<Tensor> dev;
  for (const Tensor& t : host) dev.push_back(t.to(Device::cuda(0)));
  auto run = [&](const std::vector<Tensor>& ps, Device d) {
    Tensor flat = Tensor::zeros({total}, bucket, d);
    std::vector<SpanCopy> pack, unpack;
    std::vector<Tensor> back;
    int64_t out = 0;
    for (int r = 0; r < ranks; ++r)
      for (const Tensor& p : ps) {
        const int64_t n = p.numel(), c0 = n * r / ranks, c = n * (r + 1) / ranks - c0;
        pack.push_back({flat, out, p, c0, c});
        out += c;
      }
    copy_spans(pack);
    for (const Tensor& p : ps) back.push_back(Tensor::zeros(p.shape(), DType::F32, d));
    int64_t in = 0;
    for (int r = 0; r < ranks; ++r)
      for (const Tensor& p : back) {
        const int64_t n = p.numel(), c0 = n * r / ranks, c = n * (r + 1) / ranks - c0;
        unpack.push_back({p, c0, flat, in, c});
        in += c;
      }
    copy_spans(unpack);
    return std::make_pair(flat, back);
  };
  const auto [hflat, hback] = run(host, Device::cpu());
  const auto [dflat, dback] = run(dev, Device::cuda(0));
  EXPECT_EQ(dflat.to(Device::cpu()).to_vector(), hflat.to_vector()) << dtype_name(bucket);
  for (size_t i = 0; i < host.size(); ++i) {
    EXPECT_EQ(dback[i].to(Device::cpu()).to_vector(), hback[i].to_vector()) << "parameter " << i;
    if (bucket == DType::F32) EXPECT_EQ(hback[i].to_vector(), host[i].to_vector());
  }
}

// ZeRO-2/3's shard update: each rank's reduced chunks added into the shard gradients, one launch
// (odd sizes: the scalar kernel; multiples of 4: the four-at-a-time one).
void check_add(int64_t size_multiple) {
  std::mt19937 gen(5);
  std::normal_distribution<float> val(0.0f, 1.0f);
  std::vector<Tensor> host;
  int64_t total = 0;
  for (int i = 0; i < 100; ++i) {
    std::vector<float> v((1 + i * 37 % 500) * size_multiple);
    for (float& x : v) x = val(gen);
    total += static_cast<int64_t>(v.size());
    host.push_back(Tensor::from_vector(v, {static_cast<int64_t>(v.size())}));
  }
  std::vector<float> r(total);
  for (float& x : r) x = val(gen);
  const Tensor hrecv = Tensor::from_vector(r, {total});
  const Tensor drecv = hrecv.to(Device::cuda(0));
  std::vector<Tensor> dev;
  for (const Tensor& t : host) dev.push_back(t.to(Device::cuda(0)));
  std::vector<SpanCopy> hs, ds;
  int64_t in = 0;
  for (size_t i = 0; i < host.size(); ++i) {
    hs.push_back({host[i], 0, hrecv, in, host[i].numel()});
    ds.push_back({dev[i], 0, drecv, in, dev[i].numel()});
    in += host[i].numel();
  }
  add_spans(hs);
  add_spans(ds);
  for (size_t i = 0; i < host.size(); ++i)
    EXPECT_EQ(dev[i].to(Device::cpu()).to_vector(), host[i].to_vector()) << "shard " << i;
}
TEST_F(CudaCopySpans, AddSpansMatchTheHost) {
  check_add(1);
  check_add(4);
}

TEST_F(CudaCopySpans, Fp32PackUnpackMatchesTheHost) {
  check(DType::F32, 4);
}
TEST_F(CudaCopySpans, Bf16BucketsRoundAsTheHost) {
  check(DType::BF16, 2);
}
TEST_F(CudaCopySpans, Fp16BucketsRoundAsTheHost) {
  check(DType::F16, 3);
}
// Spans on 4-element boundaries (the four-at-a-time kernel) in every type pair, and with add.
TEST_F(CudaCopySpans, AlignedSpansMatchTheHost) {
  check(DType::F32, 2, 8);
  check(DType::BF16, 2, 8);
  check(DType::F16, 4, 16);
}

}  // namespace
