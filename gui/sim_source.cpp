#include "sim_source.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "cai/core/error.h"
#include "cluster.h"
#include "from_config.h"
#include "replay.h"

namespace cai::gui {

namespace {

MemoryPoint memory_point(const sim::MemPoint& m) {
  auto kind = [&](sim::MemKind k) { return static_cast<double>(m.kinds[static_cast<int>(k)]); };
  MemoryPoint p;
  p.t = m.t * 1e3;
  p.parameters = kind(sim::MemKind::Parameters);
  p.gradients = kind(sim::MemKind::Gradients);
  p.optimizer_state = kind(sim::MemKind::Optimizer);
  p.activations = kind(sim::MemKind::Activations);
  p.buffers = kind(sim::MemKind::Buffers);
  return p;
}

// One simulated rank's ops as spans (ms). Lane 0, the compute stream: per program instruction
// its extent, split where a collective runs on the stream (the tensor-parallel all-reduces inside
// a Forward / Backward, drawn as communication); receive waits are left idle. Lane 1: the
// communication streams (sends, data-parallel reductions).
std::vector<Span> rank_spans(const sim::RankProgram& prog, const sim::RankResult& res,
                             const std::vector<schedule::Instr>& program) {
  std::vector<Span> spans;
  Span* open = nullptr;  // the lane-0 piece being extended (consecutive compute of one instr)
  int open_instr = -1;
  for (size_t i = 0; i < prog.ops.size(); ++i) {
    const sim::Op& op = prog.ops[i];
    const double a = res.spans[i].start * 1e3, b = res.spans[i].end * 1e3;
    const bool in_program = op.instr >= 0 && op.instr < static_cast<int>(program.size());
    const schedule::Instr* in = in_program ? &program[op.instr] : nullptr;
    if (op.kind == sim::OpKind::Recv) continue;  // the wait for data: idle (the bubble)
    if (b <= a) continue;                        // no time (a ReduceGrads with nothing to wait)
    Span s;
    s.mb = in ? in->mb : op.mb;
    s.chunk = in ? in->chunk : 0;
    s.start = a;
    s.end = b;
    if (op.stream != 0) {
      s.name = op.name;
      s.category = op.category == "reduce" ? Category::Reduce : Category::Comm;
      s.lane = 1;
      spans.push_back(std::move(s));
      open = nullptr;  // (spans may reallocate)
      continue;
    }
    // ZeRO-Offload's host step on stream 0 (the host Adam): the optimizer's span.
    if (op.kind == sim::OpKind::Host) {
      s.name = op.name;
      s.category = Category::Optimizer;
      spans.push_back(std::move(s));
      open = nullptr;
      continue;
    }
    if (op.kind == sim::OpKind::Compute) {
      if (open && open_instr == op.instr && a - open->end < 1e-6) {  // contiguous (1 ns)
        open->end = std::max(open->end, b);
        continue;
      }
      s.name = in ? in->str() : op.name;
      s.category = in ? category_of(in->op) : Category::Forward;
      spans.push_back(std::move(s));
      open = &spans.back();
      open_instr = op.instr;
      continue;
    }
    // A collective on the compute stream: communication the instruction waits for.
    s.name = in ? fmt::format("{} in {}", op.name, in->str()) : op.name;
    s.category = op.category == "reduce" ? Category::Reduce : Category::Comm;
    spans.push_back(std::move(s));
    open = nullptr;
  }
  std::stable_sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.start < b.start || (a.start == b.start && a.lane < b.lane);
  });
  return spans;
}

}  // namespace

bool simulator_available() {
  return true;
}

