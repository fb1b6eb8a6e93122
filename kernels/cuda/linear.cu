// Linear layer on cuBLASLt, fp32 accumulation for every type; fp32 without TF32 unless asked
// (the fp32 twins are compared with the CPU at 1e-5). Row-major data go through column-major
// cuBLAS by transposition: a row-major [r, c] matrix is a column-major [c, r] one with leading
// dimension c. The bias rides the GEMM's epilogue; db is a separate column sum in double.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>

#include "kernels/cuda/blas.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/gelu_math.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/typed.cuh"
#include "kernels/device.h"
#include "kernels/elementwise.h"
#include "kernels/gelu.h"
#include "kernels/linear.h"

namespace cai::kernels::cuda {

namespace {

void check_dims(const char* op, int64_t m, int64_t k, int64_t n) {
  CAI_CHECK(m >= 0 && k >= 0 && n >= 0 && m <= INT_MAX && k <= INT_MAX && n <= INT_MAX,
            "[{}] m = {}, k = {}, n = {}: cuBLAS needs each in [0, {}]", op, m, k, n, INT_MAX);
}

// Calls f(T{}) with T the device type of t.
template <typename F>
void dispatch(DT t, F&& f) {
  switch (t) {
    case DT::F32:
      f(float{});
      break;
    case DT::BF16:
      f(__nv_bfloat16{});
      break;
    case DT::F16:
      f(__half{});
      break;
  }
}

// y[i, j] = b[j] (b == nullptr: 0) for y[m, n].
template <typename T>
__global__ void broadcast_rows_kernel(const T* b, T* y, int64_t m, int64_t n) {
  CAI_GRID_STRIDE(t, m * n) y[t] = b ? b[t % n] : from_f32<T>(0.0f);
}

void broadcast_rows(DT t, const void* b, void* y, int64_t m, int64_t n, cudaStream_t s) {
  dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    broadcast_rows_kernel<T>
        <<<grid_for(m * n), kBlock, 0, s>>>(static_cast<const T*>(b), static_cast<T*>(y), m, n);
  });
  CAI_CUDA_CHECK_LAUNCH();
}

// db[j] += Σ_i dy[i, j] over dy[m, n], accumulated in double as the CPU does, in a fixed order.
// Block (32, kRows): threadIdx.x picks the column inside a tile of 32 columns (blockIdx.x),
// threadIdx.y a residue class of rows; blockIdx.y a chunk of kChunk rows. With one chunk the
// block adds its total to db; with several, each writes its partial sum to part[chunk, n] and
// column_sum_finish adds the chunks in order (deterministic, no atomics).
constexpr int kColTile = 32;
constexpr int kRows = 16;
constexpr int64_t kChunk = 512;
template <typename T>
__global__ void column_sum_kernel(const T* dy, float* db, double* part, int64_t m, int64_t n) {
  __shared__ double sums[kRows][kColTile];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * kChunk;
  const int64_t end = part ? (begin + kChunk < m ? begin + kChunk : m) : m;
  double s = 0.0;
  if (j < n)
    for (int64_t i = begin + threadIdx.y; i < end; i += kRows)
      s += static_cast<double>(to_f32(dy[i * n + j]));
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && j < n) {
    double total = 0.0;
    for (int r = 0; r < kRows; ++r) total += sums[r][threadIdx.x];
    if (part)
      part[blockIdx.y * n + j] = total;
    else
      db[j] += static_cast<float>(total);
  }
}

