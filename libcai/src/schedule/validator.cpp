// The schedule validator: a concurrent replay of all programs with blocking receives and buffered
// sends, checking dependencies and pairing, and timing every instruction under a CostModel.
#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <optional>

#include "cai/core/error.h"
#include "cai/schedule/schedule.h"

namespace cai::schedule {
namespace {

struct Message {
  int mb, src_vstage, src_instr;
  int64_t bytes;
  double arrival;
};

class Replay {
 public:
  Replay(const Schedule& s, const CostModel& cost, int limit) : s_(s), cost_(cost), limit_(limit) {}

  ValidationResult run() {
    if (auto e = check_shape()) return fail_with(*e);
    p_ = s_.stages;
    m_ = s_.micro_batches;
    nv_ = s_.virtual_stages();
    try {
      place_ = placement_table(s_.placement, p_, s_.chunks);
    } catch (const Error& e) {
      return fail_with(std::string(e.what()).substr(std::string("[schedule] ").size()));
    }
    vs_of_.assign(p_, {});
    chunk_.assign(nv_, 0);
    for (int v = 0; v < nv_; ++v) {
      chunk_[v] = static_cast<int>(vs_of_[place_[v]].size());
      vs_of_[place_[v]].push_back(v);
    }
    res_.peak_activations.assign(p_, 0);
    res_.peak_pending_weights.assign(p_, 0);
    pending_w_.assign(p_, 0);
    res_.busy.assign(p_, 0.0);
    res_.times.resize(p_);
    for (int r = 0; r < p_; ++r) res_.times[r].assign(s_.programs[r].size(), InstrTime{});
    if (auto e = check_layers()) return fail_with(*e);

    const size_t cells = static_cast<size_t>(m_) * nv_;
    fwd_.assign(cells, false);
    bwd_in_.assign(cells, false);
    bwd_.assign(cells, false);
    split_.assign(cells, false);
    act_in_.assign(cells, false);
    grad_in_.assign(cells, false);
    loaded_.assign(static_cast<size_t>(p_) * m_, false);
    channels_.assign(2 * static_cast<size_t>(p_) * p_, {});
    pc_.assign(p_, 0);
    t_.assign(p_, 0.0);
    live_.assign(p_, 0);
    reduced_.assign(p_, false);
    stepped_.assign(p_, false);

    for (;;) {
      bool progress = false, finished = true;
      for (int r = 0; r < p_; ++r) {
        const Program& prog = s_.programs[r];
        while (pc_[r] < prog.size()) {
          bool blocked = false;
          if (auto e = exec(r, prog[pc_[r]], blocked)) return fail_with(where(r, pc_[r]) + *e);
          if (blocked) break;
          ++pc_[r];
          progress = true;
        }
        finished = finished && pc_[r] == prog.size();
      }
      if (finished) break;
      if (!progress) {
        std::string msg = "deadlock: no rank can progress;";
        for (int r = 0; r < p_; ++r)
          if (pc_[r] < s_.programs[r].size())
            msg +=
                fmt::format(" rank {} waits at #{} {};", r, pc_[r], s_.programs[r][pc_[r]].str());
        msg.pop_back();
        return fail_with(msg);
      }
    }
    if (auto e = check_end()) return fail_with(*e);

    res_.makespan = *std::max_element(t_.begin(), t_.end());
    double busy = 0;
    for (double b : res_.busy) busy += b;
    res_.bubble_fraction = res_.makespan > 0 ? 1.0 - busy / (p_ * res_.makespan) : 0.0;
    res_.ok = true;
    return std::move(res_);
  }

 private:
  using Err = std::optional<std::string>;

  size_t cell(int mb, int v) const { return static_cast<size_t>(mb) * nv_ + v; }
  int vstage(int rank, int chunk) const { return vs_of_[rank][chunk]; }
  int rank_of(int v) const { return place_[v]; }
  int chunk_of(int v) const { return chunk_[v]; }
  std::deque<Message>& channel(bool grad, int src, int dst) {
    return channels_[(grad ? 1 : 0) * p_ * p_ + src * p_ + dst];
  }
  std::string where(int r, size_t i) const {
    return fmt::format("rank {} #{} {}: ", r, i, s_.programs[r][i].str());
  }
  std::string label(int mb, int v) const {
    return fmt::format("(mb={},vs={} on rank {} c={})", mb, v, rank_of(v), chunk_of(v));
  }
  ValidationResult fail_with(const std::string& msg) {
    res_.ok = false;
    res_.error = "[schedule] " + (s_.name.empty() ? std::string() : s_.name + ": ") + msg;
    if (!t_.empty()) res_.makespan = *std::max_element(t_.begin(), t_.end());
    return std::move(res_);
  }

