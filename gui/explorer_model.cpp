#include "explorer_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "cai/core/error.h"
#include "cai/dist/mesh.h"
#include "cai/schedule/schedule.h"
#include "cluster.h"
#include "sim_source.h"

namespace cai::gui {

namespace {

bool is_compute(Category c) {
  return c == Category::Forward || c == Category::Backward || c == Category::Weight;
}

// Length of the union of [start, end) ∩ [t0, t1) over the spans accepted by `keep`.
template <typename Keep>
double covered(const RankTrack& track, double t0, double t1, Keep keep) {
  std::vector<std::pair<double, double>> iv;
  for (const Span& s : track.spans) {
    if (s.lane != 0 || !keep(s)) continue;
    const double a = std::max(s.start, t0), b = std::min(s.end, t1);
    if (b > a) iv.emplace_back(a, b);
  }
  std::sort(iv.begin(), iv.end());
  double total = 0, cur_a = 0, cur_b = -1e300;
  for (auto [a, b] : iv) {
    if (a > cur_b) {
      if (cur_b > cur_a) total += cur_b - cur_a;
      cur_a = a;
      cur_b = b;
    } else {
      cur_b = std::max(cur_b, b);
    }
  }
  if (cur_b > cur_a) total += cur_b - cur_a;
  return total;
}

// The executor's layer list: 0 = embedding, 1..depth = blocks, depth+1 = final norm + head.
struct LayerSizes {
  std::vector<double> params;      // per layer, elements
  std::vector<double> activation;  // per layer, bytes per sample saved for backward
  double boundary = 0;             // bytes per sample of the residual stream between stages
};

LayerSizes layer_sizes(const config::TrainConfig& c) {
  const nn::ViTConfig v = c.vit();
  const double n = static_cast<double>(v.num_patches() + 1), d = static_cast<double>(v.embed_dim),
               h = static_cast<double>(v.mlp_hidden()), p = static_cast<double>(v.patch_size),
               ch = static_cast<double>(v.in_chans), k = static_cast<double>(v.num_classes);
  LayerSizes s;
  s.params.push_back(ch * p * p * d + d + d + n * d);  // patch proj, cls token, position
  s.activation.push_back((static_cast<double>(v.num_patches()) * ch * p * p + n * d) * 4);
  const double block_params = 3 * d * d + 3 * d + d * d + d + d * h + h + h * d + d + 4 * d;
  // As app::estimate_memory: x, norm1, qkv (3D), attention out, h, norm2, fc1 and GELU out,
  // attention probabilities.
  const double per_block = n * (8 * d + 2 * h) + static_cast<double>(v.num_heads) * n * n;
  for (int64_t i = 0; i < v.depth; ++i) {
    s.params.push_back(block_params);
    s.activation.push_back((c.checkpoint ? n * d : per_block) * 4);
  }
  s.params.push_back(2 * d + d * k + k);
  s.activation.push_back(n * d * 4);
  s.boundary = n * d * 4;
  return s;
}

schedule::Partition partition_for(const config::TrainConfig& c, int layers, int V,
                                  const LayerSizes& sizes) {
  if (!c.num_layers_per_stage.empty())
    return schedule::partition_explicit(c.num_layers_per_stage, layers, V);
  if (c.partition == "balanced") {
    std::vector<int64_t> costs;
    for (double p : sizes.params) costs.push_back(static_cast<int64_t>(p));
    return schedule::partition_balanced(costs, V);
  }
  // As the executor: blocks spread evenly, the embedding joins the first virtual stage and the
  // head the last.
  const int blocks = layers - 2;
  if (blocks >= V) {
    std::vector<int> n = schedule::partition_uniform(blocks, V).layers_per_virtual_stage;
    n.front() += 1;
    n.back() += 1;
    return schedule::partition_explicit(n, layers, V);
  }
  return schedule::partition_uniform(layers, V);
}

}  // namespace

Category category_of(schedule::Op op) {
  using schedule::Op;
  switch (op) {
    case Op::Forward:
      return Category::Forward;
    case Op::Backward:
    case Op::BackwardInput:
      return Category::Backward;
    case Op::BackwardWeight:
      return Category::Weight;
    case Op::LoadMicroBatch:
      return Category::Load;
    case Op::ReduceGrads:
      return Category::Reduce;
    case Op::OptimizerStep:
      return Category::Optimizer;
    default:
      return Category::Comm;
  }
}

const char* category_name(Category c) {
  switch (c) {
    case Category::Forward:
      return "forward";
    case Category::Backward:
      return "backward";
    case Category::Comm:
      return "comm";
    case Category::Optimizer:
      return "optimizer";
    case Category::Load:
      return "load";
    case Category::Reduce:
      return "reduce";
    case Category::Weight:
      return "weight grad";
  }
  return "?";
}

const char* source_name(Source s) {
  return s == Source::Simulator ? "simulator" : "replay";
}

double Timeline::mean_bubble() const {
  double sum = 0;
  int n = 0;
  for (const StageBubble& b : bubbles)
    if (b.achieved >= 0) sum += b.achieved, ++n;
  return n ? sum / n : 0.0;
}

double Timeline::peak_memory() const {
  double p = 0;
  for (const MemoryCurve& m : memory) p = std::max(p, m.peak());
  return p;
}

int Timeline::peak_rank() const {
  double p = 0;
  int rank = -1;
  for (const MemoryCurve& m : memory)
    if (m.peak() > p) p = m.peak(), rank = m.rank;
  return rank;
}

Comparison compare(const Timeline& a, const Timeline& b) {
  Comparison c;
  c.step_a = a.step();
  c.step_b = b.step();
  c.bubble_a = a.mean_bubble();
  c.bubble_b = b.mean_bubble();
  c.peak_a = a.peak_memory();
  c.peak_b = b.peak_memory();
  return c;
}

double MemoryCurve::peak() const {
  double p = 0;
  for (const auto& m : points) p = std::max(p, m.total());
  return p;
}

const MemoryPoint* MemoryCurve::at(double t) const {
  const MemoryPoint* found = nullptr;
  for (const auto& m : points) {
    if (m.t > t) break;
    found = &m;
  }
  return found;
}

double idle_fraction(const RankTrack& track, double t0, double t1) {
  if (t1 <= t0) return 0;
  return 1.0 - covered(track, t0, t1, [](const Span&) { return true; }) / (t1 - t0);
}

double non_compute_fraction(const RankTrack& track, double t0, double t1) {
  if (t1 <= t0) return 0;
  return 1.0 -
         covered(track, t0, t1, [](const Span& s) { return is_compute(s.category); }) / (t1 - t0);
}

int Knobs::world_size() const {
  return world > 0 ? world : static_cast<int>(config.pipeline * config.tensor_size);
}

int Knobs::micro_batches() const {
  int64_t m = config.num_microbatches;
  if (m == 0 && config.microbatch_size > 0)
    m = (config.batch_size + config.microbatch_size - 1) / config.microbatch_size;
  if (m == 0) m = config.pipeline;
  return static_cast<int>(m);
}

void validate_knobs(const Knobs& k) {
  const config::TrainConfig& c = k.config;
  CAI_CHECK(k.world_size() >= 1, "[gui] GPUs = {}: need at least 1", k.world_size());
  CAI_CHECK(c.pipeline >= 1, "[gui] parallel.pipeline = {}: need at least 1", c.pipeline);
  config::validate(c, k.world_size());
  const int m = k.micro_batches(), p = static_cast<int>(c.pipeline);
  // The executor's checks (cai/parallel/pipeline.cpp), with its text.
  if (c.pp_style == "interleaved")
    CAI_CHECK(m % p == 0,
              "[pipeline] interleaved schedules need the micro-batch count ({}) to be a "
              "multiple of the stage count ({})",
              m, p);
  CAI_CHECK(c.batch_size >= m, "[pipeline] a batch of {} samples cannot make {} micro-batches",
            c.batch_size, m);
  CAI_CHECK(k.forward_per_layer > 0 && k.backward_ratio > 0,
            "[gui] costs: forward per layer {} and backward ratio {} must be > 0",
            k.forward_per_layer, k.backward_ratio);
}

namespace {

std::vector<std::string> files_in(const std::string& dir, const std::string& ext) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.is_regular_file(ec) && e.path().extension() == ext) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::vector<std::string> shipped_clusters() {
  return files_in(std::string(CAI_GUI_SOURCE_DIR) + "/hostfiles/clusters", ".toml");
}

std::vector<std::string> shipped_calibrations() {
  return files_in(std::string(CAI_GUI_SOURCE_DIR) + "/sim/calibrations", ".json");
}

std::string cluster_path(const Knobs& k) {
  if (!k.cluster.empty()) return k.cluster;
  const int world = k.world_size();
  const bool cpu = k.config.device == "cpu";
  std::string best[2];  // [0]: same kind of device as the config's, [1]: GPUs
  int best_ranks[2] = {0, 0};
  for (const std::string& path : shipped_clusters()) {
    sim::Cluster c;
    try {
      c = sim::load_cluster(path);
    } catch (const Error&) {
      continue;  // a broken shipped file is the cluster tests' business
    }
    const bool cpu_cluster = c.max_ranks_per_gpu > 1 || c.intra.fabric == sim::Fabric::SharedMemory;
    if (c.max_ranks() < world) continue;
    for (int i = 0; i < 2; ++i) {
      const bool wanted = i == 0 ? cpu_cluster == cpu : !cpu_cluster;
      if (wanted && (best[i].empty() || c.max_ranks() < best_ranks[i]))
        best[i] = path, best_ranks[i] = c.max_ranks();
    }
  }
  if (!best[0].empty()) return best[0];
  CAI_CHECK(!best[1].empty(),
            "[gui] no shipped cluster (hostfiles/clusters) holds {} ranks: choose a cluster file",
            world);
  return best[1];
}

std::vector<double> ideal_bubbles(const schedule::Schedule& s) {
  const schedule::ValidationResult res = schedule::validate_or_throw(s, schedule::CostModel{});
  std::vector<double> out;
  for (double busy : res.busy) out.push_back(res.makespan > 0 ? 1.0 - busy / res.makespan : 0.0);
  return out;
}

Timeline timeline_for(const Knobs& k) {
  return k.source == Source::Simulator ? simulate_step(k) : replay_schedule(k);
}

Timeline replay_schedule(const Knobs& k) {
  const auto clock0 = std::chrono::steady_clock::now();
  validate_knobs(k);
  const config::TrainConfig& c = k.config;
  const int p = static_cast<int>(c.pipeline), m = k.micro_batches();
  const int v =
      c.pp_style == "interleaved" || c.pp_style == "zbv" ? static_cast<int>(c.num_model_chunks) : 1;
  const LayerSizes sizes = layer_sizes(c);
  const int layers = static_cast<int>(sizes.params.size());
  const schedule::Partition part = partition_for(c, layers, p * v, sizes);
  const int64_t mb_size = std::max<int64_t>(1, c.batch_size / m);

  schedule::ScheduleOptions opt;
  opt.stages = p;
  opt.micro_batches = m;
  opt.chunks = v;
  opt.activation_bytes = static_cast<int64_t>(sizes.boundary) * mb_size;
  schedule::set_zero_bubble_costs(opt, c.checkpoint);  // the program the trainer runs
  const schedule::Schedule sched = schedule::make(p == 1 ? "gpipe" : c.pp_style, opt, part);
  // Ideal: every virtual stage costs the same (the model's blocks spread evenly), so the bubble
  // is the schedule's own; depth only scales time.
  schedule::CostModel cost;
  const double stage_fwd = k.forward_per_layer * static_cast<double>(c.depth) / (p * v);
  cost.forward = stage_fwd;
  cost.backward = stage_fwd * k.backward_ratio;
  // Split as the zero-bubble generators plan it (B : W = cost_input : cost_weight).
  cost.backward_input_share = opt.cost_input / (opt.cost_input + opt.cost_weight);
  cost.comm = k.comm;
  const schedule::ValidationResult res = schedule::validate_or_throw(sched, cost);

  Timeline t;
  t.source = "schedule replay (ideal)";
  t.time_unit = "u";
  t.schedule = sched.name;
  t.stages = p;
  t.micro_batches = m;
  t.chunks = v;
  t.t_begin = 0;
  t.t_end = res.makespan;
  t.capacity_bytes = k.capacity_gib * 1024.0 * 1024.0 * 1024.0;

  // Per stage: spans and the memory curve (shared by the stage's tensor/data-parallel ranks).
  const double tp = static_cast<double>(c.tensor_size);
  const int world = k.world_size();
  const dist::ProcessMesh mesh(world, static_cast<int>(c.tensor_size), p);
  const double dp = mesh.dp_size();
  const int slots = c.optimizer == "sgd" ? (c.momentum > 0 ? 1 : 0) : 2;
  std::vector<std::vector<Span>> stage_spans(p);
  std::vector<MemoryCurve> stage_memory(p);
  for (int s = 0; s < p; ++s) {
    const auto& prog = sched.programs[s];
    const auto& times = res.times[s];
    std::vector<double> chunk_act(v, 0.0);
    double params = 0;
    for (int ch = 0; ch < v; ++ch) {
      const int vs = sched.virtual_stage(s, ch);
      for (int l = part.first_layer(vs); l < part.first_layer(vs) + part.num_layers(vs); ++l) {
        params += sizes.params[l] / tp;
        chunk_act[ch] += sizes.activation[l] * static_cast<double>(mb_size) / tp;
      }
    }
    MemoryPoint base;
    base.parameters = params * 4;
    base.gradients = params * 4;
    base.optimizer_state = params * 4 * slots / (c.zero_stage >= 1 ? dp : 1.0);
    base.buffers = 2 * static_cast<double>(opt.activation_bytes) / tp;
    MemoryCurve& mc = stage_memory[s];
    mc.points.push_back(base);
    double live = 0;
    for (size_t i = 0; i < prog.size(); ++i) {
      const schedule::Instr& in = prog[i];
      const Category cat = category_of(in.op);
      double start = times[i].start;
      const double end = times[i].end;
      if (cat == Category::Comm) {
        // A receive's interval is its wait: only the message latency is communication.
        if (!schedule::is_recv(in.op) || k.comm <= 0) continue;
        start = std::max(start, end - k.comm);
      }
      if (end > start) stage_spans[s].push_back(Span{in.str(), cat, in.mb, in.chunk, start, end});
      const bool frees = in.op == schedule::Op::Backward || in.op == schedule::Op::BackwardWeight;
      if (in.op == schedule::Op::Forward || frees) {
        live += (frees ? -1 : 1) * chunk_act[in.chunk];
        MemoryPoint pt = base;
        pt.t = end;
        pt.activations = std::max(0.0, live);
        mc.points.push_back(pt);
      }
    }
    MemoryPoint last = mc.points.back();
    last.t = res.makespan;
    mc.points.push_back(last);
    StageBubble b;
    b.stage = s;
    b.ideal = res.makespan > 0 ? 1.0 - res.busy[s] / res.makespan : 0.0;
    t.bubbles.push_back(b);
  }
  for (int r = 0; r < world; ++r) {
    const dist::MeshCoord co = mesh.coord(r);
    RankTrack rt;
    rt.rank = r;
    rt.stage = co.pp;
    rt.label = fmt::format("rank {} (pp {}, dp {}, tp {})", r, co.pp, co.dp, co.tp);
    rt.spans = stage_spans[co.pp];
    t.ranks.push_back(std::move(rt));
    MemoryCurve mc = stage_memory[co.pp];
    mc.rank = r;
    mc.stage = co.pp;
    t.memory.push_back(std::move(mc));
  }
  for (auto& b : t.bubbles) {
    for (const auto& rt : t.ranks)
      if (rt.stage == b.stage) {
        b.achieved = non_compute_fraction(rt, t.t_begin, t.t_end);
        break;
      }
  }
  t.compute_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - clock0).count();
  return t;
}