// db[j] += Σ_c part[c, j]: a block of kFinishCols columns × kFinishLanes lanes; lane l adds the
// chunks c ≡ l (mod kFinishLanes) in order, then the lanes are added in a fixed tree (shuffles
// within the lane group), so the order is fixed and the chunks are read in parallel.
constexpr int kFinishLanes = 16;
constexpr int kFinishCols = 16;
__global__ void __launch_bounds__(kFinishLanes* kFinishCols)
    column_sum_finish_kernel(const double* __restrict__ part, float* db, int64_t chunks,
                             int64_t n) {
  const int lane = threadIdx.x % kFinishLanes;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kFinishCols + threadIdx.x / kFinishLanes;
  double total = 0.0;
  if (j < n)
    for (int64_t c = lane; c < chunks; c += kFinishLanes) total += part[c * n + j];
#pragma unroll
  for (int o = kFinishLanes / 2; o > 0; o >>= 1)
    total += __shfl_down_sync(0xffffffffu, total, o, kFinishLanes);
  if (lane == 0 && j < n) db[j] += static_cast<float>(total);
}
void launch_column_sum_finish(const double* part, float* db, int64_t chunks, int64_t n,
                              cudaStream_t s) {
  const int64_t blocks = (n + kFinishCols - 1) / kFinishCols;
  column_sum_finish_kernel<<<static_cast<unsigned>(blocks), kFinishLanes * kFinishCols, 0, s>>>(
      part, db, chunks, n);
  CAI_CUDA_CHECK_LAUNCH();
}

// The same sums with 16-byte loads: each thread owns V consecutive columns (V·sizeof(T) = 16), a
// warp 32·V of them, so a warp reads 512 contiguous bytes of a row; the kRows row lanes of a block
// then add their sums in order through shared memory. Needs n % V == 0 and dy 16-byte aligned.
// `op(at, v)` may replace the V values loaded at element `at` before they are summed (and store
// what it made of them): SumOnly leaves them, GeluBwdOp turns the GELU's output gradient into its
// input gradient, writes it, and sums that (the fused GELU backward + bias gradient).
struct SumOnly {
  static constexpr int kShared = 0;
  static constexpr int kMinBlocks = 1;
  __device__ __forceinline__ void setup(unsigned char*) {}
  template <int V>
  __device__ __forceinline__ void operator()(int64_t, float (&)[V]) const {}
};

// Table: the bf16 exact form by gelu_table (gelu_math.cuh): setup fills the slopes (and, with Y,
// the outputs) in the block's shared memory, the same bits as the functions give.
template <typename T, bool Tanh, bool Y = false, bool Table = false>
struct GeluBwdOp {
  static_assert(!Table || (std::is_same_v<T, bf16> && !Tanh), "the table is bf16's exact GELU");
  static constexpr int V = 16 / static_cast<int>(sizeof(T));
  static constexpr int kShared =
      Table ? gelu_table::kEntries * (sizeof(float) + (Y ? sizeof(unsigned short) : 0)) : 0;
  static constexpr int kMinBlocks = 1;
  const T* __restrict__ x;
  T* __restrict__ dx;
  T* __restrict__ y = nullptr;  // Y: the GELU's output made again (gelu_fwd_t's values)
  const float* slope = nullptr;
  const unsigned short* fwd = nullptr;
  // Called by every thread of the block before the first element; syncs the block.
  __device__ __forceinline__ void setup(unsigned char* shared) {
    if constexpr (Table) {
      float* s = reinterpret_cast<float*>(shared);
      unsigned short* f =
          Y ? reinterpret_cast<unsigned short*>(shared + gelu_table::kEntries * sizeof(float))
            : nullptr;
      gelu_table::fill(f, s);
      slope = s;
      fwd = f;
      __syncthreads();
    }
  }
  __device__ __forceinline__ void operator()(int64_t at, float (&v)[V]) const {
    const Vec<T, V> raw = *reinterpret_cast<const Vec<T, V>*>(x + at);
    if constexpr (Table) {
      [[maybe_unused]] Vec<T, V> yv;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const unsigned b = __bfloat16_as_ushort(raw.v[e]), s = gelu_table::slot(b);
        if (s < gelu_table::kEntries) {
          v[e] *= slope[s];
          if constexpr (Y) yv.v[e] = __ushort_as_bfloat16(fwd[s]);
        } else {
          const float xf = gelu_table::bf16_input(b);
          v[e] *= gelu_table::slope_outside(xf);
          if constexpr (Y) yv.v[e] = from_f32<bf16>(gelu_table::gelu_outside(xf));
        }
      }
      if constexpr (Y) *reinterpret_cast<Vec<T, V>*>(y + at) = yv;
    } else {
      float xv[V];
#pragma unroll
      for (int e = 0; e < V; ++e) xv[e] = to_f32(raw.v[e]);
      if constexpr (Y) {
        float yv[V];
#pragma unroll
        for (int e = 0; e < V; ++e) {
          if constexpr (Tanh) {
            yv[e] = gelu_tanh_f(xv[e]);
            v[e] = gelu_tanh_grad_f(xv[e], v[e]);
          } else {
            v[e] = gelu_and_grad_f(xv[e], v[e], &yv[e]);
          }
        }
        store_vec(y + at, yv);
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e)
          v[e] = Tanh ? gelu_tanh_grad_f(xv[e], v[e]) : gelu_grad_f(xv[e], v[e]);
      }
    }
    store_vec(dx + at, v);
    // The bias gradient sums dx as stored (rounded to T), as the separate column sum would.
