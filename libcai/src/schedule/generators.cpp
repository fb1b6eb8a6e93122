// Schedule generators: each style fixes the order of compute steps on every rank; one common
// lowering then adds the loads, the sends/receives and the final gradient reduction.
//
// Deadlock freedom: a receive is placed right before the compute that consumes it and a send
// right after the compute that produces it. With buffered sends, the programs can only deadlock
// if the per-rank compute orders are mutually inconsistent, which the orders below never are
// (GPipe and 1F1B trivially; interleaved is Megatron's order, checked by validate() in the tests
// for p <= 8, m <= 32, v <= 4). FIFO pairing holds because every rank walks the (mb, chunk) pairs
// in the same sequence.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "cai/core/error.h"
#include "cai/schedule/schedule.h"

namespace cai::schedule {
namespace {

// One compute step of a rank's order. Backward is lowered to BackwardInput + BackwardWeight when
// ScheduleOptions::split_backward; Input and Weight are the zero-bubble schedules' split halves.
enum class Kind { Forward, Backward, Input, Weight };
struct Step {
  Kind kind;
  int mb, chunk;
};

void check_common(const ScheduleOptions& opt, const Partition& part, const char* style) {
  CAI_CHECK(opt.stages >= 1, "[schedule] {}: stages must be >= 1 (got {})", style, opt.stages);
  CAI_CHECK(opt.micro_batches >= 1, "[schedule] {}: micro_batches must be >= 1 (got {})", style,
            opt.micro_batches);
  CAI_CHECK(opt.chunks >= 1, "[schedule] {}: chunks must be >= 1 (got {})", style, opt.chunks);
  CAI_CHECK(opt.activation_bytes >= 0, "[schedule] {}: activation_bytes must be >= 0 (got {})",
            style, opt.activation_bytes);
  const int vstages = opt.stages * opt.chunks;
  CAI_CHECK(part.virtual_stages() == vstages,
            "[schedule] {}: partition has {} virtual stages, the schedule needs {} (stages {} x "
            "chunks {})",
            style, part.virtual_stages(), vstages, opt.stages, opt.chunks);
  for (int v = 0; v < vstages; ++v)
    CAI_CHECK(part.layers_per_virtual_stage[v] >= 1,
              "[schedule] {}: virtual stage {} has {} layers (every stage needs >= 1; more "
              "virtual stages than layers?)",
              style, v, part.layers_per_virtual_stage[v]);
}

// Adds loads, transfers and the final ReduceGrads/OptimizerStep around each rank's compute order.
Schedule lower(const std::string& name, const ScheduleOptions& opt, const Partition& part,
               const std::vector<std::vector<Step>>& order, std::vector<int> placement = {}) {
  Schedule s;
  s.name = name;
  s.stages = opt.stages;
  s.micro_batches = opt.micro_batches;
  s.chunks = opt.chunks;
  s.placement = std::move(placement);
  s.programs.resize(opt.stages);
  const int p = opt.stages, last = s.virtual_stages() - 1;
  std::vector<int> first(last + 1);
  for (int v = 0; v <= last; ++v) first[v] = part.first_layer(v);

  for (int r = 0; r < p; ++r) {
    Program& prog = s.programs[r];
    auto emit = [&](Op op, int mb, int chunk, int peer) {
      const int v = s.virtual_stage(r, chunk);
      const bool transfer = is_send(op) || is_recv(op);
      prog.push_back(Instr{op, mb, chunk, peer, first[v], part.num_layers(v),
                           transfer ? opt.activation_bytes : 0});
    };
    for (const Step& st : order[r]) {
      const int v = s.virtual_stage(r, st.chunk);
      if (st.kind == Kind::Forward) {
        // Images on the first virtual stage; labels where the loss is (a single load when one
        // rank holds both: p == 1, or ZB-V's rank 0).
        if (v == 0 || (v == last && s.rank_of(0) != r))
          emit(Op::LoadMicroBatch, st.mb, st.chunk, -1);
        if (v > 0 && s.rank_of(v - 1) != r)
          emit(Op::RecvActivation, st.mb, st.chunk, s.rank_of(v - 1));
        emit(Op::Forward, st.mb, st.chunk, -1);
        if (v < last && s.rank_of(v + 1) != r)
          emit(Op::SendActivation, st.mb, st.chunk, s.rank_of(v + 1));
      } else if (st.kind == Kind::Weight) {
        emit(Op::BackwardWeight, st.mb, st.chunk, -1);
      } else {
        const bool split = st.kind == Kind::Input || opt.split_backward;
        if (v < last && s.rank_of(v + 1) != r)
          emit(Op::RecvGrad, st.mb, st.chunk, s.rank_of(v + 1));
        emit(split ? Op::BackwardInput : Op::Backward, st.mb, st.chunk, -1);
        if (v > 0 && s.rank_of(v - 1) != r) emit(Op::SendGrad, st.mb, st.chunk, s.rank_of(v - 1));
        if (split && st.kind == Kind::Backward) emit(Op::BackwardWeight, st.mb, st.chunk, -1);
      }
    }
    int held = 0;
    for (int c = 0; c < s.chunks; ++c) held += part.num_layers(s.virtual_stage(r, c));
    const int first0 = first[s.virtual_stage(r, 0)];
    prog.push_back(Instr{Op::ReduceGrads, -1, 0, -1, first0, held, 0});
    prog.push_back(Instr{Op::OptimizerStep, -1, 0, -1, first0, held, 0});
  }
  return s;
}

void check_single_chunk(const ScheduleOptions& opt, const char* style) {
  CAI_CHECK(opt.chunks == 1,
            "[schedule] {}: chunks must be 1 (got {}); several chunks per rank need style "
            "'interleaved' (or 'zbv', 2 chunks)",
            style, opt.chunks);
}

// The zero-bubble schedules' list scheduler (schedule.h: zbh1, zbv). A Forward, BackwardInput
// and BackwardWeight of a virtual stage take cost_forward / cost_input / cost_weight
// (ScheduleOptions); ranks decide in order of the time they become free, so every decision at
// time t sees every op that ended by t, and an idle rank waits for the next op to end anywhere.
// With unit costs every event falls on an integer time (the paper's setting).
struct ZbLimits {
  std::vector<int> live;       // per rank: most chunk activations between F and W
  std::vector<int> in_flight;  // per rank: most between F and BackwardInput
  std::vector<int> chunk0;     // per rank: most chunk-0 activations between F and W
};

std::vector<std::vector<Step>> zero_bubble_order(int p, int m, int chunks,
                                                 const std::vector<int>& place, const ZbLimits& lim,
                                                 const ScheduleOptions& opt, const char* style) {
  const double cf = opt.cost_forward, cb = opt.cost_input, cw = opt.cost_weight;
  CAI_CHECK(cf > 0 && cb > 0 && cw > 0 && std::isfinite(cf + cb + cw),
            "[schedule] {}: costs must be positive and finite (forward {}, input {}, weight {})",
            style, cf, cb, cw);
  const int nv = p * chunks, last = nv - 1;
  std::vector<std::vector<int>> vs_of(p);  // rank -> its virtual stages, ascending
  for (int v = 0; v < nv; ++v) vs_of[place[v]].push_back(v);
  auto at = [&](int mb, int v) { return static_cast<size_t>(mb) * nv + v; };
  std::vector<double> f_end(static_cast<size_t>(m) * nv, -1), b_end(f_end);
  std::vector<int> next_f(nv, 0), next_b(nv, 0), next_w(nv, 0);
  std::vector<int> live(p, 0), in_flight(p, 0), chunk0(p, 0);
  std::vector<double> free_at(p, 0);
  std::vector<int> left(p, 3 * m * chunks);
  int remaining = 3 * m * nv;
  const double eps = 1e-9 * (cf + cb + cw);
  auto done_by = [&](double end, double t) { return end >= 0 && end <= t + eps; };
  std::vector<std::vector<Step>> order(p);
  // waiting[q]: q found nothing to do at free_at[q] while other ranks free then had not decided
  // yet; it decides again after them (their ops may be what it waits for).
  std::vector<char> waiting(p, 0);
  while (remaining > 0) {
    int r = -1;
    for (int q = 0; q < p; ++q) {
      if (left[q] == 0) continue;
      if (r < 0 || free_at[q] < free_at[r] - eps ||
          (free_at[q] <= free_at[r] + eps && waiting[r] && !waiting[q]))
        r = q;
    }
    const double t = free_at[r];
    Kind kind = Kind::Forward;
    int pick = -1, pick_mb = 0;
    // 1. A ready Forward that fits the memory limits: the virtual stage nearest the loss (its
    // micro-batches go in order). Forwards first keeps the next micro-batch's critical path
    // moving; the limits turn this into 1F1B's alternation once the warm-up is done.
    if (live[r] < lim.live[r] && in_flight[r] < lim.in_flight[r])
      for (int v : vs_of[r]) {
        const int mb = next_f[v];
        if (mb >= m || (v > 0 && !done_by(f_end[at(mb, v - 1)], t))) continue;
        if (v == vs_of[r][0] && chunks > 1 && chunk0[r] >= lim.chunk0[r]) continue;
        pick = v, pick_mb = mb;  // vs_of is ascending: the last ready one is nearest the loss
      }
    // 2. A ready BackwardInput: the oldest micro-batch, then the virtual stage nearest the loss.
    if (pick < 0)
      for (int v : vs_of[r]) {
        const int mb = next_b[v];
        if (mb >= m || !done_by(f_end[at(mb, v)], t)) continue;
        if (v < last && !done_by(b_end[at(mb, v + 1)], t)) continue;
        if (pick < 0 || mb < pick_mb || (mb == pick_mb && v > pick))
          pick = v, pick_mb = mb, kind = Kind::Input;
      }
    // 3. A pending BackwardWeight: the oldest micro-batch.
    if (pick < 0)
      for (int v : vs_of[r]) {
        const int mb = next_w[v];
        if (mb >= m || !done_by(b_end[at(mb, v)], t)) continue;
        if (pick < 0 || mb < pick_mb) pick = v, pick_mb = mb, kind = Kind::Weight;
      }
    if (pick < 0) {
      // Another rank free now decides first; else idle until the next op ends anywhere (an F or
      // B this rank may wait for) or the next rank becomes free.
      bool others_now = false;
      for (int q = 0; q < p; ++q)
        others_now |= q != r && left[q] > 0 && !waiting[q] && free_at[q] <= t + eps;
      if (others_now) {
        waiting[r] = 1;
        continue;
      }
      double next = std::numeric_limits<double>::infinity();
      for (double e : f_end)
        if (e > t + eps) next = std::min(next, e);
      for (double e : b_end)
        if (e > t + eps) next = std::min(next, e);
      for (int q = 0; q < p; ++q)
        if (q != r && left[q] > 0 && free_at[q] > t + eps) next = std::min(next, free_at[q]);
      CAI_CHECK(std::isfinite(next),
                "[schedule] {}: internal error, the greedy scheduler is stuck at time {} (p={}, "
                "m={}); please report",
                style, t, p, m);
      free_at[r] = next;
      waiting[r] = 0;
      continue;
    }
    std::fill(waiting.begin(), waiting.end(), 0);  // a new op: everyone looks again
    const int chunk =
        static_cast<int>(std::find(vs_of[r].begin(), vs_of[r].end(), pick) - vs_of[r].begin());
    order[r].push_back({kind, pick_mb, chunk});
    const bool is_chunk0 = chunks > 1 && chunk == 0;
    double end = t;
    switch (kind) {
      case Kind::Forward:
        end = t + cf;
        f_end[at(pick_mb, pick)] = end;
        ++next_f[pick], ++live[r], ++in_flight[r], chunk0[r] += is_chunk0;
        break;
      case Kind::Input:
        end = t + cb;
        b_end[at(pick_mb, pick)] = end;
        ++next_b[pick], --in_flight[r];
        break;
      default:
        end = t + cw;
        ++next_w[pick], --live[r], chunk0[r] -= is_chunk0;
        break;
    }
    free_at[r] = end;
    --left[r], --remaining;
  }
  return order;
}

}  // namespace

Schedule gpipe(const ScheduleOptions& opt, const Partition& part) {
  check_common(opt, part, "gpipe");
  check_single_chunk(opt, "gpipe");
  std::vector<std::vector<Step>> order(opt.stages);
  for (auto& o : order) {
    for (int mb = 0; mb < opt.micro_batches; ++mb) o.push_back({Kind::Forward, mb, 0});
    for (int mb = 0; mb < opt.micro_batches; ++mb) o.push_back({Kind::Backward, mb, 0});
  }
  return lower("gpipe", opt, part, order);
}

Schedule one_f_one_b(const ScheduleOptions& opt, const Partition& part) {
  check_common(opt, part, "1f1b");
  check_single_chunk(opt, "1f1b");
  const int p = opt.stages, m = opt.micro_batches;
  std::vector<std::vector<Step>> order(p);
  for (int r = 0; r < p; ++r) {
    const int warmup = std::min(p - r - 1, m);
    int f = 0, b = 0;
    for (; f < warmup; ++f) order[r].push_back({Kind::Forward, f, 0});
    for (; f < m; ++f, ++b) {
      order[r].push_back({Kind::Forward, f, 0});
      order[r].push_back({Kind::Backward, b, 0});
    }
    for (; b < m; ++b) order[r].push_back({Kind::Backward, b, 0});
  }
  return lower("1f1b", opt, part, order);
}

Schedule interleaved(const ScheduleOptions& opt, const Partition& part) {
  check_common(opt, part, "interleaved");
  const int p = opt.stages, m = opt.micro_batches, v = opt.chunks;
  CAI_CHECK(v >= 2,
            "[schedule] interleaved: chunks must be >= 2 (got {}); with one chunk per rank use "
            "'1f1b'",
            v);
  CAI_CHECK(m % p == 0,
            "[schedule] interleaved: micro_batches ({}) must be a multiple of stages ({}): "
            "Megatron's interleaved schedule runs micro-batches through the chunks in groups of p",
            m, p);
  const int total = m * v, group = p * v;
  auto step = [&](int k, bool forward) {
    const int in_group = k % group;
    const int chunk = forward ? in_group / p : v - 1 - in_group / p;
    return Step{forward ? Kind::Forward : Kind::Backward, (k / group) * p + k % p, chunk};
  };
  std::vector<std::vector<Step>> order(p);
  for (int r = 0; r < p; ++r) {
    const int warmup = std::min(2 * (p - r - 1) + (v - 1) * p, total);
    int f = 0, b = 0;
    for (; f < warmup; ++f) order[r].push_back(step(f, true));
    for (; f < total; ++f, ++b) {
      order[r].push_back(step(f, true));
      order[r].push_back(step(b, false));
    }
    for (; b < total; ++b) order[r].push_back(step(b, false));
  }
  return lower("interleaved", opt, part, order);
}

Schedule zbh1(const ScheduleOptions& opt, const Partition& part) {
  check_common(opt, part, "zbh1");
  check_single_chunk(opt, "zbh1");
  const int p = opt.stages;
  ZbLimits lim;
  for (int r = 0; r < p; ++r) {
    lim.live.push_back(p);
    lim.in_flight.push_back(p - r);
    lim.chunk0.push_back(p);
  }
  std::vector<int> place(p);
  for (int r = 0; r < p; ++r) place[r] = r;
  return lower("zbh1", opt, part,
               zero_bubble_order(p, opt.micro_batches, 1, place, lim, opt, "zbh1"));
}

Schedule zbv(const ScheduleOptions& opt, const Partition& part) {
  CAI_CHECK(opt.chunks == 2,
            "[schedule] zbv: chunks must be 2 (got {}); ZB-V places two chunks per rank in a V",
            opt.chunks);
  check_common(opt, part, "zbv");
  const int p = opt.stages;
  const ZbLimits lim{std::vector<int>(p, 2 * p), std::vector<int>(p, 2 * p),
                     std::vector<int>(p, 2 * p - 1)};
  std::vector<int> place = v_placement(p);
  auto order = zero_bubble_order(p, opt.micro_batches, 2, place, lim, opt, "zbv");
  return lower("zbv", opt, part, order, std::move(place));
}

void set_zero_bubble_costs(ScheduleOptions& opt, bool recompute) {
  opt.cost_forward = 1.0;
  opt.cost_input = recompute ? 2.5 : 1.5;
  opt.cost_weight = 0.5;
}

const std::vector<std::string>& styles() {
  static const std::vector<std::string> names{"gpipe", "1f1b", "interleaved", "zbh1", "zbv"};
  return names;
}

Schedule make(const std::string& style, const ScheduleOptions& opt, const Partition& part) {
  if (style == "gpipe") return gpipe(opt, part);
  if (style == "1f1b") return one_f_one_b(opt, part);
  if (style == "interleaved") return interleaved(opt, part);
  if (style == "zbh1") return zbh1(opt, part);
  if (style == "zbv") return zbv(opt, part);
  fail("[schedule] unknown style '{}' (expected gpipe, 1f1b, interleaved, zbh1 or zbv)", style);
}

}  // namespace cai::schedule
