#include "cai/core/tensor.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "cai/core/error.h"
#include "kernels/base/dtype.h"
#include "kernels/cpu/parallel.h"
#include "kernels/device.h"
#include "kernels/elementwise.h"

namespace cai {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
    case DType::I32:
      return 4;
    case DType::BF16:
    case DType::F16:
      return 2;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "fp32";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "fp16";
    case DType::I32:
      return "int32";
  }
  return "?";
}

DType dtype_from_name(const std::string& n) {
  if (n == "fp32" || n == "float32") return DType::F32;
  if (n == "bf16" || n == "bfloat16") return DType::BF16;
  if (n == "fp16" || n == "float16") return DType::F16;
  if (n == "int32") return DType::I32;
  fail("[dtype] unknown dtype '{}': expected fp32, bf16, fp16 or int32", n);
}

std::string Device::str() const {
  return is_cuda() ? fmt::format("cuda:{}", index) : "cpu";
}

std::string shape_str(const Shape& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    CAI_CHECK(d >= 0, "[tensor] negative dimension {} in shape {}", d, shape_str(s));
    n *= d;
  }
  return n;
}

namespace {
// Bytes held by live Storage objects, per device type: what traces plot as memory in use.
std::atomic<int64_t> live_bytes[2];
std::atomic<int64_t> peak_bytes[2];
}  // namespace

int64_t memory_in_use(DeviceType t) {
  return live_bytes[static_cast<int>(t)].load();
}
int64_t peak_memory(DeviceType t) {
  return peak_bytes[static_cast<int>(t)].load();
}
void reset_peak_memory(DeviceType t) {
  peak_bytes[static_cast<int>(t)].store(live_bytes[static_cast<int>(t)].load());
}

Storage::Storage(size_t bytes, Device dev, bool pinned, bool zeroed)
    : bytes_(bytes), device_(dev), pinned_(pinned) {
  CAI_CHECK(!pinned || !dev.is_cuda(), "[tensor] pinned memory is host memory, not {}", dev.str());
  CAI_CHECK(!zeroed || (!pinned && !dev.is_cuda()),
            "[tensor] zeroed storage is pageable host memory, not {}{}", pinned ? "pinned " : "",
            dev.str());
  data_ = dev.is_cuda() ? kernels::cuda::alloc(bytes, dev.index)
          : pinned      ? kernels::cuda::alloc_pinned(std::max<size_t>(bytes, 1))
                        : kernels::cpu::alloc(bytes, zeroed);
  const int d = static_cast<int>(dev.type);
  const int64_t now = live_bytes[d].fetch_add(static_cast<int64_t>(bytes)) + bytes;
  int64_t peak = peak_bytes[d].load();
  while (now > peak && !peak_bytes[d].compare_exchange_weak(peak, now)) {
  }
}

Storage::~Storage() {
  live_bytes[static_cast<int>(device_.type)].fetch_sub(static_cast<int64_t>(bytes_));
  if (device_.is_cuda())
    kernels::cuda::free(data_, device_.index);
  else if (pinned_)
    kernels::cuda::free_pinned(data_);
  else
    kernels::cpu::free(data_);
}

Tensor Tensor::make(const Shape& shape, DType dtype, Device dev, bool pinned, bool zeroed) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  t.device_ = dev;
  t.storage_ = std::make_shared<Storage>(t.nbytes(), dev, pinned, zeroed);
  t.defined_ = true;
  return t;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device dev) {
  return make(shape, dtype, dev, false, false);
}

Tensor Tensor::empty_pinned(const Shape& shape, DType dtype) {
  return make(shape, dtype, Device::cpu(), true, false);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device dev) {
  // On the host from zeroed memory, without a pass over it (a model's parameters and gradients
  // are allocated as zeros and most of them then drawn or copied over).
  if (!dev.is_cuda()) return make(shape, dtype, dev, false, true);
  Tensor t = empty(shape, dtype, dev);
  t.zero_();
  return t;
}

Tensor Tensor::full(const Shape& shape, float value, Device dev) {
  Tensor t = empty(shape, DType::F32, dev);
  // Filled where it lives: on a GPU by a kernel, not on the host and copied (a pageable copy of
  // a [8, 512, 4096] gradient took longer than the GEMMs that read it).
  if (dev.is_cuda()) {
    kernels::cuda::fill(value, t.data<float>(), t.numel());
  } else {
    kernels::cpu::fill(value, t.data<float>(), t.numel());
  }
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& v, const Shape& shape, Device dev) {
  CAI_CHECK(static_cast<int64_t>(v.size()) == shape_numel(shape),
            "[tensor] {} values do not fill shape {}", v.size(), shape_str(shape));
  Tensor t = empty(shape, DType::F32, Device::cpu());
  std::memcpy(t.raw(), v.data(), t.nbytes());
  return t.to(dev);
}