  Err check_shape() const {
    if (s_.stages < 1) return fmt::format("stages must be >= 1 (got {})", s_.stages);
    if (s_.micro_batches < 1)
      return fmt::format("micro_batches must be >= 1 (got {})", s_.micro_batches);
    if (s_.chunks < 1) return fmt::format("chunks must be >= 1 (got {})", s_.chunks);
    if (static_cast<int>(s_.programs.size()) != s_.stages)
      return fmt::format("{} programs for {} stages", s_.programs.size(), s_.stages);
    return {};
  }

  // Compute instructions of one virtual stage agree on its layer range; when layer ranges are
  // given at all, they tile [0, L) in virtual-stage order with >= 1 layer each.
  Err check_layers() const {
    std::vector<std::optional<std::pair<int, int>>> range(nv_);
    bool any = false;
    for (int r = 0; r < p_; ++r)
      for (size_t i = 0; i < s_.programs[r].size(); ++i) {
        const Instr& in = s_.programs[r][i];
        if (!is_compute(in.op) || in.chunk < 0 || in.chunk >= s_.chunks) continue;
        const int v = vstage(r, in.chunk);
        const std::pair<int, int> got{in.first_layer, in.num_layers};
        any = any || in.num_layers != 0;
        if (!range[v]) range[v] = got;
        if (*range[v] != got)
          return where(r, i) + fmt::format(
                                   "layer range [{}, +{}) differs from [{}, +{}) of "
                                   "other instructions of virtual stage {}",
                                   got.first, got.second, range[v]->first, range[v]->second, v);
      }
    if (!any) return {};
    int next = 0;
    for (int v = 0; v < nv_; ++v) {
      if (!range[v]) continue;  // no compute for it: reported by the replay
      if (range[v]->first != next || range[v]->second < 1)
        return fmt::format(
            "virtual stage {} computes layers [{}, +{}), expected to start at {} "
            "with >= 1 layer (stages must tile the layers in order)",
            v, range[v]->first, range[v]->second, next);
      next = range[v]->first + range[v]->second;
    }
    return {};
  }

  double compute_cost(const Instr& in) const {
    const double scale = cost_.per_layer ? in.num_layers : 1.0;
    switch (in.op) {
      case Op::Forward:
        return cost_.forward * scale;
      case Op::Backward:
        return cost_.backward * scale;
      case Op::BackwardInput:
        return cost_.backward * cost_.backward_input_share * scale;
      case Op::BackwardWeight:
        return cost_.backward * (1 - cost_.backward_input_share) * scale;
      default:
        return 0;
    }
  }

