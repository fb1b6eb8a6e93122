#include <algorithm>
#include <cstring>
#include <mutex>
#include <sstream>
#include <vector>

#include "kernels/base/block_pool.h"
#include "kernels/cuda/check.h"
#include "kernels/device.h"

namespace cai::kernels::cuda {

RuntimeInfo runtime_info() {
  RuntimeInfo r;
  r.compiled = true;
  r.compiled_version = CUDART_VERSION;
  cudaRuntimeGetVersion(&r.runtime_version);
  cudaDriverGetVersion(&r.driver_version);
  int major = 0, minor = 0, patch = 0;
  if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS)
    r.cublas_version = major * 10000 + minor * 100 + patch;
  ncclGetVersion(&r.nccl_version);
#ifdef CAI_HAVE_SM90A
  r.hopper_attention = true;
#endif
  std::istringstream archs(CAI_CUDA_ARCHS);
  for (std::string a; std::getline(archs, a, ';');)
    if (!a.empty()) r.architectures.push_back(std::stoi(a));
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    r.device_error = cudaGetErrorString(e);
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return r;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    r.devices.push_back(
        DeviceInfo{i, p.name, p.major, p.minor, p.totalGlobalMem, p.multiProcessorCount});
  }
  return r;
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

namespace {
// Caching allocator: freed blocks stay in a per-device pool (kernels/base/block_pool.h) and are
// reused, so a training step does not call cudaMalloc/cudaFree. Near the GPU's capacity, when
// cudaMalloc fails, the pool hands its cached blocks back to the driver and retries (a flush,
// counted: AllocatorStats::flushes; each synchronises the device).
// The pool is a process-wide resource of the device (like the driver's own), not job state.
struct Pool {
  std::mutex m;
  int device = 0;
  BlockPool blocks{[this](size_t n) -> void* {
                     CAI_CUDA_CHECK(cudaSetDevice(device));
                     void* p = nullptr;
                     if (cudaMalloc(&p, n) == cudaSuccess) return p;
                     cudaGetLastError();  // the failure is answered by the pool
                     return nullptr;
                   },
                   [this](void* p) {
                     cudaSetDevice(device);
                     cudaFree(p);
                   }};
};
constexpr int kMaxDevices = 64;
Pool& pool(int device) {
  static Pool pools[kMaxDevices];
  static const bool named = [] {  // once, before any pool is handed out
    for (int i = 0; i < kMaxDevices; ++i) pools[i].device = i;
    return true;
  }();
  (void)named;
  if (device < 0 || device >= kMaxDevices)
    fail("[cuda] device index {} outside [0, {})", device, kMaxDevices);
  return pools[device];
}
}  // namespace

void* alloc(size_t bytes, int device) {
  if (bytes == 0) return nullptr;
  Pool& p = pool(device);
  std::lock_guard<std::mutex> l(p.m);
  void* ptr = p.blocks.alloc(bytes);
  if (!ptr) {
    size_t free_b = 0, total = 0;
    cudaMemGetInfo(&free_b, &total);
    cudaGetLastError();
    const BlockPool::Stats& st = p.blocks.stats();
    throw CudaError(fmt::format(
        "[cuda] out of memory on device {}: {} bytes requested ({} rounded) with {} in use by "
        "tensors and nothing cached; the driver reports {} of {} bytes free",
        device, bytes, BlockPool::round_size(bytes), st.in_use, free_b, total));
  }
  return ptr;
}

void free(void* ptr, int device) {
  if (!ptr) return;
  Pool& p = pool(device);
  std::lock_guard<std::mutex> l(p.m);
  p.blocks.free(ptr);  // not ours: ignored (never throw from a destructor path)
}

AllocatorStats allocator_stats(int device) {
  Pool& p = pool(device);
  std::lock_guard<std::mutex> l(p.m);
  const BlockPool::Stats& st = p.blocks.stats();
  return AllocatorStats{st.in_use, st.cached, st.peak, st.flushes};
}

void reset_peak(int device) {
  Pool& p = pool(device);
  std::lock_guard<std::mutex> l(p.m);
  p.blocks.reset_peak();
}

void empty_cache(int device) {
  Pool& p = pool(device);
  std::lock_guard<std::mutex> l(p.m);
  p.blocks.release_cached();
}
void copy_h2d(void* dst, const void* src, size_t bytes) {
  CAI_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}
void copy_d2h(void* dst, const void* src, size_t bytes) {
  CAI_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
void copy_d2d(void* dst, const void* src, size_t bytes) {
  CAI_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
}
void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width_bytes,
             size_t height) {
  if (width_bytes == 0 || height == 0) return;
  // cudaMemcpy2D refuses pitches above cudaDevAttrMaxPitch (2^31 - 1 bytes): one copy per row
  // then.
  constexpr size_t kMaxPitch = (size_t{1} << 31) - 1;
  if (height == 1 || dst_pitch > kMaxPitch || src_pitch > kMaxPitch) {
    for (size_t r = 0; r < height; ++r)
      CAI_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + r * dst_pitch,
                                     static_cast<const char*>(src) + r * src_pitch, width_bytes,
                                     cudaMemcpyDeviceToDevice, 0));
    return;
  }
  CAI_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width_bytes, height,
                                   cudaMemcpyDeviceToDevice, 0));
}
void memset_zero(void* p, size_t bytes) {
  CAI_CUDA_CHECK(cudaMemset(p, 0, bytes));
}
void synchronize() {
  CAI_CUDA_CHECK(cudaDeviceSynchronize());
}

void* alloc_pinned(size_t bytes) {
  void* p = nullptr;
  CAI_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
  return p;
}
void free_pinned(void* p) {
  if (p) cudaFreeHost(p);
}
void* stream_create() {
  cudaStream_t s = nullptr;
  CAI_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}
