// DataLoader: determinism (seed, workers), epochs, batch fields, content, and error propagation.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cai/core/error.h"
#include "cai/data/data.h"

using namespace cai;
using namespace cai::data;

namespace {

// n samples of c × 6 × 5 whose pixels encode the index; label i % 5; throws for `bad` (if >= 0).
class ToyDataset : public Dataset {
 public:
  ToyDataset(int64_t n, int64_t c, int64_t bad = -1) : n_(n), c_(c), bad_(bad) {}
  int64_t size() const override { return n_; }
  int64_t channels() const override { return c_; }
  int64_t height() const override { return 6; }
  int64_t width() const override { return 5; }
  int64_t num_classes() const override { return 5; }
  int32_t get(int64_t i, float* out) const override {
    if (i == bad_) fail("[toy] sample {} is broken", i);
    for (int64_t k = 0; k < c_ * 30; ++k)
      out[k] = static_cast<float>((i * 37 + k * 11) % 256) / 255;
    return static_cast<int32_t>(i % 5);
  }
  std::string describe() const override { return "toy"; }

 private:
  int64_t n_, c_, bad_;
};

LoaderConfig augmenting(int workers, uint64_t seed = 3) {
  LoaderConfig cfg;
  cfg.batch_size = 4;
  cfg.shuffle = true;
  cfg.train = true;
  cfg.seed = seed;
  cfg.num_workers = workers;
  cfg.prefetch = 2;
  cfg.transform.random_crop = 4;
  cfg.transform.crop_padding = 1;
  cfg.transform.horizontal_flip = true;
  cfg.transform.normalize = {{0.5f}, {0.25f}};
  return cfg;
}

std::vector<Batch> epoch_of(DataLoader& dl, int64_t epoch) {
  dl.start_epoch(epoch);
  std::vector<Batch> out;
  Batch b;
  while (dl.next(b)) out.push_back(b);
  return out;
}

void expect_same(const std::vector<Batch>& a, const std::vector<Batch>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_EQ(a[k].index, b[k].index);
    EXPECT_EQ(a[k].indices, b[k].indices) << "batch " << k;
    EXPECT_EQ(a[k].sample_offset, b[k].sample_offset);
    EXPECT_EQ(a[k].global_batch_size, b[k].global_batch_size);
    EXPECT_EQ(a[k].images.to_vector(), b[k].images.to_vector()) << "batch " << k;
    ASSERT_EQ(a[k].labels.numel(), b[k].labels.numel());
    EXPECT_EQ(0, std::memcmp(a[k].labels.data<int32_t>(), b[k].labels.data<int32_t>(),
                             a[k].labels.nbytes()));
  }
}

std::vector<int64_t> all_indices(const std::vector<Batch>& e) {
  std::vector<int64_t> v;
  for (const auto& b : e) v.insert(v.end(), b.indices.begin(), b.indices.end());
  return v;
}