  Err exec(int r, const Instr& in, bool& blocked) {
    const size_t i = pc_[r];
    const bool has_mb = in.op != Op::ReduceGrads && in.op != Op::OptimizerStep;
    if (has_mb && (in.mb < 0 || in.mb >= m_))
      return fmt::format("micro-batch {} out of range [0, {})", in.mb, m_);
    if (in.chunk < 0 || in.chunk >= s_.chunks)
      return fmt::format("chunk {} out of range [0, {})", in.chunk, s_.chunks);
    if (in.bytes < 0) return fmt::format("negative bytes {}", in.bytes);
    const int v = vstage(r, in.chunk), last = nv_ - 1;
    const int mb = in.mb;
    double start = t_[r], end = start;

    switch (in.op) {
      case Op::LoadMicroBatch: {
        if (v != 0 && v != last)
          return fmt::format("virtual stage {} is neither the first nor the last: nothing to load",
                             v);
        if (loaded_[r * m_ + mb])
          return fmt::format("micro-batch {} already loaded on rank {}", mb, r);
        loaded_[r * m_ + mb] = true;
        end = start + cost_.load;
        break;
      }
      case Op::Forward: {
        const size_t c = cell(mb, v);
        if (fwd_[c]) return fmt::format("second Forward of {}", label(mb, v));
        if ((v == 0 || v == last) && !loaded_[r * m_ + mb])
          return fmt::format("micro-batch {} ({}) not loaded on this rank before its Forward", mb,
                             v == 0 ? "images" : "labels");
        if (v > 0) {
          if (rank_of(v - 1) == r) {
            if (!fwd_[cell(mb, v - 1)])
              return fmt::format("input from Forward{} has not run yet", label(mb, v - 1));
          } else {
            if (!act_in_[c])
              return fmt::format(
                  "activation from {} was not received (no RecvActivation before "
                  "this Forward)",
                  label(mb, v - 1));
            act_in_[c] = false;
          }
        }
        fwd_[c] = true;
        res_.peak_activations[r] = std::max(res_.peak_activations[r], ++live_[r]);
        if (limit_ > 0 && live_[r] > limit_)
          return fmt::format(
              "{} live activations on rank {} (the inputs held for BackwardWeight included) "
              "exceed the limit of {}",
              live_[r], r, limit_);
        end = start + compute_cost(in);
        break;
      }
      case Op::Backward:
      case Op::BackwardInput: {
        const size_t c = cell(mb, v);
        if (!fwd_[c]) return fmt::format("backward of {} before its Forward", label(mb, v));
        if (bwd_in_[c]) return fmt::format("second backward of {}", label(mb, v));
        if (v < last) {
          if (rank_of(v + 1) == r) {
            if (!bwd_in_[cell(mb, v + 1)])
              return fmt::format("grad from the backward of {} has not run yet", label(mb, v + 1));
          } else {
            if (!grad_in_[c])
              return fmt::format(
                  "grad from {} was not received (no RecvGrad before this "
                  "backward)",
                  label(mb, v + 1));
            grad_in_[c] = false;
          }
        }
        bwd_in_[c] = true;
        if (in.op == Op::Backward) {
          bwd_[c] = true;
          --live_[r];
        } else {
          split_[c] = true;
          res_.peak_pending_weights[r] = std::max(res_.peak_pending_weights[r], ++pending_w_[r]);
        }
        end = start + compute_cost(in);
        break;
      }
      case Op::BackwardWeight: {
        const size_t c = cell(mb, v);
        if (!split_[c])
          return fmt::format("BackwardWeight of {} without a BackwardInput before it",
                             label(mb, v));
        if (bwd_[c]) return fmt::format("second BackwardWeight of {}", label(mb, v));
        bwd_[c] = true;
        --live_[r];
        --pending_w_[r];
        end = start + compute_cost(in);
        break;
      }
      case Op::SendActivation:
      case Op::SendGrad: {
        const bool grad = in.op == Op::SendGrad;
        const int to = grad ? v - 1 : v + 1;
        if (to < 0 || to > last)
          return fmt::format("virtual stage {} has no {} neighbour to send to", v,
                             grad ? "previous" : "next");
        if (in.peer != rank_of(to) || in.peer == r)
          return fmt::format("peer {} is wrong: virtual stage {} is on rank {}{}", in.peer, to,
                             rank_of(to),
                             rank_of(to) == r ? " (this rank: no transfer needed)" : "");
        if (grad ? !bwd_in_[cell(mb, v)] : !fwd_[cell(mb, v)])
          return fmt::format("sends the {} of {} before it was computed",
                             grad ? "grad" : "activation", label(mb, v));
        channel(grad, r, in.peer)
            .push_back(Message{mb, v, static_cast<int>(i), in.bytes,
                               start + cost_.comm + cost_.comm_per_byte * in.bytes});
        break;
      }
      case Op::RecvActivation:
      case Op::RecvGrad: {
        const bool grad = in.op == Op::RecvGrad;
        const int from = grad ? v + 1 : v - 1;
        if (from < 0 || from > last)
          return fmt::format("virtual stage {} has no {} neighbour to receive from", v,
                             grad ? "next" : "previous");
        if (in.peer != rank_of(from) || in.peer == r)
          return fmt::format("peer {} is wrong: virtual stage {} is on rank {}{}", in.peer, from,
                             rank_of(from),
                             rank_of(from) == r ? " (this rank: no transfer needed)" : "");
        auto& q = channel(grad, in.peer, r);
        if (q.empty()) {
          blocked = true;
          return {};
        }
        const Message msg = q.front();
        if (msg.mb != mb || msg.src_vstage != from)
          return fmt::format(
              "the oldest pending {} from rank {} is #{} {} ({}), not {}: sends "
              "and receives pair in a different order",
              grad ? "grad" : "activation", in.peer, msg.src_instr,
              s_.programs[in.peer][msg.src_instr].str(), label(msg.mb, msg.src_vstage),
              label(mb, from));
        if (msg.bytes != in.bytes)
          return fmt::format("receives {} bytes, rank {} #{} sent {}", in.bytes, in.peer,
                             msg.src_instr, msg.bytes);
        char& slot = grad ? grad_in_[cell(mb, v)] : act_in_[cell(mb, v)];
        if (slot) return fmt::format("second receive for {} before it was used", label(mb, v));
        q.pop_front();
        slot = true;
        end = std::max(start, msg.arrival);
        res_.times[r][i] = {start, end};
        t_[r] = end;
        return {};  // waiting is not busy time
      }
      case Op::ReduceGrads: {
        if (reduced_[r]) return "second ReduceGrads";
        for (int mbi = 0; mbi < m_; ++mbi)
          for (int ch = 0; ch < s_.chunks; ++ch)
            if (!bwd_[cell(mbi, vstage(r, ch))])
              return fmt::format("runs before the (weight) backward of {}",
                                 label(mbi, vstage(r, ch)));
        reduced_[r] = true;
        end = start + cost_.reduce;
        break;
      }
      case Op::OptimizerStep: {
        if (!reduced_[r]) return "OptimizerStep before ReduceGrads";
        if (i + 1 != s_.programs[r].size())
          return fmt::format("OptimizerStep must be the last instruction ({} follow it)",
                             s_.programs[r].size() - i - 1);
        stepped_[r] = true;
        end = start + cost_.optimizer;
        break;
      }
    }
    res_.times[r][i] = {start, end};
    res_.busy[r] += end - start;
    t_[r] = end;
    return {};
  }

