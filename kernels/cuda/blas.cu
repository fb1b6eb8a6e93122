#include "kernels/cuda/blas.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/cuda/check.h"
#include "kernels/device.h"

namespace cai::kernels::cuda {

namespace {
// One cuBLAS handle per device, created lazily on first use and kept for the process lifetime
// (a compute resource like the CUDA context, not process-group state).
struct Blas {
  std::mutex mu;
  std::unordered_map<int, cublasHandle_t> handles;
};
Blas& blas() {
  static Blas* b = new Blas;  // never destroyed: handles must outlive static destructors
  return *b;
}

// cuBLASLt: a handle per device, a workspace per (device, stream) (two streams must not share
// one: their GEMMs may run at the same time), and a plan (descriptors + the heuristic's
// algorithm) per problem, so cublasLtMatmulAlgoGetHeuristic runs once per shape. All kept for
// the process lifetime, like the cuBLAS handles.
constexpr size_t kLtWorkspace = size_t{32} << 20;
// How many of the heuristic's algorithms a plan times on its first call that may write D (see
// tune()); 1 turns the timing off. CAI_GEMM_TUNE=0 keeps the heuristic's first choice.
constexpr int kLtCandidates = 8;

// After the timing on the first call, the candidates within kFinalWithin of its fastest (at most
// kFinalists, fastest first) are timed again inside the running program: the plan's next calls
// take them in turn between two events until each has kInStepSamples times, and the one with the
// lowest median stays. The first call's timing runs each candidate back to back on a GPU that
// was idle; the step runs them between other kernels, power-capped, beside NCCL's all-reduces,
// where near ties rank differently (ViT-L/16 batch 128 on an H100: 1,159 img/s against 1,147
// with the first call's timing alone, two runs each, alternating).
constexpr int kFinalists = 4;
constexpr float kFinalWithin = 1.15f;
constexpr int kInStepSamples = 4;

struct LtPlan {
  bool ok = false;  // false: cuBLASLt offered no algorithm (cached too, to not ask again)
  bool tuned = false;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  cublasLtMatmulAlgo_t first{};                  // the heuristic's first choice
  std::vector<cublasLtMatmulAlgo_t> candidates;  // the heuristic's, best first; empty once timed
  // The in-step stage: the finalists, their times (ms), the calls whose events have not been read.
  struct Trial {
    size_t finalist;
    cudaEvent_t start, stop;
  };
  std::vector<cublasLtMatmulAlgo_t> finalists;
  std::vector<std::vector<float>> samples;
  std::vector<Trial> pending;
  std::vector<cudaEvent_t> spare;
  size_t turn = 0;
};
using LtKey = std::array<int64_t, 21>;

struct Lt {
  std::mutex mu;
  std::atomic<uint64_t> gelu_runs{0};
  std::atomic<uint64_t> in_step_runs{0};
  std::unordered_map<int, cublasLtHandle_t> handles;
  std::map<std::pair<int, cudaStream_t>, void*> workspaces;
  std::map<LtKey, LtPlan> plans;
};
Lt& lt() {
  static Lt* l = new Lt;  // never destroyed, as Blas
  return *l;
}

// The largest power of two ≤ 256 that divides the address (cuBLASLt's default assumes 256).
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al >>= 1;
  return al;
}

std::atomic<int>& sm_margin() {
  static std::atomic<int> sms{0};
  return sms;
}

std::atomic<bool>& timing_flag() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("CAI_GEMM_TUNE");
    return !(v && std::strcmp(v, "0") == 0);
  }()};
  return on;
}

void destroy(LtPlan& p) {
  if (p.desc) cublasLtMatmulDescDestroy(p.desc);
  if (p.a) cublasLtMatrixLayoutDestroy(p.a);
  if (p.b) cublasLtMatrixLayoutDestroy(p.b);
  if (p.d) cublasLtMatrixLayoutDestroy(p.d);
  p = LtPlan{};
}

template <typename T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, T value) {
  CAI_CUDA_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}
template <typename T>
void set_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, T value) {
  CAI_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
}