#pragma unroll
    for (int e = 0; e < V; ++e) v[e] = to_f32(from_f32<T>(v[e]));
  }
};

template <typename T, typename Op, int V = 16 / static_cast<int>(sizeof(T))>
__global__ void __launch_bounds__(32 * kRows, Op::kMinBlocks)
    column_sum_vec_kernel(const T* __restrict__ dy, Op op, float* db, double* part, int64_t m,
                          int64_t n, int64_t chunk) {
  // The row lanes' sums at the end; before that the op's tables, if it has any.
  static_assert(Op::kShared <= sizeof(double) * kRows * 32 * V, "the op's tables do not fit");
  __shared__ __align__(16) unsigned char shared[sizeof(double) * kRows * 32 * V];
  auto& sums = *reinterpret_cast<double(*)[kRows][32 * V]>(shared);
  op.setup(shared);
  const int64_t j0 = (static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x) * V;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * chunk;
  const int64_t end = part ? (begin + chunk < m ? begin + chunk : m) : m;
  // fp32 partial sums of at most kFlush rows, added into the double sums (one conversion per
  // kFlush rows instead of per element).
  constexpr int kFlush = 32;
  double acc[V];
#pragma unroll
  for (int e = 0; e < V; ++e) acc[e] = 0.0;
  if (j0 < n)
    for (int64_t i = begin + threadIdx.y; i < end;) {
      float f[V];
#pragma unroll
      for (int e = 0; e < V; ++e) f[e] = 0.0f;
      // (Unrolling this loop measured slower: 544 µs against 390 for the GELU backward of
      // ViT-B/16's fc1 on an H100, 62 against 55 for the plain sums; two rows loaded ahead with
      // the GELU table, 295 against 281 µs on an H200.)
      for (int r = 0; r < kFlush && i < end; ++r, i += kRows) {
        float v[V];
        load_vec(dy + i * n + j0, v);
        op(i * n + j0, v);
#pragma unroll
        for (int e = 0; e < V; ++e) f[e] += v[e];
      }
#pragma unroll
      for (int e = 0; e < V; ++e) acc[e] += static_cast<double>(f[e]);
    }
  if constexpr (Op::kShared > 0) __syncthreads();  // every lookup done before the sums overwrite
#pragma unroll
  for (int e = 0; e < V; ++e) sums[threadIdx.y][threadIdx.x * V + e] = acc[e];
  __syncthreads();
  // Thread (x, y) finishes columns x + 32·y' of the tile, adding the row lanes in order.
  for (int c = threadIdx.y * 32 + threadIdx.x; c < 32 * V; c += 32 * kRows) {
    const int64_t j = static_cast<int64_t>(blockIdx.x) * 32 * V + c;
    if (j >= n) continue;
    double total = 0.0;
    for (int r = 0; r < kRows; ++r) total += sums[r][c];
    if (part)
      part[blockIdx.y * n + j] = total;
    else
      db[j] += static_cast<float>(total);
  }
}