std::string error_of(DataLoader& dl) {
  Batch b;
  try {
    while (dl.next(b)) {
    }
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Loader, BatchesHoldTheTransformedSamples) {
  auto ds = std::make_shared<ToyDataset>(23, 2);
  LoaderConfig cfg = augmenting(2);
  DataLoader dl(ds, cfg);
  EXPECT_EQ(dl.num_batches(), 6);
  EXPECT_EQ(dl.out_channels(), 2);
  EXPECT_EQ(dl.out_height(), 4);
  EXPECT_EQ(dl.out_width(), 4);
  EXPECT_EQ(dl.dataset().size(), 23);
  const auto e = epoch_of(dl, 2);
  ASSERT_EQ(e.size(), 6u);
  std::vector<float> in(60), want(32);
  std::set<int64_t> seen;
  for (size_t k = 0; k < e.size(); ++k) {
    const Batch& b = e[k];
    const int64_t n = k + 1 < e.size() ? 4 : 3;
    EXPECT_EQ(b.index, static_cast<int64_t>(k));
    EXPECT_EQ(b.sample_offset, 0);
    EXPECT_EQ(b.global_batch_size, n);
    ASSERT_EQ(b.images.shape(), (Shape{n, 2, 4, 4}));
    ASSERT_EQ(b.labels.shape(), (Shape{n}));
    EXPECT_EQ(b.labels.dtype(), DType::I32);
    ASSERT_EQ(static_cast<int64_t>(b.indices.size()), n);
    const auto img = b.images.to_vector();
    for (int64_t s = 0; s < n; ++s) {
      const int64_t idx = b.indices[s];
      seen.insert(idx);
      EXPECT_EQ(b.labels.data<int32_t>()[s], ds->get(idx, in.data()));
      apply_transform(cfg.transform, in.data(), 2, 6, 5, want.data(), true, cfg.seed, 2, idx);
      EXPECT_EQ(std::vector<float>(img.begin() + s * 32, img.begin() + (s + 1) * 32), want)
          << "sample " << idx;
    }
  }
  EXPECT_EQ(seen.size(), 23u);
}

TEST(Loader, SameSeedSameBatchesAnyWorkerCount) {
  auto ds = std::make_shared<ToyDataset>(37, 3);
  DataLoader ref(ds, augmenting(0));
  const auto e0 = epoch_of(ref, 0);
  ASSERT_EQ(e0.size(), 10u);
  for (int workers : {0, 1, 3}) {
    SCOPED_TRACE(workers);
    DataLoader dl(ds, augmenting(workers));
    expect_same(epoch_of(dl, 0), e0);
    expect_same(epoch_of(dl, 1), epoch_of(ref, 1));
  }
  // prefetch 0 behaves as 1.
  LoaderConfig cfg = augmenting(3);
  cfg.prefetch = 0;
  DataLoader dl(ds, cfg);
  expect_same(epoch_of(dl, 0), e0);
}

TEST(Loader, SeedsAndEpochsChangeTheOrderAndAugmentation) {
  auto ds = std::make_shared<ToyDataset>(37, 1);
  DataLoader a(ds, augmenting(2, 3)), b(ds, augmenting(2, 4));
  const auto a0 = epoch_of(a, 0), a1 = epoch_of(a, 1), b0 = epoch_of(b, 0);
  EXPECT_NE(all_indices(a0), all_indices(b0));
  EXPECT_NE(all_indices(a0), all_indices(a1));
  // Same samples, different crops/flips across epochs: sample 0's image differs in some epoch.
  auto image_of = [&](const std::vector<Batch>& e, int64_t idx) {
    for (const auto& bt : e)
      for (size_t s = 0; s < bt.indices.size(); ++s)
        if (bt.indices[s] == idx) {
          const auto v = bt.images.to_vector();
          return std::vector<float>(v.begin() + s * 16, v.begin() + (s + 1) * 16);
        }
    return std::vector<float>{};
  };
  int differ = 0;
  for (int64_t idx = 0; idx < 37; ++idx) differ += image_of(a0, idx) != image_of(a1, idx);
  EXPECT_GT(differ, 0);
  // Without shuffle and in eval mode, epochs are identical and in dataset order.
  LoaderConfig cfg = augmenting(2);
  cfg.shuffle = false;
  cfg.train = false;
  DataLoader c(ds, cfg);
  const auto c0 = epoch_of(c, 0);
  expect_same(c0, epoch_of(c, 1));
  std::vector<int64_t> iota(37);
  for (int64_t i = 0; i < 37; ++i) iota[i] = i;
  EXPECT_EQ(all_indices(c0), iota);
}

TEST(Loader, DistributedRanksSplitTheGlobalBatch) {
  auto ds = std::make_shared<ToyDataset>(30, 1);
  std::vector<std::vector<Batch>> per_rank;
  for (int r = 0; r < 3; ++r) {
    LoaderConfig cfg = augmenting(2);
    cfg.world = 3;
    cfg.rank = r;
    DataLoader dl(ds, cfg);
    per_rank.push_back(epoch_of(dl, 4));
  }
  LoaderConfig one = augmenting(1);
  one.batch_size = 12;
  DataLoader single(ds, one);
  const auto ref = epoch_of(single, 4);
  ASSERT_EQ(ref.size(), 3u);  // 12, 12, 6
  for (size_t b = 0; b < ref.size(); ++b) {
    std::vector<int64_t> idx;
    std::vector<float> img;
    for (int r = 0; r < 3; ++r) {
      const Batch& bt = per_rank[r][b];
      EXPECT_EQ(bt.sample_offset, static_cast<int64_t>(idx.size()));
      EXPECT_EQ(bt.global_batch_size, ref[b].global_batch_size);
      idx.insert(idx.end(), bt.indices.begin(), bt.indices.end());
      const auto v = bt.images.to_vector();
      img.insert(img.end(), v.begin(), v.end());
    }
    // The data-parallel step sees exactly the single-process batch, augmented identically.
    EXPECT_EQ(idx, ref[b].indices);
    EXPECT_EQ(img, ref[b].images.to_vector());
  }
  EXPECT_EQ(per_rank[0][2].images.size(0), 2);
}

TEST(Loader, DropLast) {
  auto ds = std::make_shared<ToyDataset>(23, 1);
  LoaderConfig cfg = augmenting(2);
  cfg.drop_last = true;
  DataLoader dl(ds, cfg);
  EXPECT_EQ(dl.num_batches(), 5);
  const auto e = epoch_of(dl, 0);
  ASSERT_EQ(e.size(), 5u);
  for (const auto& b : e) EXPECT_EQ(b.images.size(0), 4);
}

TEST(Loader, WorkerErrorPropagatesWithContext) {
  for (int workers : {0, 1, 3}) {
    SCOPED_TRACE(workers);
    auto ds = std::make_shared<ToyDataset>(40, 1, 13);
    LoaderConfig cfg = augmenting(workers);
    cfg.shuffle = false;
    DataLoader dl(ds, cfg);
    dl.start_epoch(0);
    Batch b;
    for (int k = 0; k < 3; ++k) {  // batches 0..2 hold samples 0..11
      ASSERT_TRUE(dl.next(b));
      EXPECT_EQ(b.index, k);
    }
    try {
      dl.next(b);
      ADD_FAILURE() << "no error from the broken sample";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("[loader] batch 3", 0), 0u) << msg;
      EXPECT_NE(msg.find("dataset index 13"), std::string::npos) << msg;
      EXPECT_NE(msg.find("[toy] sample 13 is broken"), std::string::npos) << msg;
    }
    // The loader stays usable: the next batch comes, and a new epoch can start.
    ASSERT_TRUE(dl.next(b));
    EXPECT_EQ(b.index, 4);
    dl.start_epoch(1);
    EXPECT_NE(error_of(dl), "");
  }
}