void build_plan(cublasLtHandle_t handle, const LtGemm& g, const void* bias, const void* aux,
                const uint32_t align[4], int margin, int device, LtPlan& p) {
  cublasLtMatmulPreference_t pref = nullptr;
  try {
    CAI_CUDA_CHECK(cublasLtMatmulDescCreate(&p.desc, g.compute, CUDA_R_32F));
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, static_cast<int32_t>(g.ta));
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, static_cast<int32_t>(g.tb));
    cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    if (g.epilogue == LtEpilogue::kGeluAuxBias)
      epi = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    else if (g.epilogue == LtEpilogue::kDGelu)
      epi = CUBLASLT_EPILOGUE_DGELU;
    if (epi != CUBLASLT_EPILOGUE_DEFAULT) set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epi);
    if (margin > 0) {  // set_gemm_sm_margin: the algorithms for the SMs left to the GEMM
      int sms = 0;
      CAI_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
      set_desc(p.desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET,
               static_cast<int32_t>(std::max(1, sms - margin)));
    }
    if (bias) set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(g.cd));
    if (g.epilogue != LtEpilogue::kDefault) {
      // The heuristic reads the aux pointer's value for its alignment; the aux has D's type.
      set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
      set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.ldaux);
    }
    const bool na = g.ta == CUBLAS_OP_N, nb = g.tb == CUBLAS_OP_N;
    CAI_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p.a, g.ab, na ? g.m : g.k, na ? g.k : g.m, g.lda));
    CAI_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p.b, g.ab, nb ? g.k : g.n, nb ? g.n : g.k, g.ldb));
    CAI_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p.d, g.cd, g.m, g.n, g.ldd));
    CAI_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    set_pref(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(kLtWorkspace));
    set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align[0]);
    set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align[1]);
    set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align[2]);
    set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align[2]);
    std::array<cublasLtMatmulHeuristicResult_t, kLtCandidates> results{};
    int found = 0;
    const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(
        handle, p.desc, p.a, p.b, p.d, p.d, pref, timing_flag().load() ? kLtCandidates : 1,
        results.data(), &found);
    cublasLtMatmulPreferenceDestroy(pref);
    pref = nullptr;
    // No algorithm: NOT_SUPPORTED, or nothing found; with an epilogue any refusal (the caller
    // then adds the bias or runs the GELU itself).
    const bool epilogue = epi != CUBLASLT_EPILOGUE_DEFAULT;
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || (epilogue && s != CUBLAS_STATUS_SUCCESS) ||
        (s == CUBLAS_STATUS_SUCCESS && found == 0)) {
      destroy(p);  // ok stays false
      return;
    }
    CAI_CUDA_CHECK(s);
    CAI_CUDA_CHECK(results[0].state);
    p.algo = p.first = results[0].algo;
    for (int i = 0; i < found; ++i)
      if (results[i].state == CUBLAS_STATUS_SUCCESS) p.candidates.push_back(results[i].algo);
    if (p.candidates.size() < 2) p.candidates.clear(), p.tuned = true;
    p.ok = true;
  } catch (...) {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    destroy(p);
    throw;
  }
}
bool tune_log() {
  static const bool on = [] {
    const char* v = std::getenv("CAI_GEMM_TUNE_LOG");
    return v && std::strcmp(v, "0") != 0;
  }();
  return on;
}

// Ends the in-step stage: its events go (those of unread trials too: an event destroyed before
// it completes is released when it does).
void end_trials(LtPlan& p) {
  for (const LtPlan::Trial& t : p.pending) {
    cudaEventDestroy(t.start);
    cudaEventDestroy(t.stop);
  }
  for (cudaEvent_t e : p.spare) cudaEventDestroy(e);
  p.pending.clear();
  p.spare.clear();
  p.finalists.clear();
  p.samples.clear();
}

