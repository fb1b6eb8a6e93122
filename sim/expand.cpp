#include "expand.h"

#include <fmt/format.h>

#include <map>
#include <tuple>

#include "cai/core/error.h"

namespace cai::sim {

namespace {

// The executor's message tags (schedule::message_tag: one definition for both).
constexpr schedule::Message kActivation = schedule::Message::Activation,
                            kGrad = schedule::Message::Grad;
int64_t tag_of(int mb, int vs, int virtual_stages, schedule::Message kind) {
  return schedule::message_tag(mb, vs, virtual_stages, kind);
}

template <typename T>
T per(const std::vector<T>& v, int i, int n, const char* what, T none) {
  if (v.empty()) return none;
  if (v.size() == 1) return v[0];
  CAI_CHECK(static_cast<int>(v.size()) == n, "[sim] expand: {} has {} entries, expected 1 or {}",
            what, v.size(), n);
  return v[i];
}

}  // namespace

Workload expand_schedule(const schedule::Schedule& s, const ExpandOptions& opt) {
  using schedule::Op;
  const int P = s.stages, V = s.virtual_stages();
  CAI_CHECK(opt.dp >= 1 && opt.copies >= 1, "[sim] expand: dp = {} and copies = {} must be >= 1",
            opt.dp, opt.copies);
  CAI_CHECK(static_cast<int>(s.programs.size()) == P,
            "[sim] expand: schedule '{}' has {} programs for {} stages", s.name, s.programs.size(),
            P);
  CAI_CHECK(opt.forward_s.size() == 1 || static_cast<int>(opt.forward_s.size()) == V,
            "[sim] expand: forward_s has {} entries, expected 1 or {}", opt.forward_s.size(), V);
  CAI_CHECK(opt.backward_s.size() == 1 || static_cast<int>(opt.backward_s.size()) == V,
            "[sim] expand: backward_s has {} entries, expected 1 or {}", opt.backward_s.size(), V);
  CAI_CHECK(opt.static_mem.empty() || static_cast<int>(opt.static_mem.size()) == P,
            "[sim] expand: static_mem has {} entries, expected {}", opt.static_mem.size(), P);
  Workload w;
  w.name = fmt::format("{} p={} m={} v={} dp={}", s.name, P, s.micro_batches, s.chunks, opt.dp);
  w.dtype = opt.dtype;
  w.global_batch = opt.global_batch;
  w.copies = opt.copies;
  w.ranks.resize(static_cast<size_t>(P) * opt.dp);
  const auto gbytes = [&](int st) { return per<int64_t>(opt.grad_bytes, st, P, "grad_bytes", 0); };
  for (int d = 0; d < opt.dp; ++d)
    for (int st = 0; st < P; ++st) {
      const int rank = d * P + st;
      auto global = [&](int pp_rank) { return d * P + pp_rank; };
      RankProgram& rp = w.ranks[rank];
      rp.label = fmt::format("rank {} (pp {}, dp {})", rank, st, d);
      rp.stage = st;
      if (!opt.static_mem.empty()) rp.initial_mem = opt.static_mem[st];
      // Receives are posted ahead where schedule::receive_posting puts them (pipeline.cpp, and
      // the plan's replay counts them so): a buffer from the instruction it is posted before,
      // its kernel holding a share of the GPU from then (Op::posted_after); the received buffer
      // becomes the consumer's input.
      const schedule::Program& prog = s.programs[st];
      const auto posting = schedule::receive_posting(s, st, true);
      auto boundary_bytes = [&](const schedule::Instr& in) {
        return opt.boundary_bytes >= 0 ? opt.boundary_bytes : in.bytes;
      };
      std::map<std::tuple<int, int, int>, int64_t> transfers;  // {op, mb, chunk} -> bytes
      for (const schedule::Instr& in : prog)
        if (schedule::is_send(in.op) || schedule::is_recv(in.op))
          transfers[{static_cast<int>(in.op), in.mb, in.chunk}] = in.bytes;
      std::vector<int> sends;  // ops on other streams, waited by ReduceGrads
      int last0 = -1;          // last op on stream 0
      int cur_instr = -1;      // the instruction being expanded (Op::instr)
      auto push = [&](sim::Op o) {
        o.instr = cur_instr;
        rp.ops.push_back(std::move(o));
        const int i = static_cast<int>(rp.ops.size()) - 1;
        if (rp.ops[i].stream == 0) last0 = i;
        return i;
      };
      // An op of a callback's list (the k-th, the list starting at index `base`): its deps are
      // list positions (0 <= d < k) or, negative, earlier ops of the program (-1 - index).
      auto push_extra = [&](sim::Op o, int k, int base, const std::string& name) {
        for (int& d : o.deps) {
          if (d < 0) {
            d = -1 - d;
            CAI_CHECK(d < base,
                      "[sim] expand: op '{}' of {} depends on program op {}, not an earlier one",
                      o.name, name, d);
            continue;
          }
          CAI_CHECK(d < k,
                    "[sim] expand: op '{}' of {} depends on {}, not an earlier op of the list",
                    o.name, name, d);
          d += base;
        }
        // The host issues it after what came before on stream 0.
        if (o.stream != 0 && last0 >= 0) o.deps.push_back(last0);
        if (o.stream != 0) sends.push_back(static_cast<int>(rp.ops.size()));
        return push(std::move(o));
      };
      // The ops `after` adds behind instruction `in` (ReduceGrads, OptimizerStep).
      auto push_after = [&](const schedule::Instr& in, const std::string& name) {
        if (!opt.after) return;
        const int base = static_cast<int>(rp.ops.size());
        std::vector<sim::Op> ops = opt.after(in, rank, base, w);
        for (size_t k = 0; k < ops.size(); ++k)
          push_extra(std::move(ops[k]), static_cast<int>(k), base, name);
      };
      // Per receive instruction: the op after which it is posted (-1: before the first one).
      std::vector<int> posted_after(prog.size(), -1);
      for (size_t ii = 0; ii < s.programs[st].size(); ++ii) {
        const schedule::Instr& in = s.programs[st][ii];
        cur_instr = static_cast<int>(ii);
        for (size_t k : posting[ii]) {  // posted before this instruction, after the last host op
          posted_after[k] = last0;
          const int64_t b = boundary_bytes(prog[k]);
          if (last0 < 0)
            rp.initial_mem[static_cast<int>(MemKind::Buffers)] += b;
          else
            rp.ops[last0].mem_end.push_back({MemKind::Buffers, b});
        }
        const int vs = s.virtual_stage(st, in.chunk);
        const int64_t bytes = opt.boundary_bytes >= 0 ? opt.boundary_bytes : in.bytes;
        const int64_t act = per<int64_t>(opt.activation_bytes, vs, V, "activation_bytes", 0);
        const std::string name = in.str();
        // Boundary buffers: a Forward consumes its received input and produces the output to
        // send; a Backward(Input) consumes the received gradient and produces the one to send.
        // A compute instruction without bytes of its own (the plan's programs size only the
        // transfers) takes those of the receive and the send of its micro-batch and chunk.
        auto transfer = [&](Op kind) {
          if (opt.boundary_bytes >= 0 || in.bytes > 0) return bytes;
          auto it = transfers.find({static_cast<int>(kind), in.mb, in.chunk});
          return it == transfers.end() ? int64_t{0} : it->second;
        };
        std::vector<MemDelta> boundary;
        if (in.op == Op::Forward) {
          if (vs > 0) boundary.push_back({MemKind::Buffers, -transfer(Op::RecvActivation)});
          if (vs < V - 1) boundary.push_back({MemKind::Buffers, transfer(Op::SendActivation)});
        } else if (in.op == Op::Backward || in.op == Op::BackwardInput) {
          if (vs < V - 1) boundary.push_back({MemKind::Buffers, -transfer(Op::RecvGrad)});
          if (vs > 0) boundary.push_back({MemKind::Buffers, transfer(Op::SendGrad)});
        }
        if (opt.compute && schedule::is_compute(in.op)) {
          const int base = static_cast<int>(rp.ops.size());
          std::vector<sim::Op> ops = opt.compute(in, rank, vs, base, w);
          int last_compute = -1;
          for (size_t k = 0; k < ops.size(); ++k) {
            sim::Op& o = ops[k];
            if (o.mb < 0) o.mb = in.mb;
            const int i = push_extra(std::move(o), static_cast<int>(k), base, name);
            if (rp.ops[i].stream == 0) last_compute = i;
          }
          CAI_CHECK(last_compute >= 0,
                    "[sim] expand: the ops of {} on rank {} have none on stream 0", name, rank);
          for (const MemDelta& d : boundary) rp.ops[last_compute].mem_end.push_back(d);
          continue;
        }
        switch (in.op) {
          case Op::LoadMicroBatch:
            push(sim::Op::compute(name, opt.load_s, in.mb, "load"));
            break;
          case Op::Forward: {
            sim::Op o =
                sim::Op::compute(name, per<double>(opt.forward_s, vs, V, "forward_s", 0), in.mb);
            if (act) o.mem_end.push_back({MemKind::Activations, act});
            for (const MemDelta& d : boundary) o.mem_end.push_back(d);  // input, output
            push(std::move(o));
            break;
          }
          case Op::Backward:
          case Op::BackwardInput:
          case Op::BackwardWeight: {
            const double b = per<double>(opt.backward_s, vs, V, "backward_s", 0);
            const double t = in.op == Op::Backward        ? b
                             : in.op == Op::BackwardInput ? b * opt.backward_input_share
                                                          : b * (1 - opt.backward_input_share);
            sim::Op o = sim::Op::compute(name, t, in.mb);
            for (const MemDelta& d : boundary) o.mem_end.push_back(d);  // grads in and out
            if (act && in.op != Op::BackwardInput)
              o.mem_end.push_back({MemKind::Activations, -act});
            push(std::move(o));
            break;
          }
          case Op::SendActivation:
          case Op::SendGrad: {
            const bool a = in.op == Op::SendActivation;
            sim::Op o =
                sim::Op::send(name, global(in.peer), tag_of(in.mb, vs, V, a ? kActivation : kGrad),
                              bytes, a ? 1 : 2);
            o.mb = in.mb;
            if (last0 >= 0) o.deps.push_back(last0);
            o.mem_end.push_back({MemKind::Buffers, -bytes});
            sends.push_back(push(std::move(o)));
            break;
          }
          case Op::RecvActivation:
          case Op::RecvGrad: {
            const bool a = in.op == Op::RecvActivation;
            sim::Op o = sim::Op::recv(
                name, global(in.peer),
                a ? tag_of(in.mb, vs - 1, V, kActivation) : tag_of(in.mb, vs + 1, V, kGrad), bytes);
            o.mb = in.mb;
            o.posted_after = posted_after[ii];
            push(std::move(o));
            break;
          }
          case Op::ReduceGrads: {
            sim::Op o;
            if (opt.dp * opt.copies > 1 && gbytes(st) > 0) {
              std::vector<int> group;
              for (int k = 0; k < opt.dp; ++k) group.push_back(k * P + st);
              o = sim::Op::collective(OpKind::AllReduce, name, w.add_group(group, opt.copies > 1),
                                      gbytes(st), 0);
            } else {
              o = sim::Op::compute(name, 0.0);
            }
            o.category = "reduce";
            o.deps = sends;
            push(std::move(o));
            push_after(in, name);
            break;
          }
          case Op::OptimizerStep:
            if (!opt.optimizer_elements.empty() && opt.optimizer_on_host) {
              if (st < static_cast<int>(opt.host_clip_elements.size()) &&
                  opt.host_clip_elements[st] > 0) {
                sim::Op c = sim::Op::compute("ClipSum", -1.0, -1, "optimizer");
                c.kind = OpKind::Host;
                c.bytes = static_cast<int64_t>(4 * opt.host_clip_elements[st]);
                c.op_kind = "host_sum";
                push(std::move(c));
              }
              sim::Op o = sim::Op::compute("OptStep", -1.0, -1, "optimizer");
              o.kind = OpKind::Host;
              o.flops = opt.optimizer_elements.at(st);
              o.op_kind = "host_adam";
              push(std::move(o));
            } else if (!opt.optimizer_elements.empty()) {
              sim::Op o = sim::Op::compute("OptStep", -1.0, -1, "optimizer");
              o.flops = opt.optimizer_elements.at(st);
              o.mem_bytes = opt.optimizer_bytes_per_element * o.flops;
              o.op_kind = "optimizer";
              o.cal_key = "optimizer|step";
              push(std::move(o));
            } else {
              push(sim::Op::compute("OptStep", opt.optimizer_s, -1, "optimizer"));
            }
            push_after(in, name);
            break;
        }
      }
    }
  return w;
}

}  // namespace cai::sim