  Err check_end() {
    for (int r = 0; r < p_; ++r)
      for (int dst = 0; dst < p_; ++dst)
        for (bool grad : {false, true}) {
          const auto& q = channel(grad, r, dst);
          if (!q.empty())
            return where(r, q.front().src_instr) +
                   fmt::format("never received by rank {} ({} unmatched {} from rank {} to {})",
                               dst, q.size(), grad ? "grads" : "activations", r, dst);
        }
    for (int mb = 0; mb < m_; ++mb)
      for (int v = 0; v < nv_; ++v) {
        if (!fwd_[cell(mb, v)]) return fmt::format("no Forward of {}", label(mb, v));
        if (!bwd_[cell(mb, v)]) return fmt::format("no complete backward of {}", label(mb, v));
      }
    for (int r = 0; r < p_; ++r)
      if (!reduced_[r] || !stepped_[r])
        return fmt::format("rank {} does not end with ReduceGrads then OptimizerStep", r);
    return {};
  }

  const Schedule& s_;
  const CostModel& cost_;
  int limit_ = 0;
  int p_ = 0, m_ = 0, nv_ = 0;
  std::vector<int> place_, chunk_;       // virtual stage -> rank, chunk
  std::vector<std::vector<int>> vs_of_;  // rank -> chunk -> virtual stage
  std::vector<int> pending_w_;
  ValidationResult res_;
  std::vector<char> fwd_, bwd_in_, bwd_, split_, act_in_, grad_in_,
      loaded_;  // not vector<bool>: slots are bound by reference
  std::vector<std::deque<Message>> channels_;
  std::vector<size_t> pc_;
  std::vector<double> t_;
  std::vector<int> live_;
  std::vector<bool> reduced_, stepped_;
};

}  // namespace

ValidationResult validate(const Schedule& schedule, const CostModel& cost,
                          int max_live_activations) {
  return Replay(schedule, cost, max_live_activations).run();
}

ValidationResult validate_or_throw(const Schedule& schedule, const CostModel& cost,
                                   int max_live_activations) {
  ValidationResult r = validate(schedule, cost, max_live_activations);
  CAI_CHECK(r.ok, "{}", r.error);
  return r;
}

}  // namespace cai::schedule
