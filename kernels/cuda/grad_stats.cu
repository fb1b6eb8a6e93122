// Gradient statistics (fp16 unscale, Σ weight·x², inf/NaN count) and global-norm clipping over
// many tensors in one pass, the twins of kernels/cpu/optim.cpp's multi_tensor_grad_stats/clip.
// As the multi-tensor optimizers: every tensor is cut into chunks of kChunk elements, one block
// per chunk, with the (tensor, chunk) table uploaded once per call. The statistics go through
// per-chunk partial sums in double and a one-block final sum, so the result never leaves the
// device; the clip kernel reads the sum of squares where it lies.
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/replicas.cuh"
#include "kernels/cuda/typed.cuh"
#include "kernels/device.h"
#include "kernels/optim.h"

namespace cai::kernels::cuda {

namespace {

constexpr int kChunk = 32768;
constexpr int kStatBlock = 256;

struct XMeta {
  float* x;
  int64_t n;
  float weight;
  int vec;  // 16-byte aligned: float4 accesses
};
struct XChunk {
  int tensor;
  int pad;
  int64_t start;
};

// The table on the device: tensors, chunks, then one double2 per chunk (partial sums).
class XTable {
 public:
  XTable(int count, float* const* x, const int64_t* n, const float* weight, bool partials,
         cudaStream_t s) {
    CAI_CHECK(count >= 0, "[multi_tensor] tensor count {} is negative", count);
    std::vector<XMeta> tensors;
    std::vector<XChunk> chunks;
    for (int i = 0; i < count; ++i) {
      CAI_CHECK(n[i] >= 0, "[multi_tensor] tensor {} has {} elements", i, n[i]);
      if (n[i] == 0) continue;
      const int64_t nc = (n[i] + kChunk - 1) / kChunk;
      CAI_CHECK(static_cast<int64_t>(chunks.size()) + nc < (int64_t{1} << 31),
                "[multi_tensor] {} chunks of {} elements is more than one launch holds",
                chunks.size() + nc, kChunk);
      const int t = static_cast<int>(tensors.size());
      tensors.push_back(XMeta{x[i], n[i], weight ? weight[i] : 1.0f,
                              reinterpret_cast<uintptr_t>(x[i]) % 16 == 0});
      for (int64_t c = 0; c < nc; ++c) chunks.push_back(XChunk{t, 0, c * kChunk});
    }
    chunks_ = static_cast<int>(chunks.size());
    if (chunks_ == 0) return;
    const size_t tb = tensors.size() * sizeof(XMeta), cb = chunks.size() * sizeof(XChunk);
    const size_t off = (tb + cb + 15) / 16 * 16;
    const size_t pb = partials ? chunks.size() * sizeof(double2) : 0;
    std::vector<unsigned char> host(tb + cb);
    std::memcpy(host.data(), tensors.data(), tb);
    std::memcpy(host.data() + tb, chunks.data(), cb);
    buf_.emplace(off + pb);
    unsigned char* d = buf_->as<unsigned char>();
    // Through a page-locked block: no wait for the device, and `host` may go out of scope.
    upload_async(d, host.data(), tb + cb, s);
    tensors_ = reinterpret_cast<const XMeta*>(d);
    chunk_table_ = reinterpret_cast<const XChunk*>(d + tb);
    partials_ = partials ? reinterpret_cast<double2*>(d + off) : nullptr;
  }
  int chunks() const { return chunks_; }
  const XMeta* tensors() const { return tensors_; }
  const XChunk* chunk_table() const { return chunk_table_; }
  double2* partials() const { return partials_; }

