// Datasets, transforms and a prefetching distributed loader.
//
// Datasets decode one sample at a time into float CHW in [0, 1]; transforms (resize, random crop
// with padding, horizontal flip, normalize) run on the loader's worker threads. All randomness
// (shuffling, crops, flips) is drawn from the counter-based RNG keyed by (seed, epoch, dataset
// index), so the batches do not depend on the number of workers or on thread timing.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cai/core/tensor.h"

namespace cai::data {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual int64_t channels() const = 0;
  virtual int64_t height() const = 0;
  virtual int64_t width() const = 0;
  virtual int64_t num_classes() const = 0;
  // Writes sample i as float [channels, height, width] in [0, 1] into `out`; returns its label.
  // Thread-safe (called from loader workers).
  virtual int32_t get(int64_t i, float* out) const = 0;
  virtual std::string describe() const = 0;  // e.g. "fashion-mnist train (60000 28x28x1)"
};

// IDX files (MNIST, Fashion-MNIST), raw or gzip-compressed (chosen by content, not name).
// Corrupt or truncated files throw naming the file, the byte offset and what was expected.
std::shared_ptr<Dataset> load_idx(const std::string& images_path, const std::string& labels_path,
                                  const std::string& name = "idx");
// `dir` holds {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] (Debian's dataset-fashion-mnist
// installs them in /usr/share/datasets/fashion-mnist).
std::shared_ptr<Dataset> load_mnist_dir(const std::string& dir, bool train,
                                        const std::string& name = "mnist");
// CIFAR-10 binary version: dir holds data_batch_1..5.bin (train) and test_batch.bin.
std::shared_ptr<Dataset> load_cifar10(const std::string& dir, bool train);
// Size limits on the images load_image_folder decodes; get() refuses a larger image (cai::Error)
// before decoding it. The defaults are the product's; a smaller limit is for the fuzz harness
// (tests/fuzz), which would otherwise spend seconds under ASan decoding each huge declared image.
struct ImageLimits {
  int64_t max_pixels = int64_t{1} << 24;  // width × height as the header declares (4096x4096)
  int max_side = 8192;  // either side; also for headers stbi_info cannot read (stb checks it)
};
// One sub-folder per class (sorted names are classes 0..k-1), PNG/JPEG/BMP files decoded with stb
// as RGB and resized (bilinear) to image_size × image_size. `limits` may only lower the defaults.
std::shared_ptr<Dataset> load_image_folder(const std::string& dir, int64_t image_size,
                                           const ImageLimits& limits = {});
// Random images with fixed labels, for benchmarking the whole training path without I/O: n
// samples of channels × size × size values uniform in [0, 1), and a label in [0, num_classes):
// the label and a key from philox(seed, sample index, 0), the values an integer hash of (key,
// position), so sample i is the same on every call and every epoch, and cheap to make (a
// benchmark must not wait for its loader). `name` goes into describe() (e.g. "synthetic train").
std::shared_ptr<Dataset> synthetic(int64_t n, int64_t channels, int64_t size, int64_t num_classes,
                                   uint64_t seed, const std::string& name = "synthetic");
// The first n samples of a dataset (n clamped to its size).
std::shared_ptr<Dataset> subset(std::shared_ptr<Dataset> base, int64_t n);

// Per-dataset normalisation statistics ("fashion_mnist", "mnist", "cifar10", "imagenet").
struct Normalization {
  std::vector<float> mean, std;
};
Normalization normalization_for(const std::string& dataset);

struct TransformConfig {
  int64_t resize = 0;            // resize to resize × resize first (bilinear); 0 = keep
  int64_t random_crop = 0;       // random crop of this size after zero-padding; 0 = none
  int64_t crop_padding = 0;      // padding on every side before the random crop
  bool horizontal_flip = false;  // flip with probability 1/2
  Normalization normalize;       // empty mean/std = none
  // Output size for an input of h × w.
  int64_t out_height(int64_t h) const;
  int64_t out_width(int64_t w) const;
};

// Applies the transform to one CHW image. Random choices use philox(seed, stream, offset) with
// offset derived from `sample_key` (the dataset index) and `epoch`; `train` false disables the
// random parts (crop becomes a center crop, no flip).
void apply_transform(const TransformConfig& t, const float* in, int64_t c, int64_t h, int64_t w,
                     float* out, bool train, uint64_t seed, uint64_t epoch, uint64_t sample_key);

// The order of dataset indices one rank visits in one epoch. The epoch's order (a seeded
// permutation when shuffle is on) is cut into global batches of batch_size × world; within each
// global batch, rank r takes the contiguous block [r·batch_size, (r+1)·batch_size). With
// drop_last the incomplete final global batch is dropped; otherwise the order is padded by
// repeating its first indices to a multiple of `world` and the final global batch is split into
// `world` equal blocks. So ranks' shards are disjoint (padding aside) and cover the set, and a
// data-parallel step sees exactly the samples of the single-process step with the global batch.
class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, int64_t batch_size, int world, int rank, bool shuffle,
                     bool drop_last, uint64_t seed);
  std::vector<int64_t> indices(int64_t epoch) const;  // this rank's indices, in visit order
  int64_t num_batches() const;                        // per rank per epoch
  // Local batch b of an epoch: its dataset indices and the position of its first sample inside
  // the global batch (rank·batch_size, or rank·block in the final short global batch).
  std::vector<int64_t> batch(int64_t epoch, int64_t b, int64_t* offset_in_global_batch) const;
  int64_t global_batch_size(int64_t b) const;  // samples of global batch b over all ranks

 private:
  std::vector<int64_t> epoch_order(int64_t epoch) const;
  int64_t n_, bs_;
  int world_, rank_;
  bool shuffle_, drop_last_;
  uint64_t seed_;
  int64_t total_;  // length of the (padded or truncated) epoch order
};

struct LoaderConfig {
  int64_t batch_size = 32;  // per rank
  bool shuffle = true;
  bool drop_last = false;
  bool train = true;  // random transforms on
  uint64_t seed = 0;
  int num_workers = 2;  // decoding/transform threads; 0 = in the calling thread
  // Batches decoded ahead beyond the ones the workers are building: at most num_workers +
  // prefetch batches are claimed and not yet handed out, so every worker stays busy (as
  // PyTorch's prefetch_factor per worker does) while memory stays bounded.
  int prefetch = 4;
  int world = 1, rank = 0;
  TransformConfig transform;
};

struct Batch {
  Tensor images;                  // [B, C, H, W] fp32 (CPU)
  Tensor labels;                  // [B] int32
  int64_t index = 0;              // batch number within the epoch
  int64_t sample_offset = 0;      // position of the first sample within the global batch
  int64_t global_batch_size = 0;  // samples in this step over all ranks
  std::vector<int64_t> indices;   // dataset indices
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> ds, const LoaderConfig& cfg);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Starts an epoch (stopping one in progress); batches then come from next().
  void start_epoch(int64_t epoch);
  // The next batch of the epoch; false at its end. Rethrows a worker's error with context.
  bool next(Batch& out);
  int64_t num_batches() const;
  const Dataset& dataset() const { return *ds_; }
  int64_t out_channels() const;
  int64_t out_height() const;
  int64_t out_width() const;

 private:
  struct Impl;
  std::shared_ptr<const Dataset> ds_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cai::data
