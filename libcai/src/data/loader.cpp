// DataLoader: worker threads decode and transform whole batches ahead (at most num_workers +
// `prefetch` batches claimed but not yet consumed) and next() hands them out in batch order. A
// batch's content depends only on (seed, epoch, batch number), never on the workers or on timing.
// Workers run at a lower scheduling priority than the rest of the process (nice + 5 on Linux):
// when they outnumber the idle cores (several ranks on one host, each with its workers), the
// thread that launches the step's kernels keeps its core instead of queueing behind them.
#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "cai/core/error.h"
#include "cai/data/data.h"

namespace cai::data {
namespace {

// This thread's nice value 5 above the process's (Linux: per thread); nothing where not allowed.
void lower_priority() {
#ifdef __linux__
  const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  errno = 0;
  const int now = ::getpriority(PRIO_PROCESS, tid);
  if (errno == 0) (void)::setpriority(PRIO_PROCESS, tid, std::min(now + 5, 19));
#endif
}

// A sample's decode or transform failed: keeps the dataset index for the loader's message.
class SampleError : public Error {
 public:
  SampleError(int64_t index, const std::string& what) : Error(what), index_(index) {}
  int64_t index() const { return index_; }

 private:
  int64_t index_;
};

}  // namespace

struct DataLoader::Impl {
  Impl(std::shared_ptr<const Dataset> d, const LoaderConfig& c)
      : ds(std::move(d)),
        cfg(c),
        sampler(ds->size(), c.batch_size, c.world, c.rank, c.shuffle, c.drop_last, c.seed) {}

  std::shared_ptr<const Dataset> ds;
  LoaderConfig cfg;
  DistributedSampler sampler;

  // The current epoch (read-only while workers run).
  bool started = false;
  int64_t epoch = 0;
  int64_t nb = 0;
  std::vector<int64_t> order;  // this rank's indices for the epoch

  // Shared with the workers, under mu.
  struct Slot {
    Batch batch;
    std::exception_ptr error;
  };
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  int64_t next_claim = 0;  // next batch a worker will build
  int64_t delivered = 0;   // batches handed out by next()
  std::map<int64_t, Slot> ready;
  std::vector<std::thread> workers;

  Batch make(int64_t b) const;
  void worker_loop();
  void stop_workers();
};

Batch DataLoader::Impl::make(int64_t b) const {
  const int64_t world = cfg.world;
  const int64_t gbs = sampler.global_batch_size(b);
  const int64_t block = gbs / world;
  // Every batch before the last holds batch_size samples.
  const int64_t start = b * cfg.batch_size;
  const int64_t c = ds->channels(), h = ds->height(), w = ds->width();
  const int64_t oh = cfg.transform.out_height(h), ow = cfg.transform.out_width(w);
  const int64_t per_in = c * h * w, per_out = c * oh * ow;

  Batch out;
  out.index = b;
  out.sample_offset = cfg.rank * block;
  out.global_batch_size = gbs;
  out.indices.assign(order.begin() + start, order.begin() + start + block);
  out.images = Tensor::empty({block, c, oh, ow});
  out.labels = Tensor::empty({block}, DType::I32);
  float* img = out.images.data<float>();
  int32_t* lab = out.labels.data<int32_t>();
  std::vector<float> tmp(static_cast<size_t>(per_in));
  for (int64_t s = 0; s < block; ++s) {
    const int64_t idx = out.indices[static_cast<size_t>(s)];
    try {
      const int32_t label = ds->get(idx, tmp.data());
      CAI_CHECK(label >= 0 && label < ds->num_classes(),
                "[loader] {} gave label {} for sample {}, outside [0, {})", ds->describe(), label,
                idx, ds->num_classes());
      apply_transform(cfg.transform, tmp.data(), c, h, w, img + s * per_out, cfg.train, cfg.seed,
                      static_cast<uint64_t>(epoch), static_cast<uint64_t>(idx));
      lab[s] = label;
    } catch (const std::exception& e) {
      throw SampleError(idx, e.what());
    }
  }
  return out;
}

void DataLoader::Impl::worker_loop() {
  // Every worker may build one batch while `prefetch` finished ones wait: a single slow batch
  // (a whole batch per worker) then never leaves the other workers idle.
  const int64_t ahead = std::max<int64_t>(cfg.prefetch + cfg.num_workers, 1);
  for (;;) {
    int64_t b = 0;
    {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return stop || next_claim >= nb || next_claim < delivered + ahead; });
      if (stop || next_claim >= nb) return;
      b = next_claim++;
    }
    Slot slot;
    try {
      slot.batch = make(b);
    } catch (...) {
      slot.error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lk(mu);
      ready.emplace(b, std::move(slot));
    }
    cv.notify_all();
  }
}

