#include "offload_lane.h"

#include <algorithm>
#include <cstring>

#include "cai/core/error.h"
#include "cai/schedule/offload.h"
#include "kernels/cpu/parallel.h"
#include "kernels/device.h"
#include "kernels/optim.h"

namespace cai::parallel::detail {

namespace {
constexpr int kSlots = schedule::kOffloadStagingSlots;  // what the plan counts
constexpr int64_t kGrain = 1 << 16;                     // elements worth a thread of the CPU pool

// dst[0, n) = src[0, n) in dst's dtype (round to nearest even, as Tensor::to), over the CPU pool.
void cast_into(void* dst, DType dt, const float* src, int64_t n) {
  kernels::cpu::parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    if (dt == DType::F32) {
      std::memcpy(static_cast<float*>(dst) + b, src + b, static_cast<size_t>(e - b) * 4);
    } else {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t k = b; k < e; ++k)
        d[k] = dt == DType::BF16 ? float_to_bf16(src[k]) : float_to_fp16(src[k]);
    }
  });
}
}  // namespace

OffloadLane::OffloadLane(Device device, int64_t max_elements)
    : device_(device), max_(std::max<int64_t>(max_elements, 1)) {
  const bool gpu = device_.is_cuda();
  if (gpu) stream_ = kernels::cuda::stream_create();
  slots_.resize(kSlots);
  for (Slot& s : slots_) {
    s.staging = gpu ? Tensor::empty_pinned({max_}, DType::F32) : Tensor::empty({max_}, DType::F32);
    if (gpu) s.copied = kernels::cuda::event_create();
  }
  // Upload staging: page-locked on a GPU; on the CPU ordinary buffers, so that the staged
  // upload's packing (stage / send_staged) runs in the tests as on a GPU, a memcpy for the copy.
  for (int k = 0; k < kSlots; ++k) {
    up_staging_.push_back(gpu ? Tensor::empty_pinned({max_}, DType::F32)
                              : Tensor::empty({max_}, DType::F32));
    if (gpu) up_done_.push_back(kernels::cuda::event_create());
  }
  up_used_.assign(kSlots, false);
  if (gpu) ordered_ = kernels::cuda::event_create();
  thread_ = std::thread([this] { worker(); });
}