// Op with the kernel's registers bounded for `Min` blocks a multiprocessor.
template <typename Op, int Min>
struct MinBlocks : Op {
  static constexpr int kMinBlocks = Min;
};

// Whether column_sum_vec_kernel takes dy[m, n] of type t at `p`.
bool column_sum_vec_ok(DT t, const void* p, int64_t n) {
  return n % (16 / static_cast<int>(dt_size(t))) == 0 && reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Runs column_sum_vec_kernel<T, Op> (db += Σ_rows op(dy)) and its ordered finish over chunks.
template <typename T, typename Op>
void launch_column_sum_vec(const T* dy, Op op, float* db, int64_t m, int64_t n, cudaStream_t s) {
  constexpr int vec = 16 / static_cast<int>(sizeof(T));
  const int64_t tiles = (n / vec + 31) / 32;
  // Chunks of rows so the blocks make one wave (as many as the device holds at once): with
  // kChunk-row chunks the GELU backward of ViT-B/16's fc1 ran 4.5 waves, 377 us against 365 us
  // in one wave on an H100 (the last wave's idle slots; ViT-L/16's 250 us either way, and
  // 2,048-row chunks, 1.1 waves, took 489 us); small problems take one chunk.
  int64_t chunks = 1;
  if (m > 2 * kChunk)
    chunks =
        std::max<int64_t>(1, resident_blocks(column_sum_vec_kernel<T, Op>, 32 * kRows) / tiles);
  const int64_t chunk = (m + chunks - 1) / chunks;
  CAI_CHECK(tiles <= INT_MAX && chunks <= 65535, "[linear_bwd] n = {}, m = {} are too large", n, m);
  Scratch part(chunks > 1 ? sizeof(double) * static_cast<size_t>(chunks * n) : 0);
  double* pp = chunks > 1 ? part.as<double>() : nullptr;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks));
  column_sum_vec_kernel<T, Op><<<grid, dim3(32, kRows), 0, s>>>(dy, op, db, pp, m, n, chunk);
  CAI_CUDA_CHECK_LAUNCH();
  if (pp) launch_column_sum_finish(pp, db, chunks, n, s);
}

void launch_column_sum(DT t, const void* dy, float* db, int64_t m, int64_t n, cudaStream_t s) {
  if (column_sum_vec_ok(t, dy, n)) {
    dispatch(t, [&](auto tag) {
      using T = decltype(tag);
      launch_column_sum_vec(static_cast<const T*>(dy), SumOnly{}, db, m, n, s);
    });
    return;
  }
  const int64_t tiles = (n + kColTile - 1) / kColTile;
  // One chunk (no partial buffer) while the columns alone give enough blocks or m is small.
  const int64_t chunks = tiles >= 264 || m <= 2 * kChunk ? 1 : (m + kChunk - 1) / kChunk;
  CAI_CHECK(tiles <= INT_MAX && chunks <= 65535, "[linear_bwd] n = {}, m = {} are too large", n, m);
  int device = 0;
  CAI_CUDA_CHECK(cudaGetDevice(&device));
  double* part = nullptr;
  if (chunks > 1)
    part = static_cast<double*>(alloc(sizeof(double) * static_cast<size_t>(chunks * n), device));
  // The caching allocator is not stream-ordered: freeing after enqueueing is safe because every
  // later user of the block runs on the same stream (as for all kernels here).
  struct Free {
    void* p;
    int dev;
    ~Free() { free(p, dev); }
  } guard{part, device};
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks));
  dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    column_sum_kernel<T>
        <<<grid, dim3(kColTile, kRows), 0, s>>>(static_cast<const T*>(dy), db, part, m, n);
  });
  CAI_CUDA_CHECK_LAUNCH();
  if (part) launch_column_sum_finish(part, db, chunks, n, s);
}

