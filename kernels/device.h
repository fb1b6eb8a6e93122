// Device memory and runtime information. The CPU side is plain aligned host memory; the CUDA side
// is implemented in kernels/cuda/device.cu, or by kernels/no_cuda.cpp (which throws or reports
// "not compiled") when the build has no CUDA.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace cai::kernels {
namespace cpu {
// 64-byte aligned; throws on failure. zeroed: the block reads as zeros; a large one comes so from
// the OS (calloc of fresh pages) without a pass over it, its pages touched only when first used.
// From 64 MiB up: an anonymous mapping on a 2 MiB boundary advised as transparent huge pages
// (zeros whether asked or not).
void* alloc(size_t bytes, bool zeroed = false);
void free(void* p);
std::string blas_info();  // OpenBLAS build configuration, e.g. "OpenBLAS 0.3.21 ..."
int max_threads();        // threads of the CPU kernels' pool
}  // namespace cpu
namespace cuda {
struct DeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  size_t total_memory = 0;
  int multiprocessors = 0;
};
struct RuntimeInfo {
  bool compiled = false;           // this build has CUDA kernels
  int compiled_version = 0;        // CUDART_VERSION at build time, e.g. 13000
  int runtime_version = 0;         // cudaRuntimeGetVersion, 0 when unknown
  int driver_version = 0;          // cudaDriverGetVersion, 0 when there is no driver
  std::string device_error;        // why no device could be listed ("" when devices were listed)
  int cublas_version = 0;          // cublasGetProperty major*10000 + minor*100 + patch
  int nccl_version = 0;            // ncclGetVersion
  std::vector<int> architectures;  // CUDA architectures compiled in, e.g. {90}
  bool hopper_attention = false;   // the attention's sm_90a (wgmma) kernels are compiled in
  std::vector<DeviceInfo> devices;
};
RuntimeInfo runtime_info();
int device_count();  // 0 when there is no driver or no GPU
// Device memory from a caching allocator (no cudaMalloc per step; see device.cu).
void* alloc(size_t bytes, int device);
void free(void* p, int device);
struct AllocatorStats {
  size_t in_use = 0, cached = 0, peak = 0;  // bytes
  // How often a cudaMalloc failed and the pool handed its free blocks back to retry (each one
  // synchronises the device: a pool near the GPU's capacity that does it every step is slow).
  size_t flushes = 0;
};
AllocatorStats allocator_stats(int device);
// The peak from here on: peak = the bytes in use now.
void reset_peak(int device);
// The GPU's sensors (NVML, loaded at run time): its energy counter (millijoules since the driver
// loaded), SM clock (MHz) and power draw (milliwatts) now. false when NVML is not there (no driver,
// no GPU build) or does not answer.
struct GpuSensors {
  double energy_mj = 0;
  unsigned sm_mhz = 0, power_mw = 0;
};
bool read_sensors(int device, GpuSensors* out);
void empty_cache(int device);  // returns the cached whole segments to the driver
void copy_h2d(void* dst, const void* src, size_t bytes);
void copy_d2h(void* dst, const void* src, size_t bytes);
void copy_d2d(void* dst, const void* src, size_t bytes);
// Device to device, `height` rows of `width_bytes` each: row r goes from src + r·src_pitch to
// dst + r·dst_pitch (pitches in bytes, >= width_bytes). Asynchronous on the legacy default stream,
// where the compute kernels run; the regions must not overlap.
void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width_bytes,
             size_t height);
void memset_zero(void* p, size_t bytes);
void synchronize();
// Whether a GEMM shape's cuBLASLt algorithm is chosen by timing the heuristic's first candidates
// once per process, then the fastest few in the shape's next calls (true unless CAI_GEMM_TUNE=0
// is in the environment) or is the heuristic's first
// (false: the same choice in every process; the results of equal GEMMs bit-equal across them).
// Applies to shapes not seen yet in this process. Without CUDA: the setting only.
void set_gemm_timing(bool on);
bool gemm_timing();
// SMs the GEMMs leave to other kernels that run beside them: cuBLASLt's algorithms are chosen
// for the device's SM count less `sms` (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET). A persistent GEMM
// launches one CTA per SM; where NCCL's kernels hold some SMs the whole time (a pipeline's posted
// receives), the CTAs that find no SM run after the others, and the GEMM takes up to twice as
// long (docs/bench/h200x2-pipeline-microbatch). 0 (the default): the whole device. Applies to
// shapes not seen yet with this margin in this process. Without CUDA: the setting only.
void set_gemm_sm_margin(int sms);
int gemm_sm_margin();

// For host code that overlaps copies with compute (the trainer's batch prefetch) without
// including the CUDA headers: page-locked host memory, and opaque handles of a non-blocking
// stream (cudaStream_t) and of an event (cudaEvent_t, timing off). A null stream means the legacy
// default stream, on which the compute kernels run. The handles belong to the current device.
void* alloc_pinned(size_t bytes);  // throws on failure
void free_pinned(void* p);
void* stream_create();
void stream_destroy(void* stream);
void* event_create();
void event_destroy(void* event);
void event_record(void* event, void* stream);
void stream_wait_event(void* stream, void* event);  // later work on `stream` waits (no host block)
void event_synchronize(void* event);                // the host waits
bool event_query(void* event);  // whether the work recorded before it has completed (no wait)
// An event with timing on (for measuring, not for ordering), and the milliseconds between two
// recorded, completed ones.
void* event_create_timed();
float event_elapsed_ms(void* start, void* end);
// Asynchronous host-to-device copy on `stream` (src should be pinned for a true overlap).
void copy_h2d_async(void* dst, const void* src, size_t bytes, void* stream);
// Host-to-device copy of a small host table (the multi-tensor kernels' pointer lists) on `stream`
// that never waits for the device: the bytes go through a page-locked staging block, reused once
// the copy out of it has run (an event), so `src` may be pageable and may go out of scope on
// return. From pageable memory cudaMemcpyAsync stages through the driver's bounded buffer and,
// once that is full, waits for the device to reach the copies before it: ZeRO-1's optimizer step
// on 2 H200 (ViT-H/14, three tables of ~100 KB queued behind a backward) held the host 72 ms a
// step, so the next step's launches came after the device had run dry. At most 64 blocks a device
// in flight; beyond that (or where a block cannot be pinned) the plain pageable copy.
void upload_async(void* dst, const void* src, size_t bytes, void* stream);
// Asynchronous device-to-host copy on `stream` (dst pinned: the host reads it once an event
// recorded after the copy has completed).
void copy_d2h_async(void* dst, const void* src, size_t bytes, void* stream);
int current_device();
void set_device(int device);
// Whether this process holds the primary context of `device` (the driver's
// cuDevicePrimaryCtxGetState; asking creates none). The first runtime call that needs a context
// creates the current device's, and a thread starts with device 0 current: a process meant to use
// one GPU that holds another's context (about 1 GiB of it) made a CUDA call before cudaSetDevice,
// or on a thread that never called it. Without CUDA: false.
bool has_primary_context(int device);
}  // namespace cuda
}  // namespace cai::kernels
