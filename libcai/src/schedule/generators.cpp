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

#include "cai/core/error.h"
#include "cai/schedule/schedule.h"

namespace cai::schedule {
namespace {

struct Step {
  bool forward;
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
               const std::vector<std::vector<Step>>& order) {
  Schedule s;
  s.name = name;
  s.stages = opt.stages;
  s.micro_batches = opt.micro_batches;
  s.chunks = opt.chunks;
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
      if (st.forward) {
        // Images on the first virtual stage; labels where the loss is (a single load when p == 1).
        if (v == 0 || (v == last && r != 0)) emit(Op::LoadMicroBatch, st.mb, st.chunk, -1);
        if (v > 0 && s.rank_of(v - 1) != r)
          emit(Op::RecvActivation, st.mb, st.chunk, s.rank_of(v - 1));
        emit(Op::Forward, st.mb, st.chunk, -1);
        if (v < last && s.rank_of(v + 1) != r)
          emit(Op::SendActivation, st.mb, st.chunk, s.rank_of(v + 1));
      } else {
        if (v < last && s.rank_of(v + 1) != r)
          emit(Op::RecvGrad, st.mb, st.chunk, s.rank_of(v + 1));
        emit(opt.split_backward ? Op::BackwardInput : Op::Backward, st.mb, st.chunk, -1);
        if (v > 0 && s.rank_of(v - 1) != r) emit(Op::SendGrad, st.mb, st.chunk, s.rank_of(v - 1));
        if (opt.split_backward) emit(Op::BackwardWeight, st.mb, st.chunk, -1);
      }
    }
    int held = 0;
    for (int c = 0; c < s.chunks; ++c) held += part.num_layers(s.virtual_stage(r, c));
    prog.push_back(Instr{Op::ReduceGrads, -1, 0, -1, first[r], held, 0});
    prog.push_back(Instr{Op::OptimizerStep, -1, 0, -1, first[r], held, 0});
  }
  return s;
}

void check_single_chunk(const ScheduleOptions& opt, const char* style) {
  CAI_CHECK(opt.chunks == 1,
            "[schedule] {}: chunks must be 1 (got {}); several chunks per rank need style "
            "'interleaved'",
            style, opt.chunks);
}

}  // namespace

Schedule gpipe(const ScheduleOptions& opt, const Partition& part) {
  check_common(opt, part, "gpipe");
  check_single_chunk(opt, "gpipe");
  std::vector<std::vector<Step>> order(opt.stages);
  for (auto& o : order) {
    for (int mb = 0; mb < opt.micro_batches; ++mb) o.push_back({true, mb, 0});
    for (int mb = 0; mb < opt.micro_batches; ++mb) o.push_back({false, mb, 0});
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
    for (; f < warmup; ++f) order[r].push_back({true, f, 0});
    for (; f < m; ++f, ++b) {
      order[r].push_back({true, f, 0});
      order[r].push_back({false, b, 0});
    }
    for (; b < m; ++b) order[r].push_back({false, b, 0});
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
    return Step{forward, (k / group) * p + k % p, chunk};
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

Schedule make(const std::string& style, const ScheduleOptions& opt, const Partition& part) {
  if (style == "gpipe") return gpipe(opt, part);
  if (style == "1f1b") return one_f_one_b(opt, part);
  if (style == "interleaved") return interleaved(opt, part);
  fail("[schedule] unknown style '{}' (expected gpipe, 1f1b or interleaved)", style);
}

}  // namespace cai::schedule