cublasComputeType_t compute_type(DT t, bool tf32) {
  return t == DT::F32 && tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

void run(const char* op, const char* what, const LtGemm& g, const void* a, const void* b, void* d,
         const void* bias, float beta, cudaStream_t s, DT t, DT dt) {
  CAI_CHECK(lt_matmul(g, a, b, d, bias, 1.0f, beta, s),
            "[{}] cuBLASLt has no algorithm for {} ({} inputs, {} output, m = {}, n = {}, k = {})",
            op, what, dt_name(t), dt_name(dt), g.m, g.n, g.k);
}

// Row-major y[m, n] = x[m, k]·w[n, k]ᵀ as column-major yᵀ[n, m] = (w as col-major [k, n])ᵀ ·
// (x as col-major [k, m]); A = w, B = x.
LtGemm forward_gemm(DT t, DT yt, bool tf32, int64_t m, int64_t k, int64_t n) {
  LtGemm g;
  g.ab = cuda_dtype(t);
  g.cd = cuda_dtype(yt);
  g.compute = compute_type(t, tf32);
  g.ta = CUBLAS_OP_T;
  g.tb = CUBLAS_OP_N;
  g.m = n, g.n = m, g.k = k;
  g.lda = k, g.ldb = k, g.ldd = n;
  return g;
}

// Row-major dx[m, k] = dy[m, n]·w[n, k] as column-major dxᵀ[k, m] = (w as col-major [k, n]) ·
// (dy as col-major [n, m]); A = w, B = dy.
LtGemm input_grad_gemm(DT t, bool tf32, int64_t m, int64_t k, int64_t n) {
  LtGemm g;
  g.ab = g.cd = cuda_dtype(t);
  g.compute = compute_type(t, tf32);
  g.ta = CUBLAS_OP_N;
  g.tb = CUBLAS_OP_N;
  g.m = k, g.n = m, g.k = n;
  g.lda = k, g.ldb = n, g.ldd = k;
  return g;
}

}  // namespace

void linear_fwd_t(DT t, const void* x, const void* w, const void* b, DT yt, void* y, int64_t m,
                  int64_t k, int64_t n, bool tf32, void* stream) {
  check_dims("linear_fwd", m, k, n);
  CAI_CHECK(yt == t || yt == DT::F32,
            "[linear_fwd] output type {} with {} inputs: expected {} or fp32", dt_name(yt),
            dt_name(t), dt_name(t));
  if (m == 0 || n == 0) return;
  const cudaStream_t s = as_stream(stream);
  if (k == 0) {  // nothing to sum: y = b (or 0) on every row
    broadcast_rows(yt, b, y, m, n, s);
    return;
  }
  const LtGemm g = forward_gemm(t, yt, tf32, m, k, n);
  // The bias epilogue reads the bias with vector loads: an odd address goes the long way.
  if (b && reinterpret_cast<uintptr_t>(b) % 16 == 0 && lt_matmul(g, w, x, y, b, 1.0f, 0.0f, s))
    return;
  if (b) broadcast_rows(yt, b, y, m, n, s);  // no epilogue for it: y = b, then y += x·wᵀ
  run("linear_fwd", "x·wᵀ", g, w, x, y, nullptr, b ? 1.0f : 0.0f, s, t, yt);
}

void linear_fwd_residual_t(DT t, const void* x, const void* w, const float* b, const float* r,
                           float* y, int64_t m, int64_t k, int64_t n, void* stream) {
  check_dims("linear_fwd_residual", m, k, n);
  if (m == 0 || n == 0) return;
  const cudaStream_t s = as_stream(stream);
  if (k > 0) {
    // C = r, beta 1: the epilogue adds the residual (and the bias) to the fp32 accumulators.
    const LtGemm g = forward_gemm(t, DT::F32, false, m, k, n);
    if ((!b || reinterpret_cast<uintptr_t>(b) % 16 == 0) &&
        lt_matmul(g, w, x, y, b, 1.0f, 1.0f, s, nullptr, r))
      return;
  }
  // No epilogue for it (or k = 0): the linear into y (fp32), then y += r.
  linear_fwd_t(t, x, w, b, DT::F32, y, m, k, n, false, stream);
  axpy_t(1.0f, DT::F32, r, y, m * n, stream);
}