TEST(Loader, RestartingAnEpochAndDestroyingMidEpoch) {
  auto ds = std::make_shared<ToyDataset>(200, 1);
  LoaderConfig cfg = augmenting(3);
  cfg.batch_size = 2;
  {
    DataLoader dl(ds, cfg);
    Batch b;
    dl.start_epoch(0);
    ASSERT_TRUE(dl.next(b));
    dl.start_epoch(0);  // stops the running epoch, starts again from batch 0
    ASSERT_TRUE(dl.next(b));
    EXPECT_EQ(b.index, 0);
    dl.start_epoch(7);
    ASSERT_TRUE(dl.next(b));
    EXPECT_EQ(b.index, 0);
    const auto rest = epoch_of(dl, 7);
    EXPECT_EQ(rest.size(), 100u);
    EXPECT_EQ(rest[0].indices, b.indices);
    dl.start_epoch(8);
    ASSERT_TRUE(dl.next(b));
  }  // destroyed with workers running
  SUCCEED();
}

TEST(Loader, MisuseIsAnError) {
  auto ds = std::make_shared<ToyDataset>(10, 1);
  {
    DataLoader dl(ds, augmenting(1));
    Batch b;
    EXPECT_THROW(dl.next(b), Error);  // before start_epoch
  }
  LoaderConfig cfg = augmenting(1);
  cfg.batch_size = 0;
  EXPECT_THROW(DataLoader(ds, cfg), Error);
  cfg = augmenting(1);
  cfg.transform.normalize = {{0.1f, 0.2f}, {1.0f, 1.0f}};  // 2 channels' stats for 1 channel
  EXPECT_THROW(DataLoader(ds, cfg), Error);
  cfg = augmenting(1);
  cfg.transform.random_crop = 9;  // 6x5 padded by 1 is 8x7
  EXPECT_THROW(DataLoader(ds, cfg), Error);
  cfg = augmenting(1);
  cfg.rank = 1;  // world 1
  EXPECT_THROW(DataLoader(ds, cfg), Error);
  EXPECT_THROW(DataLoader(nullptr, augmenting(1)), Error);
}

TEST(Loader, FashionMnistSubset) {
  auto ds =
      subset(load_mnist_dir("/usr/share/datasets/fashion-mnist", false, "fashion-mnist"), 100);
  LoaderConfig cfg;
  cfg.batch_size = 32;
  cfg.num_workers = 2;
  cfg.transform.random_crop = 28;
  cfg.transform.crop_padding = 2;
  cfg.transform.normalize = normalization_for("fashion_mnist");
  DataLoader dl(ds, cfg);
  const auto e = epoch_of(dl, 0);
  ASSERT_EQ(e.size(), 4u);
  EXPECT_EQ(e[3].images.shape(), (Shape{4, 1, 28, 28}));
  std::set<int64_t> seen;
  for (const auto& b : e) {
    seen.insert(b.indices.begin(), b.indices.end());
    for (float v : b.images.to_vector()) {
      EXPECT_GE(v, -0.2860f / 0.3530f - 1e-5f);
      EXPECT_LE(v, (1 - 0.2860f) / 0.3530f + 1e-5f);
    }
    for (int64_t s = 0; s < b.labels.numel(); ++s) {
      EXPECT_GE(b.labels.data<int32_t>()[s], 0);
      EXPECT_LT(b.labels.data<int32_t>()[s], 10);
    }
  }
  EXPECT_EQ(seen.size(), 100u);
}