void stream_destroy(void* stream) {
  if (stream) cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}
void* event_create() {
  cudaEvent_t e = nullptr;
  CAI_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}
void event_destroy(void* event) {
  if (event) cudaEventDestroy(static_cast<cudaEvent_t>(event));
}
void event_record(void* event, void* stream) {
  CAI_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event),
                                 stream ? static_cast<cudaStream_t>(stream) : cudaStreamLegacy));
}
void stream_wait_event(void* stream, void* event) {
  CAI_CUDA_CHECK(cudaStreamWaitEvent(stream ? static_cast<cudaStream_t>(stream) : cudaStreamLegacy,
                                     static_cast<cudaEvent_t>(event), 0));
}
void event_synchronize(void* event) {
  CAI_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
}
bool event_query(void* event) {
  const cudaError_t r = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (r == cudaErrorNotReady) return false;
  CAI_CUDA_CHECK(r);
  return true;
}
void* event_create_timed() {
  cudaEvent_t e = nullptr;
  CAI_CUDA_CHECK(cudaEventCreate(&e));
  return e;
}
float event_elapsed_ms(void* start, void* end) {
  float ms = 0;
  CAI_CUDA_CHECK(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)));
  return ms;
}
void copy_h2d_async(void* dst, const void* src, size_t bytes, void* stream) {
  CAI_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice,
                                 stream ? static_cast<cudaStream_t>(stream) : cudaStreamLegacy));
}
namespace {
// upload_async's page-locked blocks, per device, for the life of the process (never freed: a
// static destructor would run after the driver has gone).
struct StagingBlock {
  void* host = nullptr;
  size_t capacity = 0;
  cudaEvent_t copied = nullptr;  // recorded after the last copy out of the block
  int device = -1;
};
struct StagingPool {
  std::mutex m;
  std::vector<StagingBlock> blocks;
};
StagingPool& staging_pool() {
  static auto* pool = new StagingPool;
  return *pool;
}
constexpr size_t kStagingBlockBytes = size_t{256} << 10;
constexpr size_t kStagingBlocksPerDevice = 64;
}  // namespace

void upload_async(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return;
  const cudaStream_t s = stream ? static_cast<cudaStream_t>(stream) : cudaStreamLegacy;
  int dev = 0;
  CAI_CUDA_CHECK(cudaGetDevice(&dev));
  StagingPool& pool = staging_pool();
  std::lock_guard<std::mutex> lock(pool.m);
  size_t mine = 0, pick = pool.blocks.size();
  for (size_t i = 0; i < pool.blocks.size() && pick == pool.blocks.size(); ++i) {
    StagingBlock& b = pool.blocks[i];
    if (b.device != dev) continue;
    ++mine;
    if (b.capacity < bytes) continue;
    const cudaError_t r = cudaEventQuery(b.copied);
    if (r == cudaErrorNotReady) continue;
    CAI_CUDA_CHECK(r);
    pick = i;
  }
  if (pick == pool.blocks.size()) {
    StagingBlock b;
    b.device = dev;
    b.capacity = std::max(bytes, kStagingBlockBytes);
    if (mine >= kStagingBlocksPerDevice ||
        cudaHostAlloc(&b.host, b.capacity, cudaHostAllocDefault) != cudaSuccess) {
      cudaGetLastError();  // a failed pinning is not this call's error: copy as before
      CAI_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
      return;
    }
    CAI_CUDA_CHECK(cudaEventCreateWithFlags(&b.copied, cudaEventDisableTiming));
    pool.blocks.push_back(b);
  }
  StagingBlock& b = pool.blocks[pick];
  std::memcpy(b.host, src, bytes);
  CAI_CUDA_CHECK(cudaMemcpyAsync(dst, b.host, bytes, cudaMemcpyHostToDevice, s));
  CAI_CUDA_CHECK(cudaEventRecord(b.copied, s));
}

void copy_d2h_async(void* dst, const void* src, size_t bytes, void* stream) {
  CAI_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost,
                                 stream ? static_cast<cudaStream_t>(stream) : cudaStreamLegacy));
}
int current_device() {
  int d = 0;
  CAI_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}
void set_device(int device) {
  CAI_CUDA_CHECK(cudaSetDevice(device));
}
bool has_primary_context(int device) {
  // Through the runtime's driver entry points: the library links no libcuda of its own.
  using GetState = int (*)(int dev, unsigned int* flags, int* active);  // CUresult, CUdevice
  using GetDevice = int (*)(int* dev, int ordinal);
  void* get_state = nullptr;
  void* get_device = nullptr;
  cudaDriverEntryPointQueryResult found{};
  CAI_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &get_state, 12000,
                                                  cudaEnableDefault, &found));
  CAI_CHECK(found == cudaDriverEntryPointSuccess && get_state,
            "[cuda] the driver has no cuDevicePrimaryCtxGetState");
  CAI_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuDeviceGet", &get_device, 12000,
                                                  cudaEnableDefault, &found));
  CAI_CHECK(found == cudaDriverEntryPointSuccess && get_device,
            "[cuda] the driver has no cuDeviceGet");
  int dev = 0;
  const int r = reinterpret_cast<GetDevice>(get_device)(&dev, device);
  CAI_CHECK(r == 0, "[cuda] cuDeviceGet({}) failed (CUresult {})", device, r);
  unsigned int flags = 0;
  int active = 0;
  const int s = reinterpret_cast<GetState>(get_state)(dev, &flags, &active);
  CAI_CHECK(s == 0, "[cuda] cuDevicePrimaryCtxGetState({}) failed (CUresult {})", device, s);
  return active != 0;
}

}  // namespace cai::kernels::cuda
