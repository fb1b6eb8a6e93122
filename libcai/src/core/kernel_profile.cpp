#include "cai/core/kernel_profile.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <type_traits>

#include <fmt/format.h>

#if defined(CAI_HAVE_CUDA) && __has_include(<cupti.h>)
#define CAI_PROFILE_CUPTI 1
#include <cupti.h>
#include <dlfcn.h>
#endif

#include "cai/core/error.h"
#include "cai/core/trace.h"

namespace cai::profile {
namespace {

std::string demangle(const char* name) {
  if (!name) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : name;
  std::free(d);
  return s;
}

// Broad kind of a kernel from its name, for the per-category table.
std::string category(const std::string& n) {
  auto has = [&](const char* k) { return n.find(k) != std::string::npos; };
  // First: NCCL's kernel names hold words of the other kinds ("Broadcast" holds "cast").
  if (has("nccl")) return "communication (NCCL)";
  if (has("memcpy")) return "memcpy";
  if (has("memset")) return "memset";
  // Attention before the GEMMs: the Hopper attention kernels (ours and cuDNN's) hold "sm90".
  if (has("flash") || has("attention") || has("attn") || has("sdpa")) return "attention";
  if (has("gemm") || has("xmma") || has("cutlass") || has("Kernel2") || has("sm90_"))
    return "GEMM (cuBLAS)";
  if (has("layernorm") || has("layer_norm")) return "layernorm";
  if (has("gelu")) return "GELU";
  if (has("adam") || has("lamb") || has("clip") || has("grad_stats") || has("sum_squares") ||
      has("multi_tensor"))
    return "optimizer / clipping";
  if (has("cross_entropy") || has("loss")) return "loss";
  if (has("reduce") || has("col_sum") || has("bias")) return "reductions (bias grads)";
  if (has("cast") || has("convert")) return "casts";
  if (has("add") || has("axpy") || has("scale") || has("fill") || has("copy")) return "elementwise";
  return "other";
}

std::string short_name(const std::string& n) {
  // Keep the function and its first template arguments; drop the parameter list.
  std::string s = n;
  for (const std::string drop : {"(anonymous namespace)::", "cai::kernels::cuda::"})
    for (size_t at; (at = s.find(drop)) != std::string::npos;) s.erase(at, drop.size());
  // The parameter list: the last '(' at template depth 0.
  int depth = 0;
  size_t params = std::string::npos;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    if (s[i] == '>') --depth;
    if (s[i] == '(' && depth == 0) params = i;
  }
  if (params != std::string::npos && params > 0) s = s.substr(0, params);
  if (s.rfind("void ", 0) == 0) s = s.substr(5);
  if (s.size() > 110) s = s.substr(0, 107) + "...";
  return s;
}

#ifdef CAI_PROFILE_CUPTI
// The CUPTI entry points, resolved once from the library found at run time.
struct Cupti {
  CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc,
                                    CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*disable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*flush_all)(uint32_t) = nullptr;
  CUptiResult (*next_record)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
  CUptiResult (*result_string)(CUptiResult, const char**) = nullptr;
};

const Cupti& cupti() {
  static const Cupti api = [] {
    void* lib = nullptr;
    std::string tried;
    for (const char* name : {"libcupti.so.13", "libcupti.so", "/usr/local/cuda/lib64/libcupti.so",
                             "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so"}) {
      if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
      tried += tried.empty() ? name : std::string(", ") + name;
    }
    CAI_CHECK(lib,
              "[profile] CUPTI not found (tried {}): add the CUDA toolkit's CUPTI folder "
              "(extras/CUPTI/lib64 or lib64) to LD_LIBRARY_PATH",
              tried);
    Cupti a;
    auto get = [&](auto& fn, const char* sym) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, sym));
      CAI_CHECK(fn, "[profile] CUPTI has no {}", sym);
    };
    get(a.register_callbacks, "cuptiActivityRegisterCallbacks");
    get(a.enable, "cuptiActivityEnable");
    get(a.disable, "cuptiActivityDisable");
    get(a.flush_all, "cuptiActivityFlushAll");
    get(a.next_record, "cuptiActivityGetNextRecord");
    get(a.result_string, "cuptiGetResultString");
    return a;
  }();
  return api;
}

struct Collector {
  std::mutex mu;
  std::vector<KernelRecord> records;
};
Collector& collector() {
  static Collector c;
  return c;
}

void check(CUptiResult r, const char* what) {
  if (r != CUPTI_SUCCESS) {
    const char* s = nullptr;
    cupti().result_string(r, &s);
    fail("[profile] CUPTI {}: {}", what, s ? s : "unknown error");
  }
}

constexpr size_t kBufferBytes = 16u << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::vector<KernelRecord> got;
  while (cupti().next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
    KernelRecord k;
    if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ||
        rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* a = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      k.name = demangle(a->name);
      k.start_ns = a->start, k.end_ns = a->end, k.stream = a->streamId;
      k.grid = a->gridX * a->gridY * a->gridZ, k.block = a->blockX * a->blockY * a->blockZ;
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* a = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
      k.name = fmt::format("memcpy kind {} ({} bytes)", static_cast<int>(a->copyKind),
                           static_cast<unsigned long long>(a->bytes));
      k.start_ns = a->start, k.end_ns = a->end, k.stream = a->streamId;
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* a = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
      k.name = "memset";
      k.start_ns = a->start, k.end_ns = a->end, k.stream = a->streamId;
    } else {
      continue;
    }
    got.push_back(std::move(k));
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(collector().mu);
  for (auto& k : got) collector().records.push_back(std::move(k));
}
#endif

}  // namespace

