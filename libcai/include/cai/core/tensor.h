// Tensor: shape, contiguous row-major strides, dtype (fp32/bf16/fp16), device (CPU or CUDA) and
// reference-counted storage. Copies of a Tensor share storage (like torch.Tensor); clone() copies.
// Views (reshape, narrow along dim 0) share storage and keep the element offset.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cai {

enum class DType { F32, BF16, F16, I32 };
size_t dtype_size(DType t);
const char* dtype_name(DType t);
DType dtype_from_name(const std::string& name);  // "fp32"|"float32", "bf16", "fp16", "int32"

enum class DeviceType { CPU, CUDA };
struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  static Device cpu() { return {}; }
  static Device cuda(int i = 0) { return {DeviceType::CUDA, i}; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device&) const = default;
  std::string str() const;
};

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

// Owns one allocation on one device; freed when the last Tensor referring to it goes.
class Storage {
 public:
  // pinned: page-locked host memory (dev must be the CPU; needs a CUDA build and driver), for
  // asynchronous copies to and from GPUs.
  // zeroed (host memory, not pinned): reads as zeros, without a pass over it (kernels::cpu::alloc).
  Storage(size_t bytes, Device dev, bool pinned = false, bool zeroed = false);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  bool pinned() const { return pinned_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  bool pinned_ = false;
};

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device dev = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device dev = Device::cpu());
  // A host tensor in page-locked memory (kernels::cuda::alloc_pinned): asynchronous copies to and
  // from GPUs run on the copy engines while the host goes on. Needs a CUDA build and driver.
  static Tensor empty_pinned(const Shape& shape, DType dtype = DType::F32);
  static Tensor full(const Shape& shape, float value, Device dev = Device::cpu());
  static Tensor from_vector(const std::vector<float>& v, const Shape& shape,
                            Device dev = Device::cpu());
  static Tensor from_vector(const std::vector<int32_t>& v, const Shape& shape,
                            Device dev = Device::cpu());

  bool defined() const { return defined_; }
  const Shape& shape() const { return shape_; }
  Shape strides() const;  // contiguous row-major, in elements
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool is_cuda() const { return device_.is_cuda(); }

  // Typed pointer to the first element. Checks that T matches the dtype.
  template <typename T>
  T* data() const;
  void* raw() const;

  Tensor reshape(const Shape& shape) const;  // view; one -1 allowed
  Tensor narrow(int64_t start,
                int64_t length) const;  // view of rows [start, start+length) of dim 0
  Tensor clone() const;
  Tensor to(Device dev) const;   // copy unless already there
  Tensor to(DType dtype) const;  // fp32/bf16/fp16 conversion (round to nearest even) on
                                 // the tensor's device; int32 on the CPU; copy unless same
  void zero_();
  void copy_from(const Tensor& src);     // same shape and dtype, any devices
  std::vector<float> to_vector() const;  // fp32 values on the host (converting from bf16/fp16)
  float item() const;                    // the single value of a 1-element tensor

  std::string str() const;  // "Tensor[2, 3] fp32 cpu"

 private:
  // A new tensor over new storage (Storage's pinned and zeroed).
  static Tensor make(const Shape& shape, DType dtype, Device dev, bool pinned, bool zeroed);
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::F32;
  Device device_;
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // in elements
  bool defined_ = false;
};

// t->zero_() for every tensor of ts; the CUDA ones in launches of up to 64 tensors (a model's
// gradients: one launch instead of a memset each), ordered as zero_() is.
void zero_all(const std::vector<Tensor*>& ts);

// Bytes held by all live tensors' storage on a device type in this process (an accounting of
// the process's allocations, for traces and memory reports), and the peak since the last reset.
int64_t memory_in_use(DeviceType t = DeviceType::CPU);
int64_t peak_memory(DeviceType t = DeviceType::CPU);
void reset_peak_memory(DeviceType t = DeviceType::CPU);

// Half-precision conversions (round to nearest even), used by Tensor::to(DType) on the host.
uint16_t float_to_bf16(float f);
float bf16_to_float(uint16_t h);
uint16_t float_to_fp16(float f);
float fp16_to_float(uint16_t h);

}  // namespace cai