ExplorerModel::ExplorerModel() : source(timeline_for) {
  knobs.source = simulator_available() ? Source::Simulator : Source::Replay;
  shipped_clusters = cai::gui::shipped_clusters();
  shipped_calibrations = cai::gui::shipped_calibrations();
  // A small default layout: the tiny Fashion-MNIST ViT with 8 blocks on 4 stages.
  knobs.config.pipeline = 4;
  knobs.config.num_microbatches = 8;
  knobs.config.depth = 8;
  knobs.config.in_chans = 1;
  knobs.config.explicitly_set = {"parallel.pipeline", "parallel.num_microbatches", "model.depth"};
}

bool ExplorerModel::recompute() {
  try {
    cluster_in_use = cluster_path(knobs);
  } catch (const Error&) {
    cluster_in_use.clear();
  }
  try {
    current = source(knobs);
    knob_error.clear();
  } catch (const Error& e) {
    knob_error = e.what();
  }
  if (trace) {
    try {
      recorded = trace_step(*trace, knobs.trace_step);
    } catch (const Error& e) {
      add_error(e.what());
      knobs.trace_step = -1;
      recorded = trace_step(*trace, -1);
    }
    // The ideal bubble of a recorded run: the replay's, when it has the same shape.
    if (knob_error.empty() && recorded.stages == current.stages &&
        recorded.micro_batches == current.micro_batches)
      for (size_t s = 0; s < recorded.bubbles.size() && s < current.bubbles.size(); ++s)
        recorded.bubbles[s].ideal = current.bubbles[s].ideal;
    recorded.capacity_bytes = current.capacity_bytes > 0
                                  ? current.capacity_bytes
                                  : knobs.capacity_gib * 1024.0 * 1024.0 * 1024.0;
  }
  return knob_error.empty();
}