// Times the heuristic's candidates for this problem on its real operands and keeps the finalists
// for the in-step stage (see kFinalists): the heuristic's first choice is not always the fastest
// on these shapes. Each candidate runs once, then kReps times between two events on `stream`, in
// kRounds rounds; the host waits for them (once per problem and process). D is written by every
// run: the caller passes a scratch D where D is also the C of beta·C.
void tune(cublasLtHandle_t handle, const LtGemm& g, LtPlan& p, const void* a, const void* b,
          void* d, const void* c, float alpha, float beta, void* workspace, cudaStream_t stream) {
  // Each candidate timed kRounds times, the rounds interleaved, and its fastest kept: another
  // stream's kernels (NCCL's all-reduces beside the first backward under DDP) slow whichever
  // candidate runs beside them, which alone could pick a slower algorithm.
  constexpr int kReps = 2, kRounds = 3;
  cudaEvent_t ev[2] = {nullptr, nullptr};
  std::vector<float> ms(p.candidates.size(), -1.f);
  std::vector<char> runs(p.candidates.size(), 1);
  try {
    CAI_CUDA_CHECK(cudaEventCreate(&ev[0]));
    CAI_CUDA_CHECK(cudaEventCreate(&ev[1]));
    for (int round = 0; round < kRounds; ++round) {
      for (size_t i = 0; i < p.candidates.size(); ++i) {
        if (!runs[i]) continue;
        const cublasLtMatmulAlgo_t* algo = &p.candidates[i];
        auto run = [&] {
          return cublasLtMatmul(handle, p.desc, &alpha, a, p.a, b, p.b, &beta, c, p.d, d, p.d, algo,
                                workspace, kLtWorkspace, stream);
        };
        if (round == 0 && run() != CUBLAS_STATUS_SUCCESS) {  // not for this problem after all
          runs[i] = 0;
          continue;
        }
        CAI_CUDA_CHECK(cudaEventRecord(ev[0], stream));
        for (int r = 0; r < kReps; ++r) CAI_CUDA_CHECK(run());
        CAI_CUDA_CHECK(cudaEventRecord(ev[1], stream));
        CAI_CUDA_CHECK(cudaEventSynchronize(ev[1]));
        float t = 0;
        CAI_CUDA_CHECK(cudaEventElapsedTime(&t, ev[0], ev[1]));
        if (ms[i] < 0 || t < ms[i]) ms[i] = t;
      }
    }
  } catch (...) {
    for (cudaEvent_t e : ev)
      if (e) cudaEventDestroy(e);
    throw;
  }
  for (cudaEvent_t e : ev) cudaEventDestroy(e);
  // The finalists: within kFinalWithin of the fastest, fastest first (ties in the heuristic's
  // order); one alone is the pick.
  std::vector<size_t> order;
  for (size_t i = 0; i < ms.size(); ++i)
    if (ms[i] >= 0) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return ms[x] < ms[y]; });
  std::vector<cublasLtMatmulAlgo_t> finalists;
  for (size_t i : order)
    if (finalists.size() < static_cast<size_t>(kFinalists) && ms[i] <= ms[order[0]] * kFinalWithin)
      finalists.push_back(p.candidates[i]);
  if (tune_log()) {
    std::string line;
    for (float t : ms) line += " " + std::to_string(t);
    std::fprintf(stderr, "[gemm tune] m %lld n %lld k %lld op %d%d beta %g:%s -> %zu of %zu\n",
                 static_cast<long long>(g.m), static_cast<long long>(g.n),
                 static_cast<long long>(g.k), static_cast<int>(g.ta), static_cast<int>(g.tb), beta,
                 line.c_str(), finalists.size(), ms.size());
  }
  p.candidates.clear();
  if (finalists.empty()) {  // none ran: the heuristic's first, untimed
    p.tuned = true;
    return;
  }
  p.algo = finalists[0];
  if (finalists.size() == 1) {
    p.tuned = true;
    return;
  }
  p.finalists = std::move(finalists);
  p.samples.assign(p.finalists.size(), {});
}