OffloadLane::~OffloadLane() {
  {
    std::lock_guard<std::mutex> l(m_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (!device_.is_cuda()) return;
  try {
    for (size_t k = 0; k < up_done_.size(); ++k)
      if (up_used_[k]) kernels::cuda::event_synchronize(up_done_[k]);
  } catch (...) {
  }
  for (void* e : up_done_) kernels::cuda::event_destroy(e);
  for (Slot& s : slots_) kernels::cuda::event_destroy(s.copied);
  kernels::cuda::event_destroy(ordered_);
  kernels::cuda::stream_destroy(stream_);
}

int64_t OffloadLane::staging_bytes() const {
  int64_t b = 0;
  for (const Slot& s : slots_) b += static_cast<int64_t>(s.staging.nbytes());
  for (const Tensor& t : up_staging_) b += static_cast<int64_t>(t.nbytes());
  return b;
}

void OffloadLane::worker() {
  // The thread's CUDA calls (event waits) belong to the lane's device: a thread starts with
  // device 0 current, and a call there would create device 0's context in every process.
  if (device_.is_cuda()) kernels::cuda::set_device(device_.index);
  for (;;) {
    Task t;
    {
      std::unique_lock<std::mutex> l(m_);
      cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      t = queue_.front();
    }
    Slot& s = slots_[t.slot];
    try {
      if (device_.is_cuda()) kernels::cuda::event_synchronize(s.copied);
      const float* x = s.staging.data<float>();
      for (const Add& a : t.adds) {
        float* y = a.dst.data<float>() + a.dst_offset;
        const float* xs = x + a.src_offset;
        if (a.sq) {
          int64_t scratch = 0;
          kernels::cpu::add_with_squares(y, xs, a.n, a.assign, a.sq, a.bad ? a.bad : &scratch);
          continue;
        }
        kernels::cpu::parallel_for(a.n, kGrain, [&](int64_t b, int64_t e) {
          if (a.assign)
            std::memcpy(y + b, xs + b, static_cast<size_t>(e - b) * sizeof(float));
          else
            for (int64_t k = b; k < e; ++k) y[k] += xs[k];
        });
      }
    } catch (...) {
      std::lock_guard<std::mutex> l(m_);
      if (!error_) error_ = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> l(m_);
      queue_.pop_front();
      s.busy = false;
    }
    cv_.notify_all();
  }
}

OffloadLane::Slot& OffloadLane::acquire() {
  Slot& s = slots_[next_];
  next_ = (next_ + 1) % kSlots;
  {
    std::unique_lock<std::mutex> l(m_);
    cv_.wait(l, [&] { return !s.busy; });
  }
  s.chunk = Tensor();  // its copy is done (the host thread waited for it)
  return s;
}

void OffloadLane::push(const Tensor& chunk, std::vector<Add> adds) {
  CAI_CHECK(chunk.defined() && chunk.dtype() == DType::F32 && chunk.device() == device_ &&
                chunk.numel() <= max_,
            "[offload] gradient chunk {}: expected fp32 on {} of at most {} elements",
            chunk.defined() ? chunk.str() : "undefined", device_.str(), max_);
  for (const Add& a : adds)
    CAI_CHECK(a.dst.defined() && !a.dst.is_cuda() && a.dst.dtype() == DType::F32 && a.n >= 0 &&
                  a.dst_offset >= 0 && a.dst_offset + a.n <= a.dst.numel() && a.src_offset >= 0 &&
                  a.src_offset + a.n <= chunk.numel(),
              "[offload] add of {} elements from offset {} of {} into offset {} of {}: expected "
              "an fp32 host destination and ranges inside both",
              a.n, a.src_offset, chunk.str(), a.dst_offset,
              a.dst.defined() ? a.dst.str() : "undefined");
  Slot& s = acquire();
  const int idx = static_cast<int>(&s - slots_.data());
  const size_t bytes = chunk.nbytes();
  if (device_.is_cuda()) {
    // After what the compute stream has issued so far (the reduction's wait, the chunk's writes).
    kernels::cuda::event_record(ordered_, nullptr);
    kernels::cuda::stream_wait_event(stream_, ordered_);
    if (bytes > 0) kernels::cuda::copy_d2h_async(s.staging.raw(), chunk.raw(), bytes, stream_);
    kernels::cuda::event_record(s.copied, stream_);
    s.chunk = chunk;
  } else if (bytes > 0) {
    std::memcpy(s.staging.raw(), chunk.raw(), bytes);
  }
  ++pushed_;
  down_bytes_ += static_cast<int64_t>(bytes);
  {
    std::lock_guard<std::mutex> l(m_);
    s.busy = true;
    queue_.push_back(Task{idx, std::move(adds)});
  }
  cv_.notify_all();
}

void OffloadLane::flush() {
  {
    std::unique_lock<std::mutex> l(m_);
    cv_.wait(l, [&] { return queue_.empty(); });
  }
  for (Slot& s : slots_) s.chunk = Tensor();
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> l(m_);
    std::swap(e, error_);
  }
  if (e) std::rethrow_exception(e);
}

void OffloadLane::upload(const Tensor& src, int64_t src_offset, const Tensor& dst,
                         int64_t dst_offset, int64_t n) {
  CAI_CHECK(src.defined() && !src.is_cuda() && src.dtype() == DType::F32 && dst.defined() &&
                dst.device() == device_ && dst.dtype() != DType::I32 && n >= 0 && src_offset >= 0 &&
                src_offset + n <= src.numel() && dst_offset >= 0 && dst_offset + n <= dst.numel(),
            "[offload] upload of {} elements from offset {} of {} to offset {} of {}: expected "
            "fp32 host values, an fp32, bf16 or fp16 destination on {} and ranges inside both",
            n, src_offset, src.defined() ? src.str() : "undefined", dst_offset,
            dst.defined() ? dst.str() : "undefined", device_.str());
  const DType dt = dst.dtype();
  const size_t es = dtype_size(dt);
  const float* from = src.data<float>() + src_offset;
  auto* to = static_cast<unsigned char*>(dst.raw()) + static_cast<size_t>(dst_offset) * es;
  send_staged();
  if (!device_.is_cuda()) {
    cast_into(to, dt, from, n);
    up_bytes_ += n * static_cast<int64_t>(es);
    return;
  }
  // The copies overwrite what the compute stream may still read (the last gathers' packs).
  kernels::cuda::event_record(ordered_, nullptr);
  kernels::cuda::stream_wait_event(stream_, ordered_);
  for (int64_t off = 0; off < n; off += max_) {
    const int64_t c = std::min(max_, n - off);
    const int k = up_slot();
    cast_into(up_staging_[k].raw(), dt, from + off, c);
    kernels::cuda::copy_h2d_async(to + static_cast<size_t>(off) * es, up_staging_[k].raw(),
                                  static_cast<size_t>(c) * es, stream_);
    kernels::cuda::event_record(up_done_[k], stream_);
    kernels::cuda::stream_wait_event(nullptr, up_done_[k]);  // later compute reads after it
    up_used_[k] = true;
    up_bytes_ += c * static_cast<int64_t>(es);
  }
}


int OffloadLane::up_slot() {
  const int k = up_next_;
  up_next_ = (k + 1) % kSlots;
  if (up_used_[k] && device_.is_cuda())
    kernels::cuda::event_synchronize(up_done_[k]);  // its last copy has left
  return k;
}

void OffloadLane::begin_staged(const Tensor& dst) {
  CAI_CHECK(dst.defined() && dst.device() == device_ && dst.dtype() != DType::I32,
            "[offload] staged upload to {}: expected an fp32, bf16 or fp16 tensor on {}",
            dst.defined() ? dst.str() : "undefined", device_.str());
  end_staged();
  staged_dst_ = dst;
  if (!device_.is_cuda()) return;
  // The copies overwrite what the compute stream may still read (the last gathers' packs).
  kernels::cuda::event_record(ordered_, nullptr);
  kernels::cuda::stream_wait_event(stream_, ordered_);
}

void* OffloadLane::stage(int64_t offset, int64_t n) {
  CAI_CHECK(staged_dst_.defined() && offset >= 0 && n >= 0 && offset + n <= staged_dst_.numel(),
            "[offload] staging {} elements at offset {}: expected a range inside the staged "
            "destination {}",
            n, offset, staged_dst_.defined() ? staged_dst_.str() : "(none: begin_staged first)");
  const int64_t es = static_cast<int64_t>(dtype_size(staged_dst_.dtype()));
  const int64_t cap = max_ * 4 / es;  // elements of dst's dtype a buffer holds
  if (n > cap) {
    send_staged();
    return nullptr;
  }
  if (staged_slot_ < 0 || offset < staged_end_ || offset + n - staged_base_ > cap) {
    send_staged();
    staged_slot_ = up_slot();
    staged_base_ = staged_end_ = offset;
  }
  auto* buf = static_cast<unsigned char*>(up_staging_[staged_slot_].raw());
  if (offset > staged_end_)  // the layout's padding between chunks: zeros, not stale bytes
    std::memset(buf + (staged_end_ - staged_base_) * es, 0,
                static_cast<size_t>((offset - staged_end_) * es));
  staged_end_ = offset + n;
  return buf + (offset - staged_base_) * es;
}

void OffloadLane::send_staged() {
  if (staged_slot_ < 0) return;
  const int k = staged_slot_;
  staged_slot_ = -1;
  const int64_t es = static_cast<int64_t>(dtype_size(staged_dst_.dtype()));
  const int64_t c = staged_end_ - staged_base_;
  if (c <= 0) return;
  auto* dst = static_cast<unsigned char*>(staged_dst_.raw()) + staged_base_ * es;
  up_used_[k] = true;
  up_bytes_ += c * es;
  if (!device_.is_cuda()) {
    std::memcpy(dst, up_staging_[k].raw(), static_cast<size_t>(c * es));
    return;
  }
  kernels::cuda::copy_h2d_async(dst, up_staging_[k].raw(), static_cast<size_t>(c * es), stream_);
  kernels::cuda::event_record(up_done_[k], stream_);
  kernels::cuda::stream_wait_event(nullptr, up_done_[k]);  // later compute reads after it
}

void OffloadLane::end_staged() {
  send_staged();
  staged_dst_ = Tensor();
}

}  // namespace cai::parallel::detail