void linear_bwd_t(DT t, const void* x, const void* w, const void* dy, void* dx, float* dw,
                  float* db, int64_t m, int64_t k, int64_t n, bool tf32, void* stream) {
  check_dims("linear_bwd", m, k, n);
  const cudaStream_t s = as_stream(stream);
  // dx[m, k] = dy[m, n] · w[n, k], overwritten (all zeros when n == 0).
  if (dx && m > 0 && k > 0) {
    if (n == 0) {
      CAI_CUDA_CHECK(cudaMemsetAsync(dx, 0, static_cast<size_t>(m * k) * dt_size(t), s));
    } else {
      const LtGemm g = input_grad_gemm(t, tf32, m, k, n);
      run("linear_bwd", "dy·w", g, w, dy, dx, nullptr, 0.0f, s, t, t);
    }
  }
  if (m == 0 || n == 0) return;  // dw and db gain nothing
  // dw[n, k] += dy^T · x, t inputs and fp32 output in one call.
  if (dw && k > 0) {
    // Column-major: dw^T[k, n] += (x as col-major [k, m]) · (dy as col-major [n, m])^T.
    LtGemm g;
    g.ab = cuda_dtype(t);
    g.cd = CUDA_R_32F;
    g.compute = compute_type(t, tf32);
    g.ta = CUBLAS_OP_N;
    g.tb = CUBLAS_OP_T;
    g.m = k, g.n = n, g.k = m;
    g.lda = k, g.ldb = n, g.ldd = k;
    run("linear_bwd", "dyᵀ·x", g, x, dy, dw, nullptr, 1.0f, s, t, DT::F32);
  }
  // db[n] += Σ_rows dy.
  if (db) launch_column_sum(t, dy, db, m, n, s);
}

void column_sum_t(DT t, const void* y, float* db, int64_t m, int64_t n, void* stream) {
  check_dims("column_sum", m, 0, n);
  if (m > 0 && n > 0) launch_column_sum(t, y, db, m, n, as_stream(stream));
}

void linear_gelu_fwd_t(DT t, const void* x, const void* w, const void* b, void* pre, void* y,
                       int64_t m, int64_t k, int64_t n, void* stream) {
  check_dims("linear_gelu_fwd", m, k, n);
  if (m == 0 || n == 0) return;
  const cudaStream_t s = as_stream(stream);
  if (k > 0 && (!b || reinterpret_cast<uintptr_t>(b) % 16 == 0)) {
    // As linear_fwd_t, with GELU_AUX_BIAS: the aux (pre) is column-major [n, m], ld n.
    LtGemm g = forward_gemm(t, t, false, m, k, n);
    g.epilogue = LtEpilogue::kGeluAuxBias;
    g.ldaux = n;
    if (lt_matmul(g, w, x, y, b, 1.0f, 0.0f, s, pre)) return;
  }
  // Refused (n not a multiple of 8, alignment, type): the GEMM into pre, then the GELU.
  linear_fwd_t(t, x, w, b, t, pre, m, k, n, false, stream);
  gelu_tanh_fwd_t(t, pre, y, m * n, stream);
}

void linear_bwd_dgelu_t(DT t, const void* x, const void* w, const void* dy, const void* pre,
                        void* dpre, float* dw, float* db, int64_t m, int64_t k, int64_t n,
                        void* stream) {
  check_dims("linear_bwd_dgelu", m, k, n);
  const cudaStream_t s = as_stream(stream);
  if (dpre && m > 0 && k > 0) {
    if (n == 0) {
      CAI_CUDA_CHECK(cudaMemsetAsync(dpre, 0, static_cast<size_t>(m * k) * dt_size(t), s));
    } else {
      // As linear_bwd_t's dx (column-major dpre^T[k, m] = w · dy), with DGELU on aux = pre
      // (column-major [k, m], ld k): dpre = (dy·w) ∘ gelu_tanh'(pre).
      LtGemm g = input_grad_gemm(t, false, m, k, n);
      g.epilogue = LtEpilogue::kDGelu;
      g.ldaux = k;
      if (!lt_matmul(g, w, dy, dpre, nullptr, 1.0f, 0.0f, s, pre)) {
        // Refused: dy·w into a temporary, then the GELU's backward.
        Scratch tmp(static_cast<size_t>(m * k) * dt_size(t));
        linear_bwd_t(t, x, w, dy, tmp.as<void>(), nullptr, nullptr, m, k, n, false, stream);
        gelu_tanh_bwd_t(t, pre, tmp.as<void>(), dpre, m * k, stream);
      }
    }
  }
  // dw += dyᵀ·x, db += Σ_rows dy: linear_bwd_t's own code.
  linear_bwd_t(t, x, w, dy, nullptr, dw, db, m, k, n, false, stream);
}

