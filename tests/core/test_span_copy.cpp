// cai::copy_spans on the host (the reference of the batched CUDA copy): every span lands where it
// should, fp32 -> bf16 rounds as Tensor::to, bf16 -> fp32 widens exactly, zero-length spans are
// skipped, and bad spans fail naming the span.
#include <gtest/gtest.h>

#include <vector>

#include "cai/core/error.h"
#include "cai/core/span_copy.h"
#include "cai/core/tensor.h"

using namespace cai;

namespace {

std::vector<float> iota(int64_t n, float start) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = start + 0.37f * static_cast<float>(i);
  return v;
}

TEST(SpanCopy, PacksAndUnpacksLikePerParameterCopies) {
  // Three "parameters" of odd sizes packed rank-major (two ranks' chunks) into one flat buffer,
  // then unpacked into fresh tensors: the round trip gives them back exactly.
  const std::vector<Tensor> params = {Tensor::from_vector(iota(7, 1.0f), {7}),
                                      Tensor::from_vector(iota(12, -3.0f), {3, 4}),
                                      Tensor::from_vector(iota(5, 10.0f), {5})};
  Tensor flat = Tensor::zeros({24});
  std::vector<SpanCopy> pack, unpack;
  int64_t out = 0;
  for (int r = 0; r < 2; ++r)
    for (const Tensor& p : params) {
      const int64_t n = p.numel(), c0 = n * r / 2, c = n * (r + 1) / 2 - c0;
      pack.push_back({flat, out, p, c0, c});
      out += c;
    }
  ASSERT_EQ(out, 24);
  copy_spans(pack);
  // Rank 0's chunk of the first parameter leads, rank 1's of the last ends the buffer.
  const std::vector<float> f = flat.to_vector();
  EXPECT_EQ(f[0], params[0].to_vector()[0]);
  EXPECT_EQ(f[23], params[2].to_vector()[4]);
  std::vector<Tensor> back;
  for (const Tensor& p : params) back.push_back(Tensor::zeros(p.shape()));
  int64_t in = 0;
  for (int r = 0; r < 2; ++r)
    for (const Tensor& p : back) {
      const int64_t n = p.numel(), c0 = n * r / 2, c = n * (r + 1) / 2 - c0;
      unpack.push_back({p, c0, flat, in, c});
      in += c;
    }
  copy_spans(unpack);
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_EQ(back[i].to_vector(), params[i].to_vector()) << "parameter " << i;
}

TEST(SpanCopy, ConvertsToTheDestinationDtype) {
  const Tensor src =
      Tensor::from_vector(std::vector<float>{1.0f, 1.00390625f, 3.14159f, -2.5e-3f, 65504.0f}, {5});
  Tensor b = Tensor::zeros({8}, DType::BF16);
  copy_spans({{b, 2, src, 0, 5}});
  const std::vector<float> want = src.to(DType::BF16).to_vector();
  const std::vector<float> got = b.to_vector();
  for (int i = 0; i < 5; ++i) EXPECT_EQ(got[2 + i], want[i]) << i;
  EXPECT_EQ(got[0], 0.0f);
  EXPECT_EQ(got[7], 0.0f);
  Tensor w = Tensor::zeros({5});
  copy_spans({{w, 0, b, 2, 5}, {w, 0, b, 0, 0}});  // a zero-length span is skipped
  EXPECT_EQ(w.to_vector(), want);
}

TEST(SpanCopy, AddSpansAccumulates) {
  Tensor shard = Tensor::from_vector(std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f, 5.0f}, {5});
  const Tensor recv = Tensor::from_vector(std::vector<float>{10.0f, 20.0f, 30.0f, 0.5f}, {4});
  add_spans({{shard, 1, recv, 0, 3}, {shard, 0, recv, 3, 1}});
  EXPECT_EQ(shard.to_vector(), (std::vector<float>{1.5f, 12.0f, 23.0f, 34.0f, 5.0f}));
  Tensor b = Tensor::zeros({2}, DType::BF16);
  EXPECT_THROW(add_spans({{b, 0, recv, 0, 2}}), Error);  // fp32 only
}

TEST(SpanCopy, RejectsSpansOutsideTheTensors) {
  const Tensor src = Tensor::zeros({4});
  Tensor dst = Tensor::zeros({4});
  try {
    copy_spans({{dst, 0, src, 0, 4}, {dst, 2, src, 0, 3}});
    FAIL() << "a span past the destination's end was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("span 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(copy_spans({{dst, 0, src, 0, -1}}), Error);
  EXPECT_THROW(copy_spans({{dst, 0, Tensor(), 0, 1}}), Error);
}

}  // namespace
