#include "report.h"

#include <cctype>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>

#include "cai/core/trace.h"

namespace cai::sim {

namespace {

std::string label_of(const Workload& w, size_t r) {
  return w.ranks[r].label.empty() ? fmt::format("rank {}", r) : w.ranks[r].label;
}

}  // namespace

std::string result_json(const Workload& w, const ReplayResult& r) {
  using nlohmann::json;
  bool fits = true;
  for (const RankResult& rr : r.ranks) fits = fits && rr.peak_mem <= r.memory_limit;
  json peak = json::array(), comp = json::array(), comm = json::array(), commt = json::array(),
       idle = json::array(), at_peak = json::array();
  // Per job rank: every copy repeats the simulated one's figures.
  for (size_t i = 0; i < r.ranks.size() * static_cast<size_t>(r.copies); ++i) {
    const RankResult& rr = r.ranks[i % r.ranks.size()];
    peak.push_back(rr.peak_mem);
    comp.push_back(rr.compute_s * 1e3);
    comm.push_back(rr.comm_s * 1e3);
    commt.push_back(rr.comm_total_s * 1e3);
    idle.push_back(rr.idle_s * 1e3);
    json k = json::object();
    for (int i = 0; i < kMemKinds; ++i) k[mem_kind_name(MemKind(i))] = rr.mem_at_peak[i];
    at_peak.push_back(k);
  }
  json j = {{"workload", w.name},
            {"cluster", r.cluster},
            {"nproc", w.job_ranks()},
            {"simulated_ranks", w.ranks.size()},
            {"copies", w.copies},
            {"dtype", dtype_name(w.dtype)},
            {"collectives", collective_model_name(r.collectives)},
            {"step_ms", r.step_s * 1e3},
            {"img_per_s", r.img_per_s},
            {"global_batch", w.global_batch},
            {"bubble", r.bubble},
            {"bubble_mean", r.bubble_mean},
            {"bubble_measured", r.bubble_measured},
            {"memory_limit_bytes", r.memory_limit},
            {"fits_memory", fits},
            {"peak_mem_bytes", peak},
            {"mem_at_peak", at_peak},
            {"compute_ms", comp},
            {"comm_ms", comm},
            {"comm_total_ms", commt},
            {"idle_ms", idle},
            {"wall_s", r.wall_s},
            {"simgrid_s", r.simgrid_s},
            {"compute_ops_timed",
             {{"given", r.timing.given},
              {"measured", r.timing.measured},
              {"interpolated", r.timing.interpolated},
              {"roofline", r.timing.roofline}}},
            {"comm_ops_timed",
             {{"measured", r.timing.comm_measured},
              {"interpolated", r.timing.comm_interpolated},
              {"flows", r.timing.comm_flows},
              {"network", r.timing.comm_network}}},
            {"host_ops_timed",
             {{"measured", r.timing.host_measured}, {"placeholder", r.timing.host_placeholder}}}};
  return j.dump(1);
}

std::string result_trace(const Workload& w, const ReplayResult& r) {
  const size_t R = w.ranks.size();
  std::vector<std::string> arrays;
  for (size_t k = 0; k < R; ++k) {
    const RankProgram& rp = w.ranks[k];
    const RankResult& rr = r.ranks[k];
    std::map<int, trace::Recorder> streams;
    streams[0];
    for (size_t i = 0; i < rp.ops.size(); ++i)
      streams[rp.ops[i].stream].span(rp.ops[i].name, rp.ops[i].category, rr.spans[i].start * 1e6,
                                     rr.spans[i].end * 1e6);
    for (const MemPoint& m : rr.memory) streams[0].memory(m.t * 1e6, m.bytes);
    streams[0].span("step", "step", 0.0, rr.end_s * 1e6);
    for (auto& [s, rec] : streams)
      arrays.push_back(rec.events_json(
          static_cast<int>(s * R + k),
          s == 0 ? label_of(w, k) : fmt::format("{} stream {}", label_of(w, k), s), 0.0));
  }
  return trace::chrome_trace(arrays);
}

std::string result_summary(const Workload& w, const ReplayResult& r) {
  auto minmax = [&](auto get) {
    double lo = 1e300, hi = -1e300;
    for (const RankResult& rr : r.ranks) lo = std::min(lo, get(rr)), hi = std::max(hi, get(rr));
    return fmt::format("{:.3f}..{:.3f} ms", lo * 1e3, hi * 1e3);
  };
  int64_t peak = 0;
  for (const RankResult& rr : r.ranks) peak = std::max(peak, rr.peak_mem);
  std::vector<std::string> b;
  for (double x : r.bubble) b.push_back(fmt::format("{:.4f}", x));
  std::string s =
      w.copies > 1
          ? fmt::format("{} on {} ({} ranks as {} identical copies of {}, {} collectives)\n",
                        w.name, r.cluster, w.job_ranks(), w.copies, w.ranks.size(),
                        collective_model_name(r.collectives))
          : fmt::format("{} on {} ({} ranks, {} collectives)\n", w.name, r.cluster, w.ranks.size(),
                        collective_model_name(r.collectives));
  s += fmt::format("  step {:.3f} ms", r.step_s * 1e3);
  if (r.img_per_s > 0)
    s += fmt::format(", {:.1f} img/s (global batch {})", r.img_per_s, w.global_batch);
  s += fmt::format("\n  bubble per stage [{}], mean {:.4f}\n", fmt::join(b, ", "), r.bubble_mean);
  s += fmt::format("  compute {}, exposed comm {}, idle {} (per rank)\n",
                   minmax([](const RankResult& x) { return x.compute_s; }),
                   minmax([](const RankResult& x) { return x.comm_s; }),
                   minmax([](const RankResult& x) { return x.idle_s; }));
  s += fmt::format("  peak memory {:.3f} GiB (largest rank) of {:.1f} GiB{}\n",
                   peak / (1024.0 * 1024 * 1024), r.memory_limit / (1024.0 * 1024 * 1024),
                   peak > r.memory_limit ? ": DOES NOT FIT" : "");
  const TimingSources& t = r.timing;
  if (t.measured + t.interpolated > 0)
    s += fmt::format(
        "  compute ops of rank 0: {} measured by the calibration, {} interpolated between its "
        "samples, {} from the roofline, {} given\n",
        t.measured, t.interpolated, t.roofline, t.given);
  if (!t.gpu_time_factors.empty()) {
    std::vector<std::string> f;
    for (double x : t.gpu_time_factors) f.push_back(x > 0 ? fmt::format("{:.3f}", x) : "-");
    s += fmt::format(
        "  GPU speeds (the profile's gpu_speeds): compute time × {} on GPU 0, 1, ... of a node\n",
        fmt::join(f, " / "));
  }
  if (t.posted_share >= 0)
    s += fmt::format(
        "  posted receives: each holds {:.1f}% of its GPU until its data is in (the profile's "
        "{}{})\n",
        100 * t.posted_share,
        t.posted_micro_batch > 0 ? "posted share at micro-batch " : "posted or overlap share",
        t.posted_micro_batch > 0 ? std::to_string(t.posted_micro_batch) : std::string());
  if (t.comm_flows > 0)
    s += fmt::format(
        "  collectives and sends: {} as flows over links fitted to the calibration's collectives, "
        "{} from the network model\n",
        t.comm_flows, t.comm_network);
  else if (t.comm_measured + t.comm_interpolated + t.comm_network > 0)
    s += fmt::format(
        "  collectives and sends: {} measured by the calibration, {} interpolated between its "
        "samples (the measured time, slept), {} from the network model\n",
        t.comm_measured, t.comm_interpolated, t.comm_network);
  s += fmt::format("  wall_s {:.3f} (SimGrid {:.3f})\n", r.wall_s, r.simgrid_s);
  return s;
}

namespace {
// The device family a name holds: "H100", "H200", "A100", ... (a letter and 2-3 digits after a
// space or "NVIDIA"), "cpu" for CPUs; empty when none is recognised.
std::string device_family(const std::string& name, bool cpu) {
  if (cpu) return "cpu";
  for (size_t i = 0; i + 3 < name.size() + 1; ++i) {
    if (!std::isupper(static_cast<unsigned char>(name[i])) || (i > 0 && name[i - 1] != ' '))
      continue;
    size_t j = i + 1;
    while (j < name.size() && std::isdigit(static_cast<unsigned char>(name[j]))) ++j;
    if (j - i >= 3 && j - i <= 4) return name.substr(i, j - i);
  }
  if (name.rfind("cpu", 0) == 0) return "cpu";
  return "";
}
}  // namespace

std::vector<std::string> result_warnings(const Workload& w, const ReplayResult& r, const Cluster& c,
                                         const Calibration& cal) {
  std::vector<std::string> out;
  const TimingSources& t = r.timing;
  const int64_t ops = t.measured + t.interpolated + t.roofline;
  if (t.roofline > 0)
    out.push_back(fmt::format(
        "{} of {} compute ops of rank 0 timed by the roofline's placeholder efficiencies{}: their "
        "times are a guess (measure a profile on the device: colossalai benchmark --calibrate)",
        t.roofline, ops, cal.samples.empty() ? " (no --calibration)" : " (no profile sample)"));
  if (t.comm_network > 0)
    out.push_back(fmt::format(
        "{} of {} collectives and sends timed by the cluster file's nominal links (no profile "
        "sample of that op and group size)",
        t.comm_network, t.comm_measured + t.comm_interpolated + t.comm_network));
  if (t.host_placeholder > 0)
    out.push_back(fmt::format(
        "{} of {} offload host copies and host ops of rank 0 timed by placeholders (the cluster "
        "file's host link {:.0f} GB/s, host Adam {:.2g} elements/s, host add {:.0f} GB/s: the "
        "profile has no \"host\" entry for them; colossalai benchmark --calibrate measures it)",
        t.host_placeholder, t.host_measured + t.host_placeholder, c.host.bandwidth / 1e9,
        kHostAdamElementsPerS, kHostAddBytesPerS / 1e9));
  if (cal.posted_max_ctas >= 0 && w.p2p_max_ctas >= 0 &&
      (cal.posted_max_ctas != w.p2p_max_ctas || cal.posted_gemm_sm_margin != w.gemm_sm_margin)) {
    auto blocks = [](int n) {
      return n > 0 ? fmt::format("{} thread blocks", n) : std::string("NCCL's own thread blocks");
    };
    out.push_back(fmt::format(
        "the profile's posted receive was measured over channels of {} with the GEMMs leaving {} "
        "SMs; this pipeline runs {} with {} (parallel.p2p_max_ctas, gemm_sm_margin): its "
        "receives take the profile's share of the GPU (colossalai benchmark --calibrate with the "
        "run's config measures its own)",
        blocks(cal.posted_max_ctas), cal.posted_gemm_sm_margin, blocks(w.p2p_max_ctas),
        w.gemm_sm_margin));
  }
  if (!cal.samples.empty() && !cal.device.empty()) {
    const bool cpu_cluster = c.intra.fabric == Fabric::SharedMemory;
    const std::string a = device_family(cal.device, false),
                      b = device_family(c.gpu.model, cpu_cluster);
    if (!a.empty() && !b.empty() && a != b)
      out.push_back(fmt::format("the profile was measured on {} ({}), the cluster {} has {} ({})",
                                a, cal.device, r.cluster, b, c.gpu.model));
    const std::string want = fmt::format(", {})", dtype_name(w.dtype));
    if (cal.device.find(" (") != std::string::npos && cal.device.find(want) == std::string::npos)
      out.push_back(fmt::format("the profile ({}) was not measured in {}, the workload's dtype",
                                cal.device, dtype_name(w.dtype)));
  }
  return out;
}

}  // namespace cai::sim