bool ExplorerModel::pin() {
  if (!knob_error.empty() || current.empty()) return false;
  pinned = current;
  pinned_knobs = knobs;
  return true;
}

void ExplorerModel::unpin() {
  pinned.reset();
}

bool ExplorerModel::load_config(const std::string& path, const std::vector<std::string>& ov) {
  try {
    knobs.config = config::load_config(path, ov);
    config_path = path;
  } catch (const Error& e) {
    add_error(e.what());
    return false;
  }
  recompute();
  return true;
}

bool ExplorerModel::apply_overrides(const std::vector<std::string>& ov) {
  if (ov.empty()) return true;
  try {
    // Through vit_train's parser: the resolved config, then the overrides.
    knobs.config = config::parse_config(config::to_toml(knobs.config), "knobs", ov);
  } catch (const Error& e) {
    add_error(e.what());
    return false;
  }
  recompute();
  return true;
}

bool ExplorerModel::save_config(const std::string& path) {
  std::ofstream f(path);
  if (!f.good()) {
    add_error(fmt::format("[gui] config {}: cannot write the file", path));
    return false;
  }
  f << "# written by colossalai-gui\n" << config::to_toml(knobs.config);
  return true;
}

bool ExplorerModel::open_trace(const std::string& path) {
  try {
    trace = load_trace(path);
  } catch (const Error& e) {
    add_error(e.what());
    return false;
  }
  knobs.trace_step = -1;
  recompute();
  return true;
}