// The in-step stage's events: the finished trials' times are read into the plan's samples; once
// every finalist has kInStepSamples, the lowest median is the plan's algorithm (a finalist within
// 1% of it that was faster in the first timing wins ties) and the stage ends.
void read_trials(const LtGemm& g, LtPlan& p) {
  size_t kept = 0;
  for (LtPlan::Trial& t : p.pending) {
    const cudaError_t q = cudaEventQuery(t.stop);
    if (q == cudaErrorNotReady) {
      p.pending[kept++] = t;
      continue;
    }
    CAI_CUDA_CHECK(q);
    float ms = 0;
    CAI_CUDA_CHECK(cudaEventElapsedTime(&ms, t.start, t.stop));
    p.samples[t.finalist].push_back(ms);
    p.spare.push_back(t.start);
    p.spare.push_back(t.stop);
  }
  p.pending.resize(kept);
  for (const auto& s : p.samples)
    if (s.size() < static_cast<size_t>(kInStepSamples)) return;
  std::vector<float> median(p.samples.size());
  for (size_t i = 0; i < p.samples.size(); ++i) {
    std::vector<float> s = p.samples[i];
    std::sort(s.begin(), s.end());
    median[i] = s.size() % 2 ? s[s.size() / 2] : 0.5f * (s[s.size() / 2 - 1] + s[s.size() / 2]);
  }
  const float best = *std::min_element(median.begin(), median.end());
  size_t chosen = 0;
  while (median[chosen] > best * 1.01f) ++chosen;
  if (tune_log()) {
    std::string line;
    for (float t : median) line += " " + std::to_string(t);
    std::fprintf(stderr, "[gemm tune] in step: m %lld n %lld k %lld op %d%d medians%s -> %zu\n",
                 static_cast<long long>(g.m), static_cast<long long>(g.n),
                 static_cast<long long>(g.k), static_cast<int>(g.ta), static_cast<int>(g.tb),
                 line.c_str(), chosen);
  }
  p.algo = p.finalists[chosen];
  end_trials(p);
  p.tuned = true;
}
}  // namespace

void set_gemm_timing(bool on) {
  timing_flag().store(on);
}
void set_gemm_sm_margin(int sms) {
  CAI_CHECK(sms >= 0, "[gemm] SM margin {}: expected 0 or more SMs", sms);
  sm_margin().store(sms);
}
int gemm_sm_margin() {
  return sm_margin().load();
}
bool gemm_timing() {
  return timing_flag().load();
}

std::mutex& cublas_mutex() {
  return blas().mu;
}

cublasHandle_t cublas_handle_locked(cudaStream_t stream) {
  int device = 0;
  CAI_CUDA_CHECK(cudaGetDevice(&device));
  auto& hs = blas().handles;
  auto it = hs.find(device);
  if (it == hs.end()) {
    cublasHandle_t h = nullptr;
    CAI_CUDA_CHECK(cublasCreate(&h));
    const cublasStatus_t s = cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);  // FP32, no TF32
    if (s != CUBLAS_STATUS_SUCCESS) cublasDestroy(h);
    CAI_CUDA_CHECK(s);
    it = hs.emplace(device, h).first;
  }
  CAI_CUDA_CHECK(cublasSetStream(it->second, stream));
  return it->second;
}

uint64_t lt_gelu_epilogue_runs() {
  return lt().gelu_runs.load();
}
uint64_t lt_in_step_runs() {
  return lt().in_step_runs.load();
}