 private:
  std::optional<Scratch> buf_;
  int chunks_ = 0;
  const XMeta* tensors_ = nullptr;
  const XChunk* chunk_table_ = nullptr;
  double2* partials_ = nullptr;
};

__device__ double2 block_sum2(double2 v) {
  __shared__ double2 part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    v.x += __shfl_down_sync(0xffffffffu, v.x, o);
    v.y += __shfl_down_sync(0xffffffffu, v.y, o);
  }
  if (lane == 0) part[warp] = v;
  __syncthreads();
  double2 r = make_double2(0.0, 0.0);
  if (warp == 0) {
    r = lane < static_cast<int>(blockDim.x >> 5) ? part[lane] : make_double2(0.0, 0.0);
    for (int o = 16; o > 0; o >>= 1) {
      r.x += __shfl_down_sync(0xffffffffu, r.x, o);
      r.y += __shfl_down_sync(0xffffffffu, r.y, o);
    }
  }
  return r;  // valid in thread 0
}

__device__ __forceinline__ void stat(float& v, float scale, float& sq, float& bad) {
  v *= scale;
  sq += v * v;
  bad += !isfinite(v);
}

__global__ void __launch_bounds__(kStatBlock)
    grad_stats_kernel(const XMeta* __restrict__ tensors, const XChunk* __restrict__ chunks,
                      float scale, double2* __restrict__ partials, GradReplicas reps) {
  const XChunk c = chunks[blockIdx.x];
  const XMeta t = tensors[c.tensor];
  const int64_t len = t.n - c.start < kChunk ? t.n - c.start : kChunk;
  float* x = t.x + c.start;
  const bool write = scale != 1.0f;
  // Per-thread sums of at most kChunk / kStatBlock = 128 squares: fp32 is enough here; the
  // block and the chunks are summed in double.
  float sq = 0.0f, bad = 0.0f;
  int64_t done = 0;
  if (t.vec) {
    const int64_t nv = len / 4;
    float4* x4 = reinterpret_cast<float4*>(x);
    for (int64_t k = threadIdx.x; k < nv; k += blockDim.x) {
      float4 v = replica_sum4(x, k, reps);
      stat(v.x, scale, sq, bad), stat(v.y, scale, sq, bad);
      stat(v.z, scale, sq, bad), stat(v.w, scale, sq, bad);
      if (write) x4[k] = v;
    }
    done = nv * 4;
  }
  for (int64_t i = done + threadIdx.x; i < len; i += blockDim.x) {
    float v = replica_sum(x, i, reps);
    stat(v, scale, sq, bad);
    if (write) x[i] = v;
  }
  const double2 r = block_sum2(make_double2(static_cast<double>(t.weight) * sq, bad));
  if (threadIdx.x == 0) partials[blockIdx.x] = r;
}

__global__ void __launch_bounds__(kStatBlock)
    grad_stats_total_kernel(const double2* __restrict__ partials, int n, float* __restrict__ out) {
  double2 acc = make_double2(0.0, 0.0);
  for (int i = threadIdx.x; i < n; i += blockDim.x) acc.x += partials[i].x, acc.y += partials[i].y;
  const double2 r = block_sum2(acc);
  if (threadIdx.x == 0) out[0] = static_cast<float>(r.x), out[1] = static_cast<float>(r.y);
}

__global__ void __launch_bounds__(kStatBlock)
    clip_kernel(const XMeta* __restrict__ tensors, const XChunk* __restrict__ chunks,
                const float* __restrict__ sq, float max_norm, float* __restrict__ norm) {
  const float total = sqrtf(*sq);
  if (norm && blockIdx.x == 0 && threadIdx.x == 0) *norm = total;
  const float c = max_norm / (total + 1e-6f);
  if (!(c < 1.0f)) return;
  const XChunk ch = chunks[blockIdx.x];
  const XMeta t = tensors[ch.tensor];
  const int64_t len = t.n - ch.start < kChunk ? t.n - ch.start : kChunk;
  float* x = t.x + ch.start;
  int64_t done = 0;
  if (t.vec) {
    const int64_t nv = len / 4;
    float4* x4 = reinterpret_cast<float4*>(x);
    for (int64_t k = threadIdx.x; k < nv; k += blockDim.x) {
      float4 v = x4[k];
      v.x *= c, v.y *= c, v.z *= c, v.w *= c;
      x4[k] = v;
    }
    done = nv * 4;
  }
  for (int64_t i = done + threadIdx.x; i < len; i += blockDim.x) x[i] *= c;
}

__global__ void norm_only_kernel(const float* sq, float* norm) {
  *norm = sqrtf(*sq);
}

}  // namespace

void multi_tensor_grad_stats(int count, float* const* x, const int64_t* n, const float* weight,
                             float scale, float* out, void* stream, const GradReplicas* replicas) {
  const GradReplicas reps = replicas_arg(replicas, "multi_tensor_grad_stats");
  CAI_CHECK(reps.n == 0 || scale == 1.0f,
            "[multi_tensor_grad_stats] scale {} with gradient replicas: the unscale writes the "
            "gradients, which are only this rank's copy",
            scale);
  const cudaStream_t s = as_stream(stream);
  const XTable table(count, x, n, weight, true, s);
  if (table.chunks() == 0) {
    CAI_CUDA_CHECK(cudaMemsetAsync(out, 0, 2 * sizeof(float), s));
    return;
  }
  grad_stats_kernel<<<table.chunks(), kStatBlock, 0, s>>>(table.tensors(), table.chunk_table(),
                                                          scale, table.partials(), reps);
  CAI_CUDA_CHECK_LAUNCH();
  grad_stats_total_kernel<<<1, kStatBlock, 0, s>>>(table.partials(), table.chunks(), out);
  CAI_CUDA_CHECK_LAUNCH();
}

void multi_tensor_clip(int count, float* const* x, const int64_t* n, const float* sq,
                       float max_norm, float* norm, void* stream) {
  const cudaStream_t s = as_stream(stream);
  const XTable table(count, x, n, nullptr, false, s);
  if (table.chunks() == 0) {
    if (norm) {
      norm_only_kernel<<<1, 1, 0, s>>>(sq, norm);
      CAI_CUDA_CHECK_LAUNCH();
    }
    return;
  }
  clip_kernel<<<table.chunks(), kStatBlock, 0, s>>>(table.tensors(), table.chunk_table(), sq,
                                                    max_norm, norm);
  CAI_CUDA_CHECK_LAUNCH();
}

}  // namespace cai::kernels::cuda
