#include "cai/train/trainer.h"

#include <csignal>

#include <nlohmann/json.hpp>

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <future>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>

#include "cai/core/error.h"
#include "cai/core/kernel_profile.h"
#include "cai/core/log.h"
#include "cai/ops/ops.h"
#include "cai/train/sensors.h"
#include "kernels/cpu/parallel.h"
#include "kernels/device.h"
#include "trainer_internal.h"

namespace cai::train {

namespace {
using detail::Clock;
using detail::seconds_since;

// Moves a step's host batches to the GPU ahead of their step, on a copy stream: each of two
// slots owns pinned host buffers and device buffers per micro-batch. stage() hands the slot to a
// staging thread (one for the prefetcher's life) that copies the host
// batches into its pinned buffers and starts the asynchronous copies to its device buffers (the
// batches hold views of those at once); use() waits for that task (the host part only) and makes
// the compute stream wait for the copies (by event); done() records when the compute stream has
// finished with the slot. The trainer stages step s + 1 before launching step s, so the host copy
// (154 MB for a ViT-B batch of 256: about 12 ms) overlaps step s on the GPU even where a plugin
// waits for the device at the end of its forward_backward (tensor and pipeline parallelism), where
// staging after it left the GPU idle. The device buffers stay owned by the slot, so the caching
// allocator (which is not stream-aware) never hands them to other work while a copy or a kernel may
// still touch them; a copy into a slot waits (on the device) for the compute that last read it, and
// the host waits for the copy out of a pinned buffer before refilling it (issued two steps earlier:
// in practice long done). Everything that touches the allocator or the compute stream stays on the
// calling thread. With a CPU model, batches are used as they come.
class BatchPrefetcher {
 public:
  explicit BatchPrefetcher(Device dev) : dev_(dev) {
    if (!dev_.is_cuda()) return;
    kernels::cuda::set_device(dev_.index);
    stream_ = kernels::cuda::stream_create();
    for (Slot& s : slots_) {
      s.copied = kernels::cuda::event_create();
      s.computed = kernels::cuda::event_create();
    }
    issued_ = kernels::cuda::event_create();
    worker_ = std::thread([this] { work(); });
  }
  ~BatchPrefetcher() {
    if (!dev_.is_cuda()) return;
    {
      std::lock_guard<std::mutex> l(m_);
      stop_ = true;
    }
    cv_.notify_one();
    worker_.join();  // runs the queued jobs first
    for (Slot& s : slots_) {
      try {
        if (s.task.valid()) s.task.get();
        if (s.used) {
          kernels::cuda::event_synchronize(s.copied);
          kernels::cuda::event_synchronize(s.computed);
        }
      } catch (...) {  // a device error is reported elsewhere; free what we can
      }
      for (Buffer& b : s.buffers) kernels::cuda::free_pinned(b.pinned);
      kernels::cuda::event_destroy(s.copied);
      kernels::cuda::event_destroy(s.computed);
    }
    kernels::cuda::event_destroy(issued_);
    kernels::cuda::stream_destroy(stream_);
  }
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  // Starts moving `batches` to the device; they hold device tensors afterwards.
  void stage(std::vector<data::Batch>& batches) {
    if (!dev_.is_cuda()) {
      for (auto& b : batches) {
        b.images = b.images.to(dev_);
        b.labels = b.labels.to(dev_);
      }
      return;
    }
    Slot& s = slots_[next_];
    if (s.task.valid()) s.task.get();  // staged but never used (not in the trainer's order)
    if (s.used) kernels::cuda::event_synchronize(s.copied);  // its pinned buffers are free
    if (s.buffers.size() < batches.size()) s.buffers.resize(batches.size());
    // The copies into this slot's device buffers wait for the compute that last read them.
    if (s.used) kernels::cuda::stream_wait_event(stream_, s.computed);
    std::vector<Copy> copies;
    for (size_t i = 0; i < batches.size(); ++i) {
      Buffer& buf = s.buffers[i];
      data::Batch& b = batches[i];
      CAI_CHECK(
          !b.images.is_cuda() && b.images.dtype() == DType::F32 && b.labels.dtype() == DType::I32,
          "[trainer] batch images {} / labels {}: expected host fp32 and int32", b.images.str(),
          b.labels.str());
      const size_t ib = b.images.nbytes(), lb = b.labels.nbytes(), need = ib + lb;
      if (buf.capacity < need) {
        kernels::cuda::free_pinned(buf.pinned);
        buf.pinned = nullptr, buf.capacity = 0;
        buf.pinned = static_cast<unsigned char*>(kernels::cuda::alloc_pinned(need));
        buf.capacity = need;
      }
      if (buf.images.shape() != b.images.shape() || buf.labels.shape() != b.labels.shape()) {
        // New device buffers (the epoch's short last batch): the old ones go back to the
        // allocator only once nothing on the device reads them.
        if (s.used) kernels::cuda::event_synchronize(s.computed);
        buf.images = Tensor::empty(b.images.shape(), DType::F32, dev_);
        buf.labels = Tensor::empty(b.labels.shape(), DType::I32, dev_);
        // The caching allocator may hand out memory the host freed while kernels that read it
        // are still queued on the compute stream (an activation of the step in flight); the
        // copy stream does not follow that stream, so the copies into new buffers wait for
        // everything issued so far.
        kernels::cuda::event_record(issued_, nullptr);
        kernels::cuda::stream_wait_event(stream_, issued_);
      }
      // The task holds the host tensors until it has copied them.
      copies.push_back({b.images, b.labels, buf.pinned, buf.images.raw(), buf.labels.raw()});
      b.images = buf.images;
      b.labels = buf.labels;
    }
    const auto queued = Clock::now();
    std::packaged_task<void()> job(
        [this, copies = std::move(copies), slot = next_, queued]() mutable {
          Timing& t = slots_[slot].timing;
          auto mark = queued;
          auto lap = [&mark] {
            const auto now = Clock::now();
            const double ms = 1e3 * std::chrono::duration<double>(now - mark).count();
            mark = now;
            return ms;
          };
          t = Timing{};
          t.start_ms = lap();
          for (const Copy& c : copies) {
            const size_t ib = c.images.nbytes(), lb = c.labels.nbytes();
            pinned_copy(c.pinned, static_cast<const unsigned char*>(c.images.raw()), ib);
            std::memcpy(c.pinned + ib, c.labels.raw(), lb);
            t.pinned_ms += lap();
            kernels::cuda::copy_h2d_async(c.dev_images, c.pinned, ib, stream_);
            kernels::cuda::copy_h2d_async(c.dev_labels, c.pinned + ib, lb, stream_);
            t.issue_ms += lap();
          }
          kernels::cuda::event_record(slots_[slot].copied, stream_);
          t.issue_ms += lap();
          // The host batches go here, not with the task's state in use()'s get() on the trainer
          // thread: freeing a ViT-B batch (154 MB, returned to the system) took ~5 ms there, the
          // GPU idle at every step boundary where the trainer had waited for the device.
          copies.clear();
          t.free_ms = lap();
          t.end = mark;
        });
    s.task = job.get_future();
    {
      std::lock_guard<std::mutex> l(m_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
    s.used = true;
    staged_ = next_;
    next_ = 1 - next_;
  }
  // The compute stream waits for the staged batches' copies (no host block). On a GPU, `staging`
  // gets the background task's time for these batches.
  void use(std::vector<std::pair<const char*, double>>* staging = nullptr) {
    if (dev_.is_cuda()) {
      Slot& s = slots_[staged_];
      const auto t0 = Clock::now();
      if (s.task.valid()) {
        s.task.get();  // the copies are issued and `copied` recorded
        if (staging) {
          staging->emplace_back("trainer thread: waiting for the job", 1e3 * seconds_since(t0));
          staging->emplace_back("waiting for the staging thread", s.timing.start_ms);
          staging->emplace_back("copy into pinned memory", s.timing.pinned_ms);
          staging->emplace_back("issue the device copies", s.timing.issue_ms);
          staging->emplace_back("free the host batches", s.timing.free_ms);
          staging->emplace_back("the task ended before use() (ms; < 0: after)",
                                1e3 * std::chrono::duration<double>(t0 - s.timing.end).count());
        }
      }
      const auto t1 = Clock::now();
      kernels::cuda::stream_wait_event(nullptr, s.copied);
      if (staging)
        staging->emplace_back("trainer thread: the compute stream's wait", 1e3 * seconds_since(t1));
    }
    in_use_ = staged_;
  }
  // Everything that reads the batches of the last use() has been enqueued.
  void done() {
    if (dev_.is_cuda()) kernels::cuda::event_record(slots_[in_use_].computed, nullptr);
  }

 private:
  struct Buffer {
    unsigned char* pinned = nullptr;
    size_t capacity = 0;
    Tensor images, labels;  // device
  };
  // The background task's time for a slot's batches, in milliseconds.
  struct Timing {
    double start_ms = 0;    // from stage() until the task ran
    double pinned_ms = 0;   // host copies into pinned memory
    double issue_ms = 0;    // issuing the device copies and the event
    double free_ms = 0;     // freeing the host batches
    Clock::time_point end;  // when the task finished
  };
  struct Slot {
    std::vector<Buffer> buffers;  // one per micro-batch
    Timing timing;                // written by the task, read after it is joined
    void* copied = nullptr;       // recorded on the copy stream after the slot's copies
    void* computed = nullptr;     // recorded on the compute stream after the slot's step
    bool used = false;
    std::future<void> task;  // the host copy and the issue of the device copies
  };
  struct Copy {
    Tensor images, labels;  // host
    unsigned char* pinned;
    void *dev_images, *dev_labels;
  };
  // The staging thread: runs the jobs in order (a job's exception goes to its future).
  void work() {
    try {
      kernels::cuda::set_device(dev_.index);
    } catch (...) {  // the jobs' own CUDA calls report it
    }
    for (;;) {
      std::packaged_task<void()> job;
      {
        std::unique_lock<std::mutex> l(m_);
        cv_.wait(l, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, nothing left
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }
  // memcpy into pinned memory on the CPU pool's threads (one thread's copy of a ViT-B batch, 154
  // MB, takes ~20 ms; inline when another thread holds the pool).
  static void pinned_copy(unsigned char* dst, const unsigned char* src, size_t n) {
    const int64_t chunk = 4 << 20, chunks = static_cast<int64_t>((n + chunk - 1) / chunk);
    kernels::cpu::parallel_for(chunks, 1, [&](int64_t lo, int64_t hi) {
      const size_t from = static_cast<size_t>(lo * chunk);
      const size_t to = std::min(n, static_cast<size_t>(hi * chunk));
      std::memcpy(dst + from, src + from, to - from);
    });
  }
  Device dev_;
  void* stream_ = nullptr;
  void* issued_ = nullptr;  // recorded on the compute stream before copies into new buffers
  Slot slots_[2];
  int next_ = 0, staged_ = 0, in_use_ = 0;
  std::mutex m_;  // guards jobs_ and stop_
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> jobs_;
  bool stop_ = false;
  std::thread worker_;  // last: started once everything above exists
};

}  // namespace

Trainer::Trainer(nn::ViT& model, optim::Optimizer& opt, Criterion criterion,
                 data::DataLoader& train, data::DataLoader* eval, std::shared_ptr<Plugin> plugin,
                 TrainerConfig cfg)
    : model_(model),
      opt_(opt),
      crit_(criterion),
      train_(train),
      eval_(eval),
      plugin_(plugin ? std::move(plugin) : std::make_shared<Plugin>()),
      cfg_(cfg) {
  CAI_CHECK(cfg_.num_epochs >= 1, "[trainer] num_epochs {} must be at least 1", cfg_.num_epochs);
  CAI_CHECK(cfg_.gradient_accumulation >= 1, "[trainer] gradient_accumulation {} must be >= 1",
            cfg_.gradient_accumulation);
  CAI_CHECK(cfg_.clip_grad_norm >= 0, "[trainer] clip_grad_norm {} must be >= 0 (0 = off)",
            cfg_.clip_grad_norm);
  CAI_CHECK(train_.num_batches() > 0, "[trainer] the training loader yields no batch ({})",
            train_.dataset().describe());
  model_.set_compute_dtype(cfg_.precision);
  if (cfg_.precision == DType::F16)
    scaler_ = std::make_unique<optim::DynamicGradScaler>(cfg_.grad_scaler);
}

int64_t Trainer::steps_per_epoch() const {
  int64_t steps =
      (train_.num_batches() + cfg_.gradient_accumulation - 1) / cfg_.gradient_accumulation;
  if (cfg_.max_steps_per_epoch > 0) steps = std::min(steps, cfg_.max_steps_per_epoch);
  return steps;
}

struct Trainer::StepValues {
  Tensor device;                 // [steps, 3] where the model lives: loss sum, correct, grad norm
  std::vector<float> host;       // rows [0, read) copied
  int64_t read = 0;              // rows read so far
  double loss = 0, correct = 0;  // over the ranks, rows [0, read)
  // On a GPU: rows [0, staged) are copied, in the compute stream's order, to `pinned` (as many
  // rows as `device`), and `copied` completes once the last of those copies has.
  float* pinned = nullptr;
  void* copied = nullptr;
  int64_t staged = 0;

  StepValues() = default;
  StepValues(const StepValues&) = delete;
  StepValues& operator=(const StepValues&) = delete;
  ~StepValues() {
    if (copied) {
      try {
        kernels::cuda::event_synchronize(copied);  // no copy into `pinned` is left in flight
      } catch (...) {  // a device error is reported elsewhere; free what we can
      }
      kernels::cuda::event_destroy(copied);
    }
    if (pinned) kernels::cuda::free_pinned(pinned);
  }
};

// On a GPU: starts copying the rows [v.staged, upto] to the host behind the work issued so far.
// The trainer calls it once a step's row is final (before the optimizer step), so reading the
// values waits for that point of the step, not for the queue to drain: the optimizer step is
// still queued while the host reads, reduces over the ranks and runs the hooks. Reading after
// the whole step, the device had nothing queued from the step's end until the next step's
// launches. (An A/B through vit_train, 2 H100, values every 2 steps: no change in img/s beyond
// the noise; docs/bench/README.md.)
void Trainer::stage_values(StepValues& v, int64_t upto) {
  if (!v.device.is_cuda() || upto < v.staged) return;
  if (!v.pinned) {
    v.pinned = static_cast<float*>(kernels::cuda::alloc_pinned(v.device.nbytes()));
    v.copied = kernels::cuda::event_create();
  }
  const int64_t rows = upto + 1 - v.staged;
  const Tensor part = v.device.narrow(v.staged, rows);
  kernels::cuda::copy_d2h_async(v.pinned + v.staged * 3, part.raw(), part.nbytes(), nullptr);
  kernels::cuda::event_record(v.copied, nullptr);
  v.staged = upto + 1;
}

// Reads the rows [v.read, upto], reduces their sums over the ranks (every rank calls this at the
// same steps) and, with `info`, fills the values of step `upto`.
void Trainer::read_values(StepValues& v, int64_t upto, int64_t epoch, StepInfo* info,
                          const std::function<void(const char*)>& phase) {
  const int64_t first = v.read, rows = upto + 1 - first;
  if (rows <= 0) return;
  std::vector<float> got;
  if (v.device.is_cuda()) {
    // Wait on an event, not in a synchronous copy: the copy's own wait for the device (a whole
    // step) held up the batch stager's cudaMemcpyAsync calls on its thread for as long (2 H200,
    // dp 2: 64 ms in half the steps), so the next batch came 4-6 ms after the device had
    // finished, idle.
    stage_values(v, upto);
    kernels::cuda::event_synchronize(v.copied);
    got.assign(v.pinned + first * 3, v.pinned + (upto + 1) * 3);
  } else {
    got = v.device.narrow(first, rows).to_vector();
  }
  if (phase) phase("wait for the values");
  v.host.insert(v.host.end(), got.begin(), got.end());
  double loss = 0, correct = 0;
  for (int64_t r = 0; r < rows; ++r) loss += got[r * 3], correct += got[r * 3 + 1];
  loss = plugin_->all_reduce_sum(loss);
  correct = plugin_->all_reduce_sum(correct);
  v.read = upto + 1;
  if (!std::isfinite(loss)) {
    // Name the first step this rank saw go bad (another rank may hold it: then the range).
    for (int64_t r = first; r <= upto; ++r)
      CAI_CHECK(std::isfinite(v.host[r * 3]), "[trainer] loss became {} at epoch {} step {}",
                v.host[r * 3], epoch, r);
    fail("[trainer] loss became {} at epoch {} between steps {} and {}", loss, epoch, first, upto);
  }
  v.loss += loss;
  v.correct += correct;
  if (!info) {
    if (phase) phase("values over the ranks");
    return;
  }
  info->has_values = true;
  if (rows == 1) {
    info->loss = loss, info->accuracy = correct;
  } else {
    info->loss = plugin_->all_reduce_sum(got[(rows - 1) * 3]);
    info->accuracy = plugin_->all_reduce_sum(got[(rows - 1) * 3 + 1]);
  }
  info->loss /= static_cast<double>(info->images);
  info->accuracy /= static_cast<double>(info->images);
  if (cfg_.clip_grad_norm > 0 && !info->skipped) info->grad_norm = got[(rows - 1) * 3 + 2];
  if (phase) phase("values over the ranks");
}

void Trainer::resume_at(int64_t epoch, int64_t step_in_epoch, int64_t global_step,
                        std::string from) {
  CAI_CHECK(epoch >= 0 && step_in_epoch >= 0 && global_step >= 0,
            "[trainer] cannot resume at epoch {} step {} (global step {})", epoch, step_in_epoch,
            global_step);
  CAI_CHECK(step_in_epoch <= steps_per_epoch(),
            "[trainer] resume at step {} of epoch {}, which has {} steps", step_in_epoch, epoch,
            steps_per_epoch());
  resume_epoch_ = epoch;
  resume_step_ = step_in_epoch;
  global_step_ = global_step;
  resumed_ = ResumePoint{epoch, step_in_epoch, global_step, std::move(from)};
}

int64_t Trainer::steps_left() const {
  const int64_t epoch = resume_epoch_ >= 0 ? resume_epoch_ : 0;
  const int64_t done = resume_epoch_ >= 0 ? resume_step_ : 0;
  return epoch >= cfg_.num_epochs ? 0 : (cfg_.num_epochs - epoch) * steps_per_epoch() - done;
}

void Trainer::fit(int64_t start_epoch) {
  if (resume_epoch_ >= 0) start_epoch = resume_epoch_;
  for (auto& h : hooks_) h->before_train(*this);
  plugin_->zero_grad(model_, opt_);
  const int64_t steps = steps_per_epoch();
  const Device device = model_.device();
  BatchPrefetcher prefetch(device);
  // Rank 0's GPU's energy counter where training begins (StepInfo::energy_j counts from it;
  // the metrics file is rank 0's, and the other ranks skip the reads).
  kernels::cuda::GpuSensors sensors0;
  const bool sensors = device.is_cuda() && plugin_->rank() == 0 &&
                       kernels::cuda::read_sensors(device.index, &sensors0);
  // The reads during training run on a thread of their own (sensors.h: a read takes
  // milliseconds, which a layout that keeps the host in step with the device would leave the GPU
  // idle for).
  std::optional<SensorThread> sensor_thread;
  if (sensors) {
    const int index = device.index;
    sensor_thread.emplace([index](SensorValues* out) {
      kernels::cuda::GpuSensors s;
      if (!kernels::cuda::read_sensors(index, &s)) return false;
      *out = SensorValues{s.energy_mj, s.sm_mhz, s.power_mw};
      return true;
    });
  }
  // Images a second as model TFLOP/s and their share of the job's peak.
  const double step_flops = 3.0 * model_.config().forward_flops();
  auto rates = [&](double images_per_sec, double* tflops, double* mfu) {
    *tflops = step_flops * images_per_sec / 1e12;
    *mfu = cfg_.peak_tflops > 0 ? *tflops / cfg_.peak_tflops : -1.0;
  };
  for (int64_t epoch = start_epoch; epoch < cfg_.num_epochs; ++epoch) {
    for (auto& h : hooks_) h->before_epoch(*this, epoch);
    train_.start_epoch(epoch);
    const auto t0 = Clock::now();
    StepValues values;
    values.device = Tensor::zeros({steps, 3}, DType::F32, device);
    double seen = 0;
    int64_t batches_left = train_.num_batches();
    // A step's batches from the loader, staged to the device (the copy runs on its own stream).
    // The loss weight is 1 / (samples in the global step).
    auto load = [&](std::vector<data::Batch>& batches, int64_t& step_samples) {
      const int64_t micro = std::min(cfg_.gradient_accumulation, batches_left);
      batches_left -= micro;
      batches.assign(static_cast<size_t>(micro), data::Batch{});
      step_samples = 0;
      for (auto& b : batches) {
        CAI_CHECK(train_.next(b), "[trainer] the loader ended early in epoch {}", epoch);
        step_samples += b.global_batch_size;
      }
      prefetch.stage(batches);
    };
    int64_t first = 0;
    if (epoch == resume_epoch_) {
      // Resuming: draw and drop the batches of the steps already done in this epoch, so the
      // data order is the uninterrupted run's.
      for (; first < resume_step_; ++first) {
        const int64_t micro = std::min(cfg_.gradient_accumulation, batches_left);
        batches_left -= micro;
        data::Batch skipped;
        for (int64_t i = 0; i < micro; ++i)
          CAI_CHECK(train_.next(skipped), "[trainer] the loader ended early in epoch {}", epoch);
      }
      resume_epoch_ = -1;
    }
    std::vector<data::Batch> batches, next_batches;
    int64_t step_samples = 0, next_samples = 0;
    if (first < steps) load(next_batches, next_samples);
    // The next step's batches go to the device while this one computes. On a GPU they are
    // staged before this step's launches (a plugin may wait for the device at the end of
    // forward_backward); on the CPU after it, so one step's batches are held at a time.
    const bool stage_early = device.is_cuda();
    // The trainer thread's time per phase of the step (StepInfo::host_ms).
    std::vector<std::pair<const char*, double>> host_ms;
    auto mark = Clock::now();
    auto phase = [&](const char* name) {
      const auto now = Clock::now();
      host_ms.emplace_back(name, 1e3 * std::chrono::duration<double>(now - mark).count());
      mark = now;
    };
    for (int64_t s = first; s < steps; ++s) {
      phase("hooks");
      batches = std::move(next_batches);
      step_samples = next_samples;
      std::vector<std::pair<const char*, double>> staging;
      prefetch.use(&staging);
      phase("wait for the batch");
      if (stage_early && s + 1 < steps) load(next_batches, next_samples);
      phase("next batch: loader and staging");
      // fp16: the loss (so every gradient) is multiplied by the loss scale.
      const double scale = scaler_ ? scaler_->scale() : 1.0;
      const float weight = static_cast<float>(scale / static_cast<double>(step_samples));
      const StepMetrics local = plugin_->forward_backward(
          model_, batches, weight, crit_,
          nn::ForwardCtx{true, cfg_.seed, static_cast<uint64_t>(global_step_), 0});
      prefetch.done();
      phase("forward_backward");
      if (!stage_early && s + 1 < steps) load(next_batches, next_samples);
      batches.clear();
      Tensor row = values.device.reshape({steps * 3}).narrow(s * 3, 3);
      if (local.sums.defined()) row.narrow(0, 2).copy_from(local.sums.to(device));
      plugin_->sync_gradients(model_);
      phase("sync_gradients");
      StepInfo info;
      info.lr = opt_.groups().empty() ? 0 : opt_.groups().front().lr;
      if (scaler_) {
        // Unscale what this rank's optimizer sees and count inf/NaN in one pass (one host read),
        // then agree on overflow over every rank that holds other gradients (data-parallel
        // shards, pipeline stages).
        plugin_->finish_gradients(model_);
        const auto params = optimizer_params(opt_);
        const Tensor stats = optim::grad_stats(params, nullptr, static_cast<float>(1.0 / scale));
        const double bad = plugin_->all_reduce_max(static_cast<double>(stats.to_vector()[1]));
        std::string message;
        info.loss_scale = scale;
        info.skipped = scaler_->update(bad > 0, &message);
        if (!message.empty()) log::info("[grad_scaler] step {}: {}", global_step_ + 1, message);
      }
      if (info.skipped) {
        ++skipped_steps_;
      } else if (cfg_.clip_grad_norm > 0) {
        const Tensor norm = plugin_->clip_grad_norm(opt_, cfg_.clip_grad_norm);
        row.narrow(2, 1).copy_from(norm.to(device));
        phase("clip_grad_norm");
      }
      // The step's row is final: a hook that wants this step's values gets them once the device
      // has come this far (stage_values).
      info.epoch = epoch, info.num_epochs = cfg_.num_epochs;
      info.step_in_epoch = s + 1, info.steps_per_epoch = steps;
      info.global_step = global_step_ + 1;
      info.images = step_samples;
      bool wanted = false;
      for (auto& h : hooks_) wanted = wanted || h->needs_values(*this, info);
      if (wanted) stage_values(values, s);
      if (!info.skipped) {
        plugin_->optimizer_step(opt_);
        phase("optimizer step");
      }
      plugin_->zero_grad(model_, opt_);
      phase("zero_grad");
      ++global_step_;
      seen += static_cast<double>(step_samples);
      info.loss = info.accuracy = NAN;
      info.grad_norm = cfg_.clip_grad_norm > 0 && !info.skipped ? NAN : 0.0;
      // The GPU's sensors are asked for before the wait for the device, while it still runs this
      // step, and read on the sensor thread; the step's record takes the newest reading done
      // (this step's or an earlier one's: StepInfo::energy_step says which). The energy counter
      // lags the step's end by the host's lead over the device (less than a step, about the same
      // at every read).
      if (wanted && sensor_thread) {
        sensor_thread->request(global_step_);
        const SensorReading r = sensor_thread->latest();
        if (r.step >= 0) {
          info.energy_j = (r.sensors.energy_mj - sensors0.energy_mj) / 1000.0;
          info.energy_step = r.step;
          info.energy_seconds = r.seconds;
          info.sm_mhz = r.sensors.sm_mhz;
          info.power_w = r.sensors.power_mw / 1000.0;
        }
      }
      if (wanted) {
        phase("GPU sensors");
        read_values(values, s, epoch, &info, phase);
      }
      info.host_ms = std::move(host_ms);
      host_ms.clear();
      info.staging_ms = std::move(staging);
      info.epoch_seconds = seconds_since(t0);
      info.images_per_sec = seen / std::max(info.epoch_seconds, 1e-9);
      rates(info.images_per_sec, &info.tflops, &info.mfu);
      for (auto& h : hooks_) h->after_step(*this, info);
      if (s + 1 < steps && stop_here(epoch, s + 1, false)) return;
    }
    read_values(values, steps - 1, epoch, nullptr);  // the rest of the epoch's rows
    EpochInfo e;
    e.epoch = epoch, e.num_epochs = cfg_.num_epochs, e.global_step = global_step_;
    e.train_loss = values.loss / std::max(seen, 1.0);
    e.train_accuracy = values.correct / std::max(seen, 1.0);
    e.seconds = seconds_since(t0);
    e.images_per_sec = seen / std::max(e.seconds, 1e-9);
    rates(e.images_per_sec, &e.tflops, &e.mfu);
    e.lr = opt_.groups().empty() ? 0 : opt_.groups().front().lr;
    if (eval_) {
      const EvalResult r = evaluate(*eval_);
      e.eval_loss = r.loss, e.eval_accuracy = r.accuracy;
    }
    history_.push_back(e);
    for (auto& h : hooks_) h->after_epoch(*this, e);
    if (epoch + 1 < cfg_.num_epochs && stop_here(epoch + 1, 0, true)) return;
  }
  for (auto& h : hooks_) h->after_train(*this);
}

bool Trainer::stop_here(int64_t epoch, int64_t step_in_epoch, bool epoch_end) {
  if (!cfg_.stop_requested) return false;
  CAI_CHECK(cfg_.stop_check_interval >= 1, "[trainer] stop_check_interval {} must be >= 1",
            cfg_.stop_check_interval);
  // The same boundaries on every rank: they depend only on the counters.
  if (!epoch_end && global_step_ % cfg_.stop_check_interval != 0) return false;
  const double asked = plugin_->all_reduce_max(static_cast<double>(cfg_.stop_requested()));
  if (asked <= 0) return false;
  stopped_ = StopPoint{static_cast<int>(asked), epoch, step_in_epoch, global_step_};
  for (auto& h : hooks_) h->on_stop(*this, *stopped_);
  return true;
}

std::string stop_reason_name(int reason) {
  switch (reason) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGTERM:
      return "SIGTERM";
  }
  return fmt::format("signal {}", reason);
}

EvalResult Trainer::evaluate(data::DataLoader& loader) {
  loader.start_epoch(0);
  const Device device = model_.device();
  BatchPrefetcher prefetch(device);
  Tensor sums = Tensor::zeros({2}, DType::F32, device);  // loss, correct: read once at the end
  double n = 0;
  std::vector<data::Batch> cur(1), next(1);
  bool have = loader.next(next[0]);
  if (have) prefetch.stage(next);
  while (have) {
    std::swap(cur, next);
    prefetch.use();
    // As in training: on a GPU the next batch is staged before this one's launches.
    if (device.is_cuda()) {
      have = loader.next(next[0]);
      if (have) prefetch.stage(next);
    }
    const StepMetrics m = plugin_->eval_batch(model_, cur[0]);
    prefetch.done();
    if (!device.is_cuda()) {
      have = loader.next(next[0]);
      if (have) prefetch.stage(next);
    }
    if (m.sums.defined()) ops::add_(sums, m.sums.to(device));
    n += m.samples;
  }
  const auto v = sums.to_vector();
  EvalResult r;
  n = plugin_->all_reduce_sum(n);
  r.samples = static_cast<int64_t>(n);
  r.loss = plugin_->all_reduce_sum(v[0]) / std::max(n, 1.0);
  r.accuracy = plugin_->all_reduce_sum(v[1]) / std::max(n, 1.0);
  return r;
}

Booster::Booster(std::shared_ptr<Plugin> plugin)
    : plugin_(plugin ? std::move(plugin) : std::make_shared<Plugin>()) {}

std::unique_ptr<Trainer> Booster::boost(nn::ViT& model, optim::Optimizer& opt, Criterion criterion,
                                        data::DataLoader& train, data::DataLoader* eval,
                                        optim::LRScheduler* scheduler, bool schedule_by_epoch,
                                        TrainerConfig cfg) {
  auto t = std::make_unique<Trainer>(model, opt, criterion, train, eval, plugin_, cfg);
  if (scheduler) t->add_hook(std::make_shared<LRSchedulerHook>(*scheduler, schedule_by_epoch));
  return t;
}

}  // namespace cai::train