bool ExplorerModel::open_metrics(const std::string& path) {
  try {
    runs.push_back(load_metrics(path));
  } catch (const Error& e) {
    add_error(e.what());
    return false;
  }
  return true;
}

bool ExplorerModel::adopt_run_layout(size_t i) {
  if (i >= runs.size() || !runs[i].layout) {
    add_error(
        fmt::format("[gui] metrics {}: no \"run\" record (written by vit_train since it "
                    "records its layout)",
                    i < runs.size() ? runs[i].path : std::string("?")));
    return false;
  }
  const MetricsLayout& l = *runs[i].layout;
  config::TrainConfig& c = knobs.config;
  knobs.world = l.processes;
  c.pipeline = l.pp;
  c.tensor_size = l.tp;
  c.tensor_mode = l.tp > 1 ? l.tensor_mode : "none";
  c.zero_stage = l.zero_stage;
  c.batch_size = l.batch_per_process;
  recompute();
  return true;
}

void ExplorerModel::add_error(std::string message) {
  errors.push_back(std::move(message));
}

std::vector<std::string> ExplorerModel::take_new_errors() {
  std::vector<std::string> out(errors.begin() + static_cast<std::ptrdiff_t>(errors_reported_),
                               errors.end());
  errors_reported_ = errors.size();
  return out;
}

}  // namespace cai::gui