void DataLoader::Impl::stop_workers() {
  {
    std::lock_guard<std::mutex> lk(mu);
    stop = true;
  }
  cv.notify_all();
  for (std::thread& t : workers) t.join();
  workers.clear();
  ready.clear();
  stop = false;
}

DataLoader::DataLoader(std::shared_ptr<const Dataset> ds, const LoaderConfig& cfg)
    : ds_(std::move(ds)) {
  CAI_CHECK(ds_, "[loader] null dataset");
  CAI_CHECK(cfg.batch_size > 0, "[loader] batch_size {} must be > 0", cfg.batch_size);
  CAI_CHECK(cfg.num_workers >= 0, "[loader] num_workers {} must be >= 0", cfg.num_workers);
  CAI_CHECK(cfg.prefetch >= 0, "[loader] prefetch {} must be >= 0", cfg.prefetch);
  const TransformConfig& t = cfg.transform;
  const int64_t c = ds_->channels();
  const size_t nm = t.normalize.mean.size();
  CAI_CHECK(nm == t.normalize.std.size() && (nm == 0 || nm == 1 || static_cast<int64_t>(nm) == c),
            "[loader] normalize has {} means and {} stds for {} with {} channels (expected {} or "
            "1 of each)",
            nm, t.normalize.std.size(), ds_->describe(), c, c);
  if (cfg.train && t.random_crop > 0) {
    const int64_t h = t.resize > 0 ? t.resize : ds_->height();
    const int64_t w = t.resize > 0 ? t.resize : ds_->width();
    CAI_CHECK(t.random_crop <= h + 2 * t.crop_padding && t.random_crop <= w + 2 * t.crop_padding,
              "[loader] random crop {} does not fit the {}x{} images of {} padded by {}",
              t.random_crop, h, w, ds_->describe(), t.crop_padding);
  }
  impl_ = std::make_unique<Impl>(ds_, cfg);
}

DataLoader::~DataLoader() {
  if (impl_) impl_->stop_workers();
}

void DataLoader::start_epoch(int64_t epoch) {
  Impl& m = *impl_;
  m.stop_workers();
  m.epoch = epoch;
  m.order = m.sampler.indices(epoch);
  m.nb = m.sampler.num_batches();
  m.next_claim = 0;
  m.delivered = 0;
  m.started = true;
  const int64_t n = std::min<int64_t>(m.cfg.num_workers, m.nb);
  m.workers.reserve(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k)
    m.workers.emplace_back([&m] {
      lower_priority();
      m.worker_loop();
    });
}

namespace {

[[noreturn]] void rethrow_with_context(int64_t b, const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const SampleError& e) {
    fail("[loader] batch {} (dataset index {}): {}", b, e.index(), e.what());
  } catch (const std::exception& e) {
    fail("[loader] batch {}: {}", b, e.what());
  } catch (...) {
    fail("[loader] batch {}: unknown error", b);
  }
}

}  // namespace

bool DataLoader::next(Batch& out) {
  Impl& m = *impl_;
  CAI_CHECK(m.started, "[loader] next() called before start_epoch()");
  if (m.delivered >= m.nb) return false;
  const int64_t b = m.delivered;
  if (m.workers.empty()) {  // num_workers = 0: build in the calling thread
    ++m.delivered;
    try {
      out = m.make(b);
    } catch (...) {
      rethrow_with_context(b, std::current_exception());
    }
    return true;
  }
  Impl::Slot slot;
  {
    std::unique_lock<std::mutex> lk(m.mu);
    m.cv.wait(lk, [&] { return m.ready.count(b) > 0; });
    auto it = m.ready.find(b);
    slot = std::move(it->second);
    m.ready.erase(it);
    ++m.delivered;
  }
  m.cv.notify_all();
  if (slot.error) rethrow_with_context(b, slot.error);
  out = std::move(slot.batch);
  return true;
}

int64_t DataLoader::num_batches() const {
  return impl_->sampler.num_batches();
}

int64_t DataLoader::out_channels() const {
  return ds_->channels();
}

int64_t DataLoader::out_height() const {
  return impl_->cfg.transform.out_height(ds_->height());
}

int64_t DataLoader::out_width() const {
  return impl_->cfg.transform.out_width(ds_->width());
}

}  // namespace cai::data
