#include "cmd_check.h"

#include <fmt/format.h>
#include <mpi.h>

#include <filesystem>
#include <iostream>

#include "cai/core/version.h"
#include "kernels/attention.h"
#include "kernels/device.h"

namespace cai::app {

namespace {
std::string cuda_version(int v) {
  if (v <= 0) return "-";
  return fmt::format("{}.{}", v / 1000, (v % 1000) / 10);
}
const char* mark(Verdict v) {
  switch (v) {
    case Verdict::Ok:
      return "✓";
    case Verdict::Fail:
      return "✗";
    case Verdict::NotApplicable:
      return "N/A";
  }
  return "?";
}
}  // namespace

std::vector<CheckRow> collect_installation_report(const std::string& self_dir, bool* usable) {
  std::vector<CheckRow> rows;
  *usable = true;
  rows.push_back({"libcai", fmt::format("{} ({})", cai::version(), cai::git_hash()), Verdict::Ok,
                  "library version and commit"});
  rows.push_back({"compiler", CAI_CXX_COMPILER, Verdict::Ok, "C++20"});
  rows.push_back({"OpenBLAS", kernels::cpu::blas_info(), Verdict::Ok,
                  fmt::format("CPU GEMM; {} CPU kernel threads", kernels::cpu::max_threads())});

  char mpi_lib[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  if (MPI_Get_library_version(mpi_lib, &len) == MPI_SUCCESS) {
    std::string s(mpi_lib, len);
    if (auto nl = s.find_first_of(",\n"); nl != std::string::npos) s = s.substr(0, nl);
    rows.push_back({"MPI", s, Verdict::Ok, "CPU collectives and multi-node launch"});
  } else {
    rows.push_back({"MPI", "-", Verdict::Fail, "MPI_Get_library_version failed"});
  }

  const kernels::cuda::RuntimeInfo ci = kernels::cuda::runtime_info();
  if (!ci.compiled) {
    for (const char* c : {"CUDA (compiled)", "CUDA runtime", "CUDA driver", "cuBLAS", "NCCL"})
      rows.push_back(
          {c, "-", Verdict::NotApplicable, "this build has no CUDA (CAI_WITH_CUDA=OFF)"});
  } else {
    rows.push_back({"CUDA (compiled)", cuda_version(ci.compiled_version), Verdict::Ok,
                    "toolkit libcai was built with"});
    const bool rt_ok = ci.runtime_version > 0;
    rows.push_back({"CUDA runtime", cuda_version(ci.runtime_version),
                    rt_ok ? Verdict::Ok : Verdict::Fail,
                    rt_ok ? "libcudart loaded" : "cudaRuntimeGetVersion failed"});
    if (ci.driver_version > 0) {
      const bool new_enough = ci.driver_version >= ci.compiled_version;
      rows.push_back({"CUDA driver", cuda_version(ci.driver_version),
                      new_enough ? Verdict::Ok : Verdict::Fail,
                      new_enough ? "supports the compiled CUDA version"
                                 : "older than the compiled CUDA version: update the driver"});
    } else {
      rows.push_back({"CUDA driver", "no driver", Verdict::NotApplicable,
                      "no NVIDIA driver on this machine: GPU features unavailable, CPU works"});
    }
    rows.push_back({"cuBLAS",
                    ci.cublas_version
                        ? fmt::format("{}.{}.{}", ci.cublas_version / 10000,
                                      ci.cublas_version / 100 % 100, ci.cublas_version % 100)
                        : "-",
                    ci.cublas_version ? Verdict::Ok : Verdict::Fail, "GEMMs on the GPU"});
    rows.push_back({"NCCL",
                    ci.nccl_version
                        ? fmt::format("{}.{}.{}", ci.nccl_version / 10000,
                                      ci.nccl_version / 100 % 100, ci.nccl_version % 100)
                        : "-",
                    ci.nccl_version ? Verdict::Ok : Verdict::Fail, "GPU collectives"});
  }

  const std::string archs =
      ci.architectures.empty() ? "-" : fmt::format("sm_{}", fmt::join(ci.architectures, ", sm_"));
  rows.push_back({"CUDA architectures", archs, ci.compiled ? Verdict::Ok : Verdict::NotApplicable,
                  ci.compiled ? "kernels compiled for these" : "no CUDA kernels in this build"});
  if (!ci.compiled)
    rows.push_back({"attention kernels", "-", Verdict::NotApplicable, "no CUDA kernels"});
  else if (ci.hopper_attention)
    rows.push_back({"attention kernels", "wgmma (sm_90a) + mma.sync", Verdict::Ok,
                    kernels::cuda::flash_attention_sm90_default()
                        ? "wgmma for head dim 64 on compute capability 9.0, mma.sync otherwise "
                          "(CAI_FLASH_SM90=0: mma.sync everywhere)"
                        : "CAI_FLASH_SM90=0: mma.sync everywhere"});
  else
    rows.push_back({"attention kernels", "mma.sync", Verdict::Ok,
                    "no Hopper (wgmma) kernels: the build's architectures lack 90"});
  if (ci.devices.empty()) {
    rows.push_back({"GPUs", "none", Verdict::NotApplicable,
                    ci.device_error.empty() ? "no GPU found" : "no GPU: " + ci.device_error});
  }
  for (const auto& d : ci.devices) {
    const int cc = d.cc_major * 10 + d.cc_minor;
    bool match = false;
    for (int a : ci.architectures) match = match || (a / 10 == d.cc_major && a <= cc);
    rows.push_back(
        {fmt::format("GPU {}", d.index),
         fmt::format("{}, sm_{}, {:.1f} GiB, {} SMs", d.name, cc,
                     static_cast<double>(d.total_memory) / (1ull << 30), d.multiprocessors),
         match ? Verdict::Ok : Verdict::Fail,
         match ? "kernels compiled for this architecture"
               : fmt::format("no kernels for sm_{}: rebuild with -DCAI_CUDA_ARCHITECTURES={}", cc,
                             cc)});
  }

  const bool sim_binary =
      std::filesystem::exists(std::filesystem::path(self_dir) / "sim" / "colossalai-sim") ||
      std::filesystem::exists(std::filesystem::path(self_dir) / "colossalai-sim");
  if (CAI_HAVE_SIM)
    rows.push_back(
        {"SimGrid", CAI_SIMGRID_VERSION, sim_binary ? Verdict::Ok : Verdict::NotApplicable,
         sim_binary ? "linked into colossalai-sim only"
                    : "built with SimGrid, but colossalai-sim is not beside this binary"});
  else
    rows.push_back({"SimGrid", "-", Verdict::NotApplicable, "simulator not built (CAI_WITH_SIM)"});
  rows.push_back({"GUI", CAI_HAVE_GUI ? "ImGui + GLFW found" : "-", Verdict::NotApplicable,
                  CAI_HAVE_GUI ? "the schedule explorer is not built yet"
                               : "ImGui/GLFW not found (CAI_WITH_GUI)"});

  for (const auto& r : rows)
    if (r.verdict == Verdict::Fail && (r.component == "libcai" || r.component == "OpenBLAS"))
      *usable = false;
  return rows;
}

void print_report(const std::vector<CheckRow>& rows, std::ostream& os) {
  size_t w0 = 9, w1 = 5;
  for (const auto& r : rows) {
    w0 = std::max(w0, r.component.size());
    w1 = std::max(w1, r.value.size());
  }
  w1 = std::min<size_t>(w1, 60);
  os << "ColossalAI-cpp installation report\n\n";
  os << fmt::format("  {:<{}}  {:<{}}  {:<6} {}\n", "Component", w0, "Value", w1, "Status", "Note");
  os << fmt::format("  {:-<{}}  {:-<{}}  {:-<6} {:-<20}\n", "", w0, "", w1, "", "");
  for (const auto& r : rows) {
    std::string v = r.value.size() > w1 ? r.value.substr(0, w1 - 3) + "..." : r.value;
    // ✓/✗ are 3 bytes but one column wide: pad by display width.
    const std::string m = mark(r.verdict);
    const size_t width = r.verdict == Verdict::NotApplicable ? 3 : 1;
    os << fmt::format("  {:<{}}  {:<{}}  {}{} {}\n", r.component, w0, v, w1, m,
                      std::string(6 - width, ' '), r.note);
  }
}

void setup_check(CLI::App& app, CheckOptions& opts) {
  auto* sub = app.add_subcommand("check", "Check the installation and the machine");
  sub->add_flag("-i,--installation", opts.installation,
                "Report versions (libcai, compiler, OpenBLAS, MPI, CUDA, cuBLAS, NCCL, SimGrid), "
                "GPUs and compiled CUDA architectures");
}

int run_check(const CheckOptions& opts, const std::string& self_dir) {
  if (!opts.installation) {
    std::cerr << "colossalai check: nothing to check; use -i for the installation report\n";
    return 2;
  }
  bool usable = false;
  print_report(collect_installation_report(self_dir, &usable), std::cout);
  std::cout << "\n" << (usable ? "Usable: yes" : "Usable: NO (see the ✗ rows)") << "\n";
  return usable ? 0 : 1;
}

}  // namespace cai::app