bool lt_matmul(const LtGemm& g, const void* a, const void* b, void* d, const void* bias,
               float alpha, float beta, cudaStream_t stream, const void* aux, const void* c) {
  if (!c) c = d;
  const bool gelu = g.epilogue != LtEpilogue::kDefault;
  if (gelu) {
    // cuBLASLt's constraints on the aux matrix (its ld a multiple of 8, ≥ the rows); the DGELU
    // epilogue has no bias.
    if (!aux || g.ldaux % 8 != 0 || g.ldaux < g.m) return false;
    if (g.epilogue == LtEpilogue::kDGelu && bias) return false;
  }
  int device = 0;
  CAI_CUDA_CHECK(cudaGetDevice(&device));
  Lt& l = lt();
  std::lock_guard<std::mutex> lock(l.mu);
  auto hit = l.handles.find(device);
  if (hit == l.handles.end()) {
    cublasLtHandle_t h = nullptr;
    CAI_CUDA_CHECK(cublasLtCreate(&h));
    hit = l.handles.emplace(device, h).first;
  }
  auto wit = l.workspaces.find({device, stream});
  if (wit == l.workspaces.end())
    wit = l.workspaces.emplace(std::pair{device, stream}, alloc(kLtWorkspace, device)).first;

  // C and D share a layout: the plan assumes the smaller of their alignments for both.
  const uint32_t align[4] = {alignment(a), alignment(b), std::min(alignment(c), alignment(d)),
                             bias ? alignment(bias) : 0u};
  const LtKey key{device,
                  g.ab,
                  g.cd,
                  g.compute,
                  g.ta,
                  g.tb,
                  g.m,
                  g.n,
                  g.k,
                  g.lda,
                  g.ldb,
                  g.ldd,
                  bias != nullptr,
                  align[0],
                  align[1],
                  align[2],
                  align[3],
                  static_cast<int64_t>(g.epilogue),
                  g.ldaux,
                  gelu ? alignment(aux) : 0,
                  sm_margin().load()};
  auto pit = l.plans.find(key);
  if (pit == l.plans.end()) {
    LtPlan p;
    build_plan(hit->second, g, bias, aux, align, static_cast<int>(key[20]), device, p);
    pit = l.plans.emplace(key, p).first;
  }
  LtPlan& p = pit->second;
  if (!p.ok) return false;
  if (bias) set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  if (gelu) set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);  // plans are shared
  if (!p.tuned && !timing_flag().load()) {
    // Turned off since the plan was made: the heuristic's first, as in every other process.
    end_trials(p);
    p.candidates.clear();
    p.algo = p.first;
    p.tuned = true;
  }
  std::optional<LtPlan::Trial> trial;  // the in-step stage: this call times a finalist
  if (!p.tuned) {
    // Not while a graph is being captured (the host cannot wait for the timing there, and a
    // captured call runs again and again with the algorithm it was captured with).
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    CAI_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    const bool capturing = capture != cudaStreamCaptureStatusNone;
    if (!capturing && !p.candidates.empty()) {
      if (beta == 0.f || c != d) {
        tune(hit->second, g, p, a, b, d, c, alpha, beta, wit->second, stream);
      } else {
        // D accumulates (a weight gradient): the timing writes a scratch D, up to 64 MiB; a
        // larger one goes to the in-step stage with the heuristic's first kFinalists.
        const size_t bytes = static_cast<size_t>(g.ldd) * static_cast<size_t>(g.n) *
                             (g.cd == CUDA_R_32F   ? 4
                              : g.cd == CUDA_R_64F ? 8
                                                   : 2);
        if (bytes <= (size_t{64} << 20)) {
          void* scratch = alloc(bytes, device);
          try {
            tune(hit->second, g, p, a, b, scratch, c, alpha, beta, wit->second, stream);
          } catch (...) {
            free(scratch, device);
            throw;
          }
          free(scratch, device);
        } else {
          const size_t n = std::min(p.candidates.size(), static_cast<size_t>(kFinalists));
          p.finalists.assign(p.candidates.begin(), p.candidates.begin() + n);
          p.samples.assign(n, {});
          p.candidates.clear();
        }
      }
    } else if (!capturing) {
      // The in-step stage: this call runs the next finalist between two events.
      read_trials(g, p);
      if (!p.tuned) {
        trial = LtPlan::Trial{p.turn++ % p.finalists.size(), nullptr, nullptr};
        for (cudaEvent_t* e : {&trial->start, &trial->stop}) {
          if (!p.spare.empty()) {
            *e = p.spare.back();
            p.spare.pop_back();
          } else {
            CAI_CUDA_CHECK(cudaEventCreate(e));
          }
        }
        p.pending.push_back(*trial);  // the plan owns the events from here
      }
    }
  }
  auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(hit->second, p.desc, &alpha, a, p.a, b, p.b, &beta, c, p.d, d, p.d, &algo,
                          wit->second, kLtWorkspace, stream);
  };
  if (!trial) {
    CAI_CUDA_CHECK(run(p.algo));
  } else {
    CAI_CUDA_CHECK(cudaEventRecord(trial->start, stream));
    if (run(p.finalists[trial->finalist]) == CUBLAS_STATUS_SUCCESS) {
      CAI_CUDA_CHECK(cudaEventRecord(trial->stop, stream));
      ++l.in_step_runs;
    } else {
      // Not for this problem after all (a finalist the first call did not time): the stage
      // ends with the current algorithm, which runs this call.
      end_trials(p);
      p.tuned = true;
      CAI_CUDA_CHECK(run(p.algo));
    }
  }
  if (gelu) ++l.gelu_runs;
  return true;
}

}  // namespace cai::kernels::cuda