void gelu_bwd_bias_t(DT t, bool tanh, const void* x, const void* dy, void* dx, float* db, int64_t m,
                     int64_t n, void* y, void* stream) {
  CAI_CHECK(m >= 0 && n >= 0, "[gelu_bwd_bias] m = {}, n = {} must be >= 0", m, n);
  if (m == 0 || n == 0) return;
  const cudaStream_t s = as_stream(stream);
  if (db && column_sum_vec_ok(t, dy, n) && column_sum_vec_ok(t, x, n) &&
      column_sum_vec_ok(t, dx, n) && (!y || column_sum_vec_ok(t, y, n))) {
    dispatch(t, [&](auto tag) {
      using T = decltype(tag);
      const auto* xp = static_cast<const T*>(x);
      const auto* dyp = static_cast<const T*>(dy);
      auto* dxp = static_cast<T*>(dx);
      auto* yp = static_cast<T*>(y);
      if constexpr (std::is_same_v<T, bf16>) {
        if (!tanh && gelu_table::enabled()) {
          // The kernel without y held to 40 registers for 3 blocks a multiprocessor (a few
          // spills, once per 32 rows): 281.8 -> 257.8 us at ViT-B/16's fc1 on an H200; with y
          // the same bound spilled more (349.2 -> 376.1 us) and 4 blocks lost both.
          using OpY = GeluBwdOp<T, false, true, true>;
          using OpN = MinBlocks<GeluBwdOp<T, false, false, true>, 3>;
          if (y)
            launch_column_sum_vec(dyp, OpY{xp, dxp, yp}, db, m, n, s);
          else
            launch_column_sum_vec(dyp, OpN{{xp, dxp}}, db, m, n, s);
          return;
        }
      }
      if (tanh && y)
        launch_column_sum_vec(dyp, GeluBwdOp<T, true, true>{xp, dxp, yp}, db, m, n, s);
      else if (tanh)
        launch_column_sum_vec(dyp, GeluBwdOp<T, true>{xp, dxp}, db, m, n, s);
      else if (y)
        launch_column_sum_vec(dyp, GeluBwdOp<T, false, true>{xp, dxp, yp}, db, m, n, s);
      else
        launch_column_sum_vec(dyp, GeluBwdOp<T, false>{xp, dxp}, db, m, n, s);
    });
    return;
  }
  // Odd widths or alignments: the GELU's backward, then the column sum (and the forward again).
  if (tanh)
    gelu_tanh_bwd_t(t, x, dy, dx, m * n, stream);
  else
    gelu_bwd_t(t, x, dy, dx, m * n, stream);
  if (db) launch_column_sum(t, dx, db, m, n, s);
  if (y) (tanh ? gelu_tanh_fwd_t : gelu_fwd_t)(t, x, y, m * n, stream);
}

void linear_fwd(const float* x, const float* w, const float* b, float* y, int64_t m, int64_t k,
                int64_t n, void* stream) {
  linear_fwd_t(DT::F32, x, w, b, DT::F32, y, m, k, n, false, stream);
}

void linear_bwd(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                int64_t m, int64_t k, int64_t n, void* stream) {
  linear_bwd_t(DT::F32, x, w, dy, dx, dw, db, m, k, n, false, stream);
}

}  // namespace cai::kernels::cuda