bool kernel_profile_available() {
#ifdef CAI_PROFILE_CUPTI
  return true;
#else
  return false;
#endif
}

void kernel_profile_start() {
#ifdef CAI_PROFILE_CUPTI
  {
    std::lock_guard<std::mutex> lock(collector().mu);
    collector().records.clear();
  }
  check(cupti().register_callbacks(buffer_requested, buffer_completed), "register callbacks");
  check(cupti().enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernels");
  check(cupti().enable(CUPTI_ACTIVITY_KIND_MEMCPY), "enable memcpy");
  check(cupti().enable(CUPTI_ACTIVITY_KIND_MEMSET), "enable memset");
#else
  fail("[profile] this build has no CUDA (kernel profiles need CUPTI)");
#endif
}

std::vector<KernelRecord> kernel_profile_stop() {
#ifdef CAI_PROFILE_CUPTI
  check(cupti().flush_all(1), "flush");
  cupti().disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cupti().disable(CUPTI_ACTIVITY_KIND_MEMCPY);
  cupti().disable(CUPTI_ACTIVITY_KIND_MEMSET);
  std::vector<KernelRecord> out;
  {
    std::lock_guard<std::mutex> lock(collector().mu);
    out.swap(collector().records);
  }
  std::sort(out.begin(), out.end(),
            [](const KernelRecord& a, const KernelRecord& b) { return a.start_ns < b.start_ns; });
  return out;
#else
  fail("[profile] this build has no CUDA (kernel profiles need CUPTI)");
#endif
}

void write_kernel_profile(const std::string& path, const std::vector<KernelRecord>& records,
                          int steps, double wall_ms_per_step, const std::string& title,
                          const std::string& extra) {
  struct Row {
    double ns = 0;
    int64_t calls = 0;
    std::string cat;
  };
  std::map<std::string, Row> by_name;
  std::map<std::string, double> by_cat;
  double total = 0;
  for (const auto& r : records) {
    const double d = static_cast<double>(r.end_ns - r.start_ns);
    Row& row = by_name[short_name(r.name)];
    row.ns += d, row.calls += 1, row.cat = category(r.name);
    by_cat[row.cat] += d;
    total += d;
  }
  // GPU busy time: the union of all intervals (streams may overlap), in ns.
  std::vector<trace::Interval> intervals;
  for (const auto& r : records)
    intervals.push_back({static_cast<double>(r.start_ns), static_cast<double>(r.end_ns)});
  const double busy =
      trace::covered_us(std::move(intervals), -std::numeric_limits<double>::infinity(),
                        std::numeric_limits<double>::infinity());
  const double per = 1e6 * steps;  // ns -> ms per step
  std::vector<std::pair<std::string, Row>> rows(by_name.begin(), by_name.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  std::ofstream f(path);
  CAI_CHECK(f, "[profile] cannot write the kernel profile {}", path);
  f << "# " << title << "\n\n";
  f << fmt::format(
      "Wall time {:.2f} ms per step; GPU busy (union of kernels and copies) {:.2f} ms ({:.1f}%); "
      "sum of kernel times {:.2f} ms; {} kernels per step. {} profiled steps (CUPTI activity "
      "records).\n\n",
      wall_ms_per_step, busy / per, 100.0 * busy / per / wall_ms_per_step, total / per,
      records.size() / std::max(steps, 1), steps);
  f << extra;
  f << "## By category\n\n| category | ms per step | share |\n| --- | ---: | ---: |\n";
  std::vector<std::pair<std::string, double>> cats(by_cat.begin(), by_cat.end());
  std::sort(cats.begin(), cats.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  for (const auto& [c, ns] : cats)
    f << fmt::format("| {} | {:.2f} | {:.1f}% |\n", c, ns / per, 100.0 * ns / total);
  f << "\n## By kernel\n\n| kernel | category | calls per step | ms per step | share | mean µs |\n"
       "| --- | --- | ---: | ---: | ---: | ---: |\n";
  for (const auto& [n, r] : rows)
    f << fmt::format("| `{}` | {} | {:g} | {:.3f} | {:.1f}% | {:.1f} |\n", n, r.cat,
                     static_cast<double>(r.calls) / steps, r.ns / per, 100.0 * r.ns / total,
                     r.ns / 1e3 / static_cast<double>(r.calls));
  std::ofstream csv(path + ".csv");
  csv << "index,start_us,duration_us,stream,grid,block,name\n";
  const size_t one = records.size();
  const uint64_t t0 = records.empty() ? 0 : records.front().start_ns;
  for (size_t i = 0; i < one; ++i) {
    const auto& r = records[i];
    std::string n = short_name(r.name);
    std::replace(n.begin(), n.end(), ',', ';');
    csv << fmt::format("{},{:.1f},{:.1f},{},{},{},{}\n", i, (r.start_ns - t0) / 1e3,
                       (r.end_ns - r.start_ns) / 1e3, r.stream, r.grid, r.block, n);
  }
}

}  // namespace cai::profile