Tensor Tensor::from_vector(const std::vector<int32_t>& v, const Shape& shape, Device dev) {
  CAI_CHECK(static_cast<int64_t>(v.size()) == shape_numel(shape),
            "[tensor] {} values do not fill shape {}", v.size(), shape_str(shape));
  Tensor t = empty(shape, DType::I32, Device::cpu());
  std::memcpy(t.raw(), v.data(), t.nbytes());
  return t.to(dev);
}

Shape Tensor::strides() const {
  Shape s(shape_.size());
  int64_t acc = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    s[i] = acc;
    acc *= shape_[i];
  }
  return s;
}

int64_t Tensor::size(int64_t d) const {
  const int64_t nd = dim();
  if (d < 0) d += nd;
  CAI_CHECK(d >= 0 && d < nd, "[tensor] dimension {} out of range for {}", d, str());
  return shape_[d];
}

void* Tensor::raw() const {
  CAI_CHECK(defined_, "[tensor] use of an undefined tensor");
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->data()) + offset_ * dtype_size(dtype_);
}

template <typename T>
T* Tensor::data() const {
  constexpr DType want = std::is_same_v<T, float>     ? DType::F32
                         : std::is_same_v<T, int32_t> ? DType::I32
                                                      : DType::BF16;
  if constexpr (std::is_same_v<T, uint16_t>) {
    CAI_CHECK(dtype_ == DType::BF16 || dtype_ == DType::F16,
              "[tensor] 16-bit access to a {} tensor", dtype_name(dtype_));
  } else {
    CAI_CHECK(dtype_ == want, "[tensor] {} access to a {} tensor", dtype_name(want),
              dtype_name(dtype_));
  }
  return static_cast<T*>(raw());
}
template float* Tensor::data<float>() const;
template int32_t* Tensor::data<int32_t>() const;
template uint16_t* Tensor::data<uint16_t>() const;

Tensor Tensor::reshape(const Shape& shape) const {
  Shape s = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      CAI_CHECK(infer < 0, "[reshape] more than one -1 in {}", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    CAI_CHECK(known > 0 && numel_ % known == 0, "[reshape] cannot reshape {} into {}", str(),
              shape_str(shape));
    s[infer] = numel_ / known;
  }
  CAI_CHECK(shape_numel(s) == numel_, "[reshape] cannot reshape {} ({} elements) into {}", str(),
            numel_, shape_str(shape));
  Tensor t = *this;
  t.shape_ = s;
  return t;
}

Tensor Tensor::narrow(int64_t start, int64_t length) const {
  CAI_CHECK(dim() >= 1, "[narrow] needs at least one dimension, got {}", str());
  CAI_CHECK(start >= 0 && length >= 0 && start + length <= shape_[0],
            "[narrow] rows [{}, {}) out of range for {}", start, start + length, str());
  Tensor t = *this;
  t.shape_[0] = length;
  t.numel_ = shape_numel(t.shape_);
  t.offset_ = offset_ + start * (shape_[0] ? numel_ / shape_[0] : 0);
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  CAI_CHECK(src.shape_ == shape_ && src.dtype_ == dtype_,
            "[copy] source {} does not match destination {}", src.str(), str());
  if (nbytes() == 0) return;
  if (!is_cuda() && !src.is_cuda()) {
    // Over the CPU pool in 1 MiB pieces (ZeRO-Offload's setup copies a model's values into
    // fresh host shards: the copy and its first-touch faults spread over the cores).
    auto* d = static_cast<unsigned char*>(raw());
    const auto* s = static_cast<const unsigned char*>(src.raw());
    constexpr int64_t kPiece = int64_t{1} << 20;
    const int64_t bytes = static_cast<int64_t>(nbytes());
    kernels::cpu::parallel_for((bytes + kPiece - 1) / kPiece, 8, [&](int64_t b, int64_t e) {
      const int64_t lo = b * kPiece, hi = std::min(bytes, e * kPiece);
      std::memcpy(d + lo, s + lo, static_cast<size_t>(hi - lo));
    });
  } else if (is_cuda() && src.is_cuda())
    kernels::cuda::copy_d2d(raw(), src.raw(), nbytes());
  else if (is_cuda())
    kernels::cuda::copy_h2d(raw(), src.raw(), nbytes());
  else
    kernels::cuda::copy_d2h(raw(), src.raw(), nbytes());
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device_);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(Device dev) const {
  if (dev == device_) return *this;
  Tensor t = empty(shape_, dtype_, dev);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return *this;
  Tensor t = empty(shape_, dtype, device_);
  if (is_cuda()) {
    CAI_CHECK(dtype != DType::I32 && dtype_ != DType::I32,
              "[to] int32 conversion of a CUDA tensor is not supported ({} to {})", str(),
              dtype_name(dtype));
    auto kt = [](DType d) {
      return d == DType::F32    ? kernels::DT::F32
             : d == DType::BF16 ? kernels::DT::BF16
                                : kernels::DT::F16;
    };
    kernels::cuda::cast(kt(dtype_), raw(), kt(dtype), t.raw(), numel_);
    return t;
  }
  const std::vector<float> v = to_vector();
  if (dtype == DType::F32) {
    std::memcpy(t.raw(), v.data(), t.nbytes());
  } else if (dtype == DType::BF16 || dtype == DType::F16) {
    uint16_t* p = t.data<uint16_t>();
    for (int64_t i = 0; i < numel_; ++i)
      p[i] = dtype == DType::BF16 ? float_to_bf16(v[i]) : float_to_fp16(v[i]);
  } else {
    int32_t* p = t.data<int32_t>();
    for (int64_t i = 0; i < numel_; ++i) p[i] = static_cast<int32_t>(v[i]);
  }
  return t;
}