Timeline simulate_step(const Knobs& k) {
  const auto t0 = std::chrono::steady_clock::now();
  validate_knobs(k);
  const int world = k.world_size();
  const std::string cpath = cluster_path(k);
  const sim::Cluster cluster = sim::load_cluster(cpath);
  sim::ReplayOptions ro;
  if (!k.calibration.empty()) ro.calibration = sim::load_calibration(k.calibration);
  // colossalai-sim --config's path: the plan's workload, identical replicas folded, replayed.
  const sim::ConfigWorkload cw = sim::workload_from_config(k.config, world, cluster, true);
  const sim::Workload& w = cw.workload;
  const sim::ReplayResult r = sim::replay(w, cluster, ro);

  const plan::StepPlan& plan = cw.plan;
  const int P = plan.layout.pp, T = plan.layout.tp;
  const int listed = static_cast<int>(w.ranks.size());
  Timeline t;
  t.source = "simulator (SimGrid)";
  t.time_unit = "ms";
  t.schedule = P > 1 ? cw.schedule.name : "data parallel";
  t.stages = P;
  t.micro_batches = plan.micro_batches;
  t.chunks = cw.schedule.chunks;
  t.t_begin = 0;
  t.t_end = r.step_s * 1e3;
  t.capacity_bytes = static_cast<double>(cluster.gpu.memory_bytes);
  t.img_per_s = r.img_per_s;

  const std::vector<double> ideal = ideal_bubbles(cw.schedule);
  for (int s = 0; s < P; ++s) {
    StageBubble b;
    b.stage = s;
    b.achieved = s < static_cast<int>(r.bubble.size()) ? r.bubble[s] : -1;
    b.ideal = s < static_cast<int>(ideal.size()) ? ideal[s] : -1;
    t.bubbles.push_back(b);
  }
  // The plan's prediction: the stage with the highest peak, on its dp 0 / tp 0 rank.
  for (int s = 0; s < static_cast<int>(plan.stages.size()); ++s) {
    const double peak = static_cast<double>(plan.stages[s].memory.peak);
    if (peak > t.plan_peak_bytes) t.plan_peak_bytes = peak, t.plan_peak_rank = s * T;
  }

  // Every rank of the job: copy c of listed sim rank r is job rank c · listed + r, whose mesh
  // rank (the GPU vit_train's rank runs on) is its image's + c · listed.
  struct Row {
    RankTrack track;
    MemoryCurve memory;
  };
  std::vector<Row> rows;
  std::vector<std::vector<Span>> spans(listed);
  std::vector<std::vector<MemoryPoint>> mem(listed);
  for (int i = 0; i < listed; ++i) {
    const sim::RankProgram& prog = w.ranks[i];
    spans[i] = rank_spans(prog, r.ranks[i], cw.schedule.programs.at(prog.stage));
    for (const sim::MemPoint& m : r.ranks[i].memory) mem[i].push_back(memory_point(m));
    if (!mem[i].empty()) {
      MemoryPoint last = mem[i].back();
      last.t = std::max(last.t, t.t_end);
      mem[i].push_back(last);
    }
  }
  for (int c = 0; c < w.copies; ++c)
    for (int i = 0; i < listed; ++i) {
      const int s = i % P, replica = i / P, tp = replica % T;
      const int dp = replica / T + c * (listed / (P * T));
      Row row;
      row.track.rank = w.gpu_of(i) + c * listed;
      row.track.stage = s;
      row.track.label = fmt::format("rank {} (pp {}, dp {}, tp {})", row.track.rank, s, dp, tp);
      row.track.spans = spans[i];
      row.memory.rank = row.track.rank;
      row.memory.stage = s;
      row.memory.points = mem[i];
      rows.push_back(std::move(row));
    }
  std::sort(rows.begin(), rows.end(),
            [](const Row& a, const Row& b) { return a.track.rank < b.track.rank; });
  for (Row& row : rows) {
    t.ranks.push_back(std::move(row.track));
    t.memory.push_back(std::move(row.memory));
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  t.compute_ms = ms;
  t.detail = fmt::format(
      "{} ({}){}; {} of {} ranks simulated{} in {:.0f} ms", cluster.name,
      std::filesystem::path(cpath).filename().string(),
      k.calibration.empty() ? ""
                            : fmt::format(", calibration {}",
                                          std::filesystem::path(k.calibration).filename().string()),
      listed, w.job_ranks(),
      w.copies > 1 ? fmt::format(" ({} identical data-parallel copies)", w.copies) : "", ms);
  return t;
}

}  // namespace cai::gui
