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
#include <string_view>
#include <thread>

#include "cai/core/error.h"
#include "cai/core/kernel_profile.h"
#include "cai/core/log.h"
#include "cai/ops/ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/device.h"

namespace cai::train {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

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

void StepMetrics::add(const Tensor& losses, const Tensor& logits, const Tensor& labels) {
  if (!sums.defined()) sums = Tensor::zeros({2}, DType::F32, logits.device());
  ops::loss_metrics_(sums, losses, logits, labels);
  samples += static_cast<double>(labels.numel());
}

int64_t count_correct(const Tensor& logits, const Tensor& labels) {
  const auto l = logits.to_vector();
  const auto y = labels.to_vector();
  const int64_t b = logits.size(0), k = logits.size(1);
  int64_t correct = 0;
  for (int64_t i = 0; i < b; ++i) {
    int64_t arg = 0;
    for (int64_t j = 1; j < k; ++j)
      if (l[i * k + j] > l[i * k + arg]) arg = j;
    correct += arg == static_cast<int64_t>(y[i]);
  }
  return correct;
}

double sum_of(const Tensor& t) {
  double s = 0;
  for (float v : t.to_vector()) s += v;
  return s;
}

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

StepMetrics Plugin::forward_backward(nn::ViT& model, const std::vector<data::Batch>& batches,
                                     float weight, const Criterion& crit,
                                     const nn::ForwardCtx& step_ctx) {
  StepMetrics m;
  int64_t offset = 0;  // position of this batch's global batch within the step
  for (size_t i = 0; i < batches.size(); ++i) {
    const data::Batch& b = batches[i];
    nn::ForwardCtx ctx = step_ctx;
    ctx.sample_offset = offset + b.sample_offset;
    offset += b.global_batch_size;
    const nn::LayerHooks* hooks = train_hooks(i + 1 == batches.size());
    std::vector<std::unique_ptr<nn::Cache>> caches;
    Tensor logits = model.forward(b.images, caches, ctx, hooks);
    m.add(ops::cross_entropy_fwd(logits, b.labels, crit.label_smoothing), logits, b.labels);
    model.backward(ops::cross_entropy_bwd(logits, b.labels, crit.label_smoothing, weight), caches,
                   ctx, hooks);
  }
  return m;
}

StepMetrics Plugin::eval_batch(nn::ViT& model, const data::Batch& b) {
  std::vector<std::unique_ptr<nn::Cache>> caches;
  Tensor logits = model.forward(b.images, caches, nn::ForwardCtx{}, eval_hooks());
  StepMetrics m;
  m.add(ops::cross_entropy_fwd(logits, b.labels, 0.0f), logits, b.labels);
  return m;
}

std::vector<nn::Parameter*> optimizer_params(const optim::Optimizer& opt) {
  std::vector<nn::Parameter*> ps;
  for (const auto& g : opt.groups()) ps.insert(ps.end(), g.params.begin(), g.params.end());
  return ps;
}

std::map<std::string, Tensor> Plugin::full_model_state(nn::ViT& model) {
  std::map<std::string, Tensor> out;
  for (nn::Parameter* p : model.parameters()) {
    CAI_CHECK(p->value.defined() && !p->shard.sharded(),
              "[checkpoint] {}: the {} plugin cannot gather sharded parameter {}", name(), name(),
              p->name);
    out[p->name] = p->value.to(Device::cpu()).clone();
  }
  return out;
}

std::map<std::string, Tensor> Plugin::full_optimizer_state(nn::ViT&, optim::Optimizer& opt) {
  std::map<std::string, Tensor> out;
  for (auto& [k, v] : opt.state_dict()) out[k] = v.to(Device::cpu());
  return out;
}

void Plugin::load_optimizer_state(nn::ViT&, optim::Optimizer& opt,
                                  const std::map<std::string, Tensor>& full) {
  opt.load_state_dict(full);
}

std::vector<OwnedSlice> Plugin::owned_state(nn::ViT& model, optim::Optimizer& opt) {
  std::vector<OwnedSlice> out;
  auto whole = [&out](const std::string& name, bool optimizer, const Tensor& v) {
    Tensor c = v.to(Device::cpu());
    if (c.dtype() != DType::F32) c = c.to(DType::F32);
    out.push_back(OwnedSlice{name, optimizer, nn::ShardSpec{}, c.shape(), 0, c.numel(),
                             c.reshape({c.numel()}).clone()});
  };
  for (nn::Parameter* p : model.parameters()) {
    CAI_CHECK(p->value.defined() && !p->shard.sharded(),
              "[checkpoint] {}: the {} plugin cannot save sharded parameter {}", name(), name(),
              p->name);
    whole(p->name, false, p->value);
  }
  for (const auto& [k, v] : opt.state_dict()) whole(k, true, v);
  return out;
}

Tensor Plugin::clip_grad_norm(optim::Optimizer& opt, double max_norm) {
  // The factor applied by opt's next step (optimizer_step follows) where it can be.
  return optim::clip_grad_norm_async(optimizer_params(opt), max_norm, nullptr, nullptr, nullptr,
                                     &opt);
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
void Trainer::read_values(StepValues& v, int64_t upto, int64_t epoch, StepInfo* info) {
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
  if (!info) return;
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
      if (wanted) read_values(values, s, epoch, &info);
      phase("read values");
      info.host_ms = std::move(host_ms);
      host_ms.clear();
      info.staging_ms = std::move(staging);
      info.epoch_seconds = seconds_since(t0);
      info.images_per_sec = seen / std::max(info.epoch_seconds, 1e-9);
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

// --- hooks ------------------------------------------------------------------------------------

void LRSchedulerHook::after_step(Trainer&, const StepInfo&) {
  if (!by_epoch_) s_.step();
}
void LRSchedulerHook::after_epoch(Trainer&, const EpochInfo&) {
  if (by_epoch_) s_.step();
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
  return fmt::format("{}:{:02}", s / 60, s % 60);
}

ProgressHook::ProgressHook(bool terminal, int64_t interval)
    : terminal_(terminal), interval_(interval) {}

int64_t ProgressHook::every(const StepInfo& s) const {
  if (interval_ > 0) return interval_;
  return std::max<int64_t>(1, s.steps_per_epoch / (terminal_ ? 50 : 10));
}

bool ProgressHook::needs_values(const Trainer&, const StepInfo& s) const {
  return s.step_in_epoch % every(s) == 0 || s.step_in_epoch == s.steps_per_epoch;
}

void ProgressHook::after_step(Trainer& t, const StepInfo& s) {
  if (t.plugin().rank() != 0) return;
  if (s.has_values) loss_ = s.loss, accuracy_ = s.accuracy;
  const double eta =
      s.epoch_seconds / s.step_in_epoch * static_cast<double>(s.steps_per_epoch - s.step_in_epoch);
  auto value = [](double v, int digits) {
    return std::isnan(v) ? std::string("-") : fmt::format("{:.{}f}", v, digits);
  };
  const std::string stats =
      fmt::format("{:>4}/{}  {:.0f} img/s  loss {}  acc {}  lr {:.2e}  ETA {}", s.step_in_epoch,
                  s.steps_per_epoch, s.images_per_sec, value(loss_, 4), value(accuracy_, 3), s.lr,
                  format_duration(eta));
  if (terminal_) {
    const bool last = s.step_in_epoch == s.steps_per_epoch;
    if (!last && s.epoch_seconds - last_draw_ < 0.1) return;
    last_draw_ = last ? -1 : s.epoch_seconds;
    const int width = 24;
    const int filled = static_cast<int>(width * s.step_in_epoch / s.steps_per_epoch);
    std::string bar;
    for (int i = 0; i < width; ++i) bar += i < filled ? "█" : "░";
    std::fprintf(stdout, "\r\033[2Kepoch %lld/%lld |%s| %s", static_cast<long long>(s.epoch + 1),
                 static_cast<long long>(s.num_epochs), bar.c_str(), stats.c_str());
    if (last) std::fprintf(stdout, "\n");
    std::fflush(stdout);
  } else if (s.has_values && needs_values(t, s)) {
    log::info("epoch {}/{} step {}", s.epoch + 1, s.num_epochs, stats);
  }
}

KernelProfileHook::KernelProfileHook(std::string path, int64_t start, int64_t steps,
                                     std::string title)
    : path_(std::move(path)), title_(std::move(title)), start_(start), steps_(steps) {
  CAI_CHECK(start_ >= 0 && steps_ >= 1,
            "[profile] kernel profile of steps ({}, {}]: expected a "
            "start >= 0 and at least 1 step",
            start_, start_ + steps_);
}

void KernelProfileHook::after_step(Trainer& t, const StepInfo& s) {
  if (t.plugin().rank() != 0) return;
  const bool cuda = t.model().device().is_cuda();
  if (!running_ && s.global_step == start_) {
    CAI_CHECK(cuda, "[profile] train.kernel_profile needs train.device = \"cuda\"");
    const auto began = Clock::now();
    kernels::cuda::synchronize();
    profile::kernel_profile_start();
    start_ms_ = 1e3 * std::chrono::duration<double>(Clock::now() - began).count();
    running_ = true;
    t0_ = seconds_since(Clock::time_point{});
    host_ms_.clear();
    staging_ms_.clear();
    return;
  }
  if (!running_) return;
  // Host phases of the profiled steps. A step's "hooks" are the hooks after the step before it:
  // the first profiled step's include this hook's start (a device synchronisation and CUPTI's
  // start), which is taken out.
  // Each phase's time in each profiled step (a table row per phase, a column per step).
  const auto step = static_cast<size_t>(s.global_step - start_ - 1);
  auto add = [&](Phases& rows, const char* name, double ms) {
    auto it = std::find_if(rows.begin(), rows.end(),
                           [&](const auto& e) { return std::string_view(e.first) == name; });
    if (it == rows.end()) it = rows.insert(rows.end(), {name, std::vector<double>(steps_, 0.0)});
    it->second[step] += ms;
  };
  for (auto [name, ms] : s.host_ms) {
    if (step == 0 && std::string_view(name) == "hooks") ms = std::max(0.0, ms - start_ms_);
    add(host_ms_, name, ms);
  }
  for (const auto& [name, ms] : s.staging_ms) add(staging_ms_, name, ms);
  if (s.global_step == start_ + steps_) {
    kernels::cuda::synchronize();
    const double wall = seconds_since(Clock::time_point{}) - t0_;
    running_ = false;
    auto table = [&](const Phases& rows, const char* what) {
      std::string t = fmt::format("| {} |", what), rule = "| --- |";
      for (int64_t k = 1; k <= steps_; ++k) t += fmt::format(" step {} |", k), rule += " ---: |";
      t += " mean |\n" + rule + " ---: |\n";
      for (const auto& [name, ms] : rows) {
        t += fmt::format("| {} |", name);
        double sum = 0;
        for (double v : ms) t += fmt::format(" {:.2f} |", v), sum += v;
        t += fmt::format(" {:.2f} |\n", sum / static_cast<double>(steps_));
      }
      return t + "\n";
    };
    std::string host =
        "## Host time per step by trainer phase (rank 0, ms)\n\n" + table(host_ms_, "phase");
    if (!staging_ms_.empty())
      host +=
          "## Batch staging per step (rank 0, ms): the staging thread's parts overlap the step "
          "before; the trainer thread's are in \"wait for the batch\"\n\n" +
          table(staging_ms_, "part");
    profile::write_kernel_profile(path_, profile::kernel_profile_stop(), static_cast<int>(steps_),
                                  1e3 * wall / steps_, title_, host);
    log::info("[profile] kernel profile of steps {}-{} in {}", start_ + 1, start_ + steps_, path_);
  }
}

void KernelProfileHook::after_train(Trainer&) {
  if (!running_) return;
  running_ = false;
  profile::kernel_profile_stop();
  log::warn("[profile] training ended before step {}: no kernel profile written to {}",
            start_ + steps_, path_);
}

bool stdout_is_terminal() {
  if (const char* v = std::getenv("CAI_STDOUT_TTY"); v && *v) return std::string(v) == "1";
  return isatty(STDOUT_FILENO) != 0;
}

void ProgressHook::after_epoch(Trainer&, const EpochInfo&) {
  last_draw_ = -1;
  loss_ = accuracy_ = NAN;
}

void LogMetricByEpochHook::after_epoch(Trainer& t, const EpochInfo& e) {
  if (t.plugin().rank() != 0) return;
  std::string eval = e.eval_accuracy >= 0 ? fmt::format("  test loss {:.4f}  test acc {:.2f}%",
                                                        e.eval_loss, 100 * e.eval_accuracy)
                                          : std::string();
  log::info(
      "epoch {}/{} done: train loss {:.4f}  train acc {:.2f}%{}  {} ({:.0f} img/s)  lr {:.2e}",
      e.epoch + 1, e.num_epochs, e.train_loss, 100 * e.train_accuracy, eval,
      format_duration(e.seconds), e.images_per_sec, e.lr);
}

MetricsFileHook::MetricsFileHook(std::string path, int64_t interval)
    : path_(std::move(path)), interval_(interval) {}

void MetricsFileHook::write(const std::string& line) {
  std::ofstream f(path_, std::ios::app);
  CAI_CHECK(f.good(), "[metrics] cannot write {}", path_);
  f << line << "\n";
}

void MetricsFileHook::before_train(Trainer& t) {
  if (t.plugin().rank() != 0) return;
  if (const Trainer::ResumePoint* r = t.resumed()) {
    // The run this one continues wrote the records before it: they stay.
    nlohmann::json j = {{"type", "resume"},
                        {"epoch", r->epoch + 1},
                        {"step_in_epoch", r->step_in_epoch},
                        {"step", r->global_step}};
    if (!r->from.empty()) j["checkpoint"] = r->from;
    write(j.dump());
    return;
  }
  std::ofstream f(path_, std::ios::trunc);
  CAI_CHECK(f.good(), "[metrics] cannot create {}", path_);
}

bool MetricsFileHook::needs_values(const Trainer&, const StepInfo& s) const {
  return interval_ > 0 && s.global_step % interval_ == 0;
}

void MetricsFileHook::after_step(Trainer& t, const StepInfo& s) {
  if (t.plugin().rank() != 0 || !s.has_values || !needs_values(t, s)) return;
  nlohmann::json j = {{"type", "step"},
                      {"epoch", s.epoch + 1},
                      {"step", s.global_step},
                      {"loss", s.loss},
                      {"accuracy", s.accuracy},
                      {"lr", s.lr},
                      {"img_per_s", s.images_per_sec},
                      {"seconds", s.epoch_seconds}};
  if (s.grad_norm > 0) j["grad_norm"] = s.grad_norm;
  write(j.dump());
}

void MetricsFileHook::on_stop(Trainer& t, const StopPoint& p) {
  if (t.plugin().rank() != 0) return;
  // Where the run stopped and why; the resumed run's "resume" record follows it.
  nlohmann::json j = {{"type", "preempted"},
                      {"epoch", p.epoch + 1},
                      {"step_in_epoch", p.step_in_epoch},
                      {"step", p.global_step},
                      {"signal", stop_reason_name(p.reason)}};
  write(j.dump());
}

void MetricsFileHook::after_epoch(Trainer& t, const EpochInfo& e) {
  if (t.plugin().rank() != 0) return;
  nlohmann::json j = {{"type", "epoch"},
                      {"epoch", e.epoch + 1},
                      {"step", e.global_step},
                      {"train_loss", e.train_loss},
                      {"train_accuracy", e.train_accuracy},
                      {"seconds", e.seconds},
                      {"img_per_s", e.images_per_sec},
                      {"lr", e.lr}};
  if (e.eval_accuracy >= 0) j["test_loss"] = e.eval_loss, j["test_accuracy"] = e.eval_accuracy;
  write(j.dump());
}

}  // namespace cai::train