void Tensor::zero_() {
  if (nbytes() == 0) return;
  if (is_cuda()) {
    kernels::cuda::memset_zero(raw(), nbytes());
    return;
  }
  // Over the CPU pool in 1 MiB blocks (ZeRO-Offload zeroes a host gradient shard of gigabytes
  // every step; one thread's memset took seconds).
  auto* p = static_cast<unsigned char*>(raw());
  const int64_t n = static_cast<int64_t>(nbytes());
  constexpr int64_t kBlock = int64_t{1} << 20;
  kernels::cpu::parallel_for((n + kBlock - 1) / kBlock, 4, [&](int64_t b, int64_t e) {
    const int64_t from = b * kBlock, to = std::min(n, e * kBlock);
    std::memset(p + from, 0, static_cast<size_t>(to - from));
  });
}

void zero_all(const std::vector<Tensor*>& ts) {
  void* ptrs[kernels::cuda::kZeroMulti];
  int64_t bytes[kernels::cuda::kZeroMulti];
  int count = 0;
  auto flush = [&] {
    // On the current device's legacy default stream, as zero_()'s cudaMemset.
    if (count > 0) kernels::cuda::zero_multi(count, ptrs, bytes, nullptr);
    count = 0;
  };
  for (Tensor* t : ts) {
    if (!t->is_cuda()) {
      t->zero_();
      continue;
    }
    if (t->nbytes() == 0) continue;
    if (count == kernels::cuda::kZeroMulti) flush();
    ptrs[count] = t->raw();
    bytes[count] = static_cast<int64_t>(t->nbytes());
    ++count;
  }
  flush();
}

std::vector<float> Tensor::to_vector() const {
  const Tensor h = to(Device::cpu());
  std::vector<float> v(numel_);
  switch (dtype_) {
    case DType::F32:
      if (numel_) std::memcpy(v.data(), h.raw(), nbytes());
      break;
    case DType::I32:
      for (int64_t i = 0; i < numel_; ++i) v[i] = static_cast<float>(h.data<int32_t>()[i]);
      break;
    case DType::BF16:
      for (int64_t i = 0; i < numel_; ++i) v[i] = bf16_to_float(h.data<uint16_t>()[i]);
      break;
    case DType::F16:
      for (int64_t i = 0; i < numel_; ++i) v[i] = fp16_to_float(h.data<uint16_t>()[i]);
      break;
  }
  return v;
}

float Tensor::item() const {
  CAI_CHECK(numel_ == 1, "[item] needs a 1-element tensor, got {}", str());
  return to_vector()[0];
}

std::string Tensor::str() const {
  if (!defined_) return "Tensor(undefined)";
  return fmt::format("Tensor{} {} {}", shape_str(shape_), dtype_name(dtype_), device_.str());
}

uint16_t float_to_bf16(float f) {
  return kernels::bf16_bits(f);
}

float bf16_to_float(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (ax < 0x38800000u) {                                               // subnormal or zero in fp16
    float af;
    std::memcpy(&af, &ax, 4);
    const float scaled = af * 16777216.0f;  // 2^24: fp16 subnormal unit is 2^-24
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
  }
  uint32_t e = ((ax >> 23) - 112) << 10;
  uint32_t m = ax & 0x7fffffu;
  uint32_t h = e | (m >> 13);
  const uint32_t rest = m & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float fp16_to_float(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  float f;
  if (e == 0) {
    f = std::ldexp(static_cast<float>(m), -24);
  } else if (e == 31) {
    f = m ? NAN : INFINITY;
  } else {
    f = std::ldexp(static_cast<float>(m | 0x400u), static_cast<int>(e) - 25);
  }
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u |= sign;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace cai
