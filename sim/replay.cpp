#include "replay.h"

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <simgrid/s4u.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <unordered_map>

#include "cai/core/error.h"
#include "cai/dist/communicator.h"
#include "flows.h"
#include "platform.h"
#include "replay_internal.h"

namespace sg4 = simgrid::s4u;

namespace cai::sim {

CollectiveModel parse_collective_model(const std::string& s) {
  if (s == "bulk" || s == "calibrated") return CollectiveModel::Bulk;
  if (s == "step") return CollectiveModel::Step;
  if (s == "flows") return CollectiveModel::Flows;
  fail("[sim] unknown collective model '{}': expected bulk (or calibrated), step or flows", s);
}

const char* collective_model_name(CollectiveModel m) {
  return m == CollectiveModel::Bulk ? "bulk" : m == CollectiveModel::Step ? "step" : "flows";
}

int replicas_per_copy(const Cluster& c, int ranks_per_replica, int replicas) {
  if (ranks_per_replica < 1 || replicas <= 1) return std::max(replicas, 1);
  if (static_cast<int64_t>(ranks_per_replica) * replicas > c.gpus()) return replicas;
  for (int k = 1; k < replicas; ++k)
    if (replicas % k == 0 && (static_cast<int64_t>(k) * ranks_per_replica) % c.gpus_per_node == 0)
      return k;
  return replicas;
}

namespace {
// One compute op's duration: given, calibrated (interpolation kept within the roofline), or the
// roofline with the profile's efficiencies; counted in `count` by where it came from.
double op_seconds(const Op& o, const Cluster& c, const Calibration& cal, double peak,
                  double per_call, TimingSources* count) {
  if (o.seconds >= 0) {
    if (count) ++count->given;
    return o.seconds;
  }
  if (!o.covered_by.empty() && cal.has_samples(o.covered_by)) {  // timed inside that op's samples
    if (count) ++count->measured;
    return 0.0;
  }
  bool interpolated = false;
  double measured = o.cal_key.empty() ? -1 : cal.seconds_of(o.cal_key, o.flops, &interpolated);
  if (measured < 0 && !o.cal_fallback.empty())
    measured = cal.seconds_of(o.cal_fallback, o.flops, &interpolated);
  if (measured < 0 && o.op_kind == "copy" && o.flops == 0) {
    // A device copy: the profile's measured streaming bandwidth (Calibration::copy_seconds), and
    // at least its launches' "copy|call" each when it stands for several.
    measured = cal.copy_seconds(o.mem_bytes);
    if (measured >= 0) measured = std::max(measured, static_cast<double>(o.calls) * per_call);
    interpolated = true;
  }
  if (measured >= 0) {
    // Interpolation stays within the roofline: never faster than the peak.
    const double bound = o.op_kind == "optimizer"
                             ? o.mem_bytes / c.gpu.memory_bandwidth
                             : std::max(o.flops / peak, o.mem_bytes / c.gpu.memory_bandwidth);
    if (count) ++(interpolated ? count->interpolated : count->measured);
    return interpolated ? std::max(measured, bound) : measured;
  }
  const Efficiency& e = cal.of(o.op_kind);
  const double f = o.op_kind == "optimizer" ? 0.0 : o.flops / (peak * e.flops);
  if (count) ++count->roofline;
  return std::max({f, o.mem_bytes / (c.gpu.memory_bandwidth * e.bytes),
                   static_cast<double>(o.calls) * per_call});
}

// A host copy or host work of ZeRO-Offload (workload.h: HostCopy, Host); counted as measured
// when the profile's "host" entry timed it.
double host_seconds(const Op& o, const Cluster& c, const Calibration& cal, TimingSources* count) {
  if (o.seconds >= 0) {
    if (count) ++count->given;
    return o.seconds;
  }
  double rate = 0, fallback = 0, amount = static_cast<double>(o.bytes), latency = 0;
  if (o.kind == OpKind::HostCopy) {
    rate = o.to_device ? cal.h2d_bytes_per_s : cal.d2h_bytes_per_s;
    fallback = c.host.bandwidth;
    latency = c.host.latency;
  } else if (o.op_kind == "host_adam") {
    rate = cal.host_adam_elements_per_s;
    fallback = kHostAdamElementsPerS;
    amount = o.flops;
  } else {
    CAI_CHECK(o.op_kind == "host_add" || o.op_kind == "host_cast" || o.op_kind == "host_sum",
              "[sim] host op '{}' of kind '{}': expected host_add, host_cast, host_sum or "
              "host_adam",
              o.name, o.op_kind);
    rate = cal.host_add_bytes_per_s;
    fallback = kHostAddBytesPerS;
    // A cast moves 6 bytes an element (fp32 in, half out), a sum of squares 4 (x in), an add 12
    // (x and y in, y out): half and a third of an add's time for the same fp32 bytes.
    if (o.op_kind == "host_cast") amount *= 0.5;
    if (o.op_kind == "host_sum") amount /= 3.0;
  }
  if (count) ++(rate > 0 ? count->host_measured : count->host_placeholder);
  if (rate > 0) return amount / rate;
  CAI_CHECK(fallback > 0, "[sim] host copy '{}' of {} bytes: cluster '{}' gives no host link",
            o.name, o.bytes, c.name);
  return latency + amount / fallback;
}
}  // namespace

std::vector<std::vector<double>> compute_durations(const Workload& w, const Cluster& c,
                                                   const Calibration& cal, TimingSources* sources) {
  const double peak = c.gpu.peak_flops(w.dtype);
  const double per_call = std::max(0.0, cal.seconds_of("copy|call", 1.0, nullptr));
  std::vector<std::vector<double>> out(w.ranks.size());
  for (size_t r = 0; r < w.ranks.size(); ++r) {
    out[r].assign(w.ranks[r].ops.size(), 0.0);
    TimingSources* count = r == 0 ? sources : nullptr;
    // This rank's GPU against the one the profile timed (Calibration::gpu_time_factors), by its
    // place in its node.
    const int local_gpu = w.gpu_of(static_cast<int>(r)) % std::max(1, c.gpus_per_node);
    const double gpu_factor = cal.gpu_time_factor(local_gpu);
    if (sources && !cal.gpu_time_factors.empty()) {
      auto& f = sources->gpu_time_factors;
      if (static_cast<int>(f.size()) <= local_gpu) f.resize(local_gpu + 1, 0.0);
      f[local_gpu] = gpu_factor;
    }
    for (size_t i = 0; i < w.ranks[r].ops.size(); ++i) {
      const Op& o = w.ranks[r].ops[i];
      if (o.kind == OpKind::HostCopy || o.kind == OpKind::Host) {
        out[r][i] = host_seconds(o, c, cal, count);
        continue;
      }
      if (o.kind != OpKind::Compute) continue;
      // A split op (Op::share) takes its share of the timed op's duration.
      out[r][i] = gpu_factor * o.share * op_seconds(o, c, cal, peak, per_call, count);
    }
  }
  return out;
}

double calibrated_collective_seconds(const Calibration& cal, OpKind kind, int n, int64_t bytes,
                                     bool* interpolated) {
  if (cal.collectives.empty() || n <= 1) return -1;
  const bool round = kind == OpKind::BroadcastRound;
  const std::string op = measured_op_name(kind);
  const double t = cal.collective_seconds(op, kind == OpKind::Send ? 2 : n,
                                          static_cast<double>(bytes), interpolated);
  return t >= 0 && round ? t * n : t;  // a round: n broadcasts, each member the root of one
}

CommDurations comm_durations(const Workload& w, const detail::Matching& m, const Calibration& cal,
                             TimingSources* sources) {
  CommDurations out;
  out.instance.assign(m.instances.size(), -1.0);
  auto count = [&](double t, bool interpolated) {
    if (!sources) return;
    ++(t < 0          ? sources->comm_network
       : interpolated ? sources->comm_interpolated
                      : sources->comm_measured);
  };
  for (size_t id = 0; id < m.instances.size(); ++id) {
    const detail::Instance& in = m.instances[id];
    const int n = w.group_size(in.group_id);
    if (n <= 1) continue;  // nothing moves
    bool interpolated = false;
    const double t = calibrated_collective_seconds(cal, in.kind, n, in.bytes, &interpolated);
    out.instance[id] = t;
    count(t, interpolated);
  }
  out.send.resize(w.ranks.size());
  for (size_t r = 0; r < w.ranks.size(); ++r) {
    const auto& ops = w.ranks[r].ops;
    out.send[r].assign(ops.size(), -1.0);
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].kind != OpKind::Send) continue;
      bool interpolated = false;
      const double t =
          calibrated_collective_seconds(cal, OpKind::Send, 2, ops[i].bytes, &interpolated);
      out.send[r][i] = t;
      count(t, interpolated);
    }
  }
  return out;
}

namespace detail {

// The actor running one stream of one rank.
void Replayer::stream(int r, std::vector<int> ops) {
  const auto& prog = w.ranks[r].ops;
  // Receives are posted up front: a transfer runs as soon as its send starts.
  std::map<int, sg4::CommPtr> posted;
  std::vector<char*> data(ops.size(), nullptr);
  for (size_t k = 0; k < ops.size(); ++k) {
    const Op& o = prog[ops[k]];
    if (o.kind == OpKind::Recv)
      posted[ops[k]] = sg4::Mailbox::by_name(p2p_box(o.peer, r, o.tag))->get_async<char>(&data[k]);
  }
  sg4::Host* me = p.hosts[r];
  if (!posted.empty() && receives_posted[r] > 0)
    receive_hold[r] = hold({r}, posted_hold(receives_posted[r]));
  for (size_t k = 0; k < ops.size(); ++k) {
    const int i = ops[k];
    const Op& o = prog[i];
    wait_deps(r, o);
    start[r][i] = sg4::Engine::get_clock();
    if (o.kind == OpKind::Compute && exclusive[r]) {
      // Nothing else computes on this GPU, so a compute op takes exactly its duration: the
      // following compute ops whose dependencies are already met run back to back in one
      // sleep, as long as no other stream waits for an op inside the run (it would be woken
      // at the run's end). Their spans are the ones op-by-op execution gives.
      double t = start[r][i] + dur[r][i];
      end[r][i] = t;
      size_t last = k;
      while (last + 1 < ops.size() && !needed_elsewhere[r][ops[last]]) {
        const Op& n = prog[ops[last + 1]];
        if (n.kind != OpKind::Compute) break;
        bool ready = true;
        for (int d : n.deps) ready = ready && (done[r][d] || d == ops[last]);
        if (!ready) break;
        ++last;
        start[r][ops[last]] = t;
        t += dur[r][ops[last]];
        end[r][ops[last]] = t;
      }
      computing(r, 1);
      if (t > start[r][i]) sg4::this_actor::sleep_until(t);
      computing(r, -1);
      for (size_t j = k; j < last; ++j) done[r][ops[j]] = 1, --ops_left[r];
      k = last;
      finish(r, ops[last]);
      continue;
    }
    switch (o.kind) {
      case OpKind::Compute:
        if (dur[r][i] > 0) {
          auto pressed = press(r);
          computing(r, 1);
          sg4::this_actor::execute(dur[r][i] * me->get_speed());
          computing(r, -1);
          let_go(pressed);
        }
        break;
      case OpKind::Send: {
        if (links && links->covers("p2p") && comm_dur.send[r][i] < 0) {
          // Flows: the launch and step latency, then the message to the posted receive at the
          // fitted bandwidth (a pair between nodes uses one NIC).
          const SendFlow sf =
              send_flow(*links, static_cast<double>(o.bytes),
                        p.node_of[r] != p.node_of[o.peer] ? c.inter.nic_bandwidth : 0);
          auto held = hold({r, o.peer});
          if (sf.delay > 0) sg4::this_actor::sleep_for(sf.delay);
          sg4::CommPtr comm = sg4::Mailbox::by_name(p2p_box(r, o.peer, o.tag))
                                  ->put_init(&payload, std::max<uint64_t>(1, o.bytes));
          if (sf.rate > 0) comm->set_rate(sf.rate);
          comm->wait();
          let_go(held);
          break;
        }
        const double cal = comm_dur.send[r][i];
        if (cal >= 0) {
          // Calibrated: the measured one-way time, the last part of it the route latency that
          // an empty message to the posted receive takes.
          std::vector<sg4::Link*> links;
          double lat = 0;
          me->route_to(p.hosts[o.peer], links, &lat);
          auto held = hold({r, o.peer});
          if (cal > lat) sg4::this_actor::sleep_for(cal - lat);
          let_go(held);
          sg4::Mailbox::by_name(p2p_box(r, o.peer, o.tag))->put(&payload, 0);
          break;
        }
        sg4::CommPtr comm = sg4::Mailbox::by_name(p2p_box(r, o.peer, o.tag))
                                ->put_init(&payload, static_cast<uint64_t>(o.bytes));
        if (p.node_of[r] != p.node_of[o.peer]) comm->set_rate(c.inter.nic_bandwidth);
        comm->start();
        auto held = hold({r, o.peer});
        comm->wait();
        let_go(held);
        break;
      }
      case OpKind::Recv:
        posted.at(i)->wait();
        // A wait that napped notices the data when it wakes.
        if (wake > 0 && asleep(r, start[r][i])) sg4::this_actor::sleep_for(wake);
        break;
      case OpKind::HostCopy:
      case OpKind::Host:
        if (dur[r][i] > 0) sg4::this_actor::sleep_for(dur[r][i]);
        break;
      default:
        collective(r, i);
        break;
    }
    finish(r, i);
  }
}

void Replayer::launch() {
  const size_t R = w.ranks.size();
  computing_now.assign(R, 0);
  idle_since.assign(R, 0.0);
  wait_window.assign(R, 0.0);
  polls.assign(R, 0);
  polling.assign(R, nullptr);
  ops_left.assign(R, 0);
  for (size_t r = 0; r < R; ++r) ops_left[r] = w.ranks[r].ops.size();
  std::unordered_map<const sg4::Host*, int> on_host;  // ranks per host
  for (size_t r = 0; r < R; ++r) ++on_host[p.hosts[r]];
  auto multicore = [&](size_t r) { return p.hosts[r]->get_core_count() > 1; };
  for (size_t r = 0; r < R; ++r) {
    // The executor's wait policy: oversubscribed when the rank's host (a CPU node) has more
    // ranks than cores.
    const dist::WaitPolicy wp =
        dist::mpi_wait_policy(on_host[p.hosts[r]] > p.hosts[r]->get_core_count());
    wait_window[r] = wp.busy_polls * wake_poll + wp.yield_seconds;
    poll_cpu = wp.busy_polls * wake_poll;
    polls[r] = c.intra.fabric == Fabric::SharedMemory && poll_cpu > 0 &&
               on_host[p.hosts[r]] > p.hosts[r]->get_core_count();
    // A rank beside others on a multicore host (the CPU processes of a node) computes op by
    // op: its speed changes with theirs.
    if (multicore(r) && on_host[p.hosts[r]] > 1) exclusive[r] = 0;
  }
  node_peers.assign(R, {});
  if (contention > 0)
    for (size_t r = 0; r < R; ++r) {
      // While computing, a rank presses on every other host of its node, or on a multicore
      // host on that one host (max-min sharing over its cores then slows each computing rank
      // by `contention` per other computing rank, and a rank computing alone not at all, as
      // with a host per core).
      for (size_t q = 0; q < R; ++q) {
        if (q == r || p.node_of[q] != p.node_of[r]) continue;
        sg4::Host* h = multicore(r) ? p.hosts[r] : p.hosts[q];
        if ((multicore(r) || h != p.hosts[r]) &&
            std::find(node_peers[r].begin(), node_peers[r].end(), h) == node_peers[r].end())
          node_peers[r].push_back(h);
      }
      // Its compute speed changes with the others': op by op, not merged.
      if (!node_peers[r].empty()) exclusive[r] = 0;
    }
  for (size_t r = 0; r < w.ranks.size(); ++r) {
    std::map<int, std::vector<int>> streams;
    const auto& prog = w.ranks[r].ops;
    for (int i = 0; i < static_cast<int>(prog.size()); ++i) streams[prog[i].stream].push_back(i);
    for (auto& [s, ops] : streams)
      sg4::Actor::create(fmt::format("r{}s{}", r, s), p.hosts[r],
                         [this, r, ops = std::move(ops)]() mutable {
                           stream(static_cast<int>(r), std::move(ops));
                         });
  }
}

// Every rank's first unfinished op, or "" when all finished.
std::string Replayer::unfinished() const {
  std::string msg;
  int shown = 0;
  for (size_t r = 0; r < w.ranks.size() && shown < 8; ++r)
    for (size_t i = 0; i < done[r].size(); ++i)
      if (!done[r][i]) {
        msg += fmt::format("{}rank {} op {} ({} '{}')", msg.empty() ? "" : "; ", r, i,
                           op_kind_name(w.ranks[r].ops[i].kind), w.ranks[r].ops[i].name);
        ++shown;
        break;
      }
  return msg;
}

}  // namespace detail

namespace {

using detail::Replayer;

bool write_all(int fd, const void* buf, size_t n) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t k = ::write(fd, p, n);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// The SimGrid process: builds the platform, runs, writes 'O' + seconds + [start, end] per op, or
// 'E' + a message.
[[noreturn]] void child(int fd, const Workload& w, const detail::Matching& m, const Cluster& c,
                        const std::vector<std::vector<double>>& dur, const CommDurations& cd,
                        const ReplayOptions& opt, const LinkModel* links) {
  std::string out;
  try {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::string> args = simgrid_args();
    args.insert(args.begin(), "colossalai-sim");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int argc = static_cast<int>(args.size());
    sg4::Engine e(&argc, argv.data());
    Replayer rp(w, m, c, dur, cd, opt.collectives, opt.merge_compute, opt.calibration.overlap_share,
                opt.calibration.contention_share,
                opt.calibration.receive_share_at(static_cast<double>(w.micro_batch)));
    rp.wake = opt.calibration.wake_s;
    rp.wake_poll = opt.calibration.wake_poll_s;
    rp.links = links;
    rp.p = build_platform(links ? flow_cluster(c, *links) : c, static_cast<int>(w.ranks.size()),
                          w.dtype, w.copies, w.gpus);
    rp.launch();
    e.run();
    const std::string stuck = rp.unfinished();
    CAI_CHECK(stuck.empty(), "[sim] workload '{}' deadlocks: {}", w.name, stuck);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::vector<double> buf{secs};
    for (size_t r = 0; r < w.ranks.size(); ++r)
      for (size_t i = 0; i < rp.start[r].size(); ++i) {
        buf.push_back(rp.start[r][i]);
        buf.push_back(rp.end[r][i]);
      }
    const char tag = 'O';
    bool ok = write_all(fd, &tag, 1) && write_all(fd, buf.data(), buf.size() * sizeof(double));
    ::close(fd);
    ::_exit(ok ? 0 : 3);
  } catch (const std::exception& ex) {
    out = std::string("E") + ex.what();
  }
  write_all(fd, out.data(), out.size());
  ::close(fd);
  ::_exit(0);
}

double union_length(std::vector<Span> v) {
  std::sort(v.begin(), v.end(), [](const Span& a, const Span& b) { return a.start < b.start; });
  double total = 0, s = 0, e = -1;
  bool open = false;
  for (const Span& x : v) {
    if (!open || x.start > e) {
      if (open) total += e - s;
      s = x.start, e = x.end, open = true;
    } else {
      e = std::max(e, x.end);
    }
  }
  if (open) total += e - s;
  return total;
}

void measure(const Workload& w, ReplayResult& res) {
  double step = 0;
  for (const auto& rr : res.ranks) step = std::max(step, rr.end_s);
  res.step_s = step;
  res.img_per_s = w.global_batch > 0 && step > 0 ? w.global_batch / step : 0;
  const int S = w.stages();
  std::vector<double> bubble_sum(S, 0.0), measured_sum(S, 0.0);
  std::vector<int> count(S, 0);
  double pc_total = 0;
  for (size_t r = 0; r < w.ranks.size(); ++r) {
    const auto& prog = w.ranks[r];
    RankResult& rr = res.ranks[r];
    std::vector<Span> comp, comm, both, pipe;
    for (size_t i = 0; i < prog.ops.size(); ++i) {
      const Span& s = rr.spans[i];
      // Host work (ZeRO-Offload's adds and optimizer step) counts as computing.
      if (prog.ops[i].kind == OpKind::Compute || prog.ops[i].kind == OpKind::Host) {
        comp.push_back(s);
        if (prog.ops[i].category == "compute") pipe.push_back(s);
      } else {
        comm.push_back(s);
      }
      both.push_back(s);
    }
    rr.compute_s = union_length(comp);
    rr.pipeline_compute_s = union_length(pipe);
    rr.comm_total_s = union_length(comm);
    rr.comm_s = union_length(both) - rr.compute_s;
    rr.idle_s = std::max(0.0, step - rr.compute_s - rr.comm_s);
    pc_total += rr.pipeline_compute_s;
    bubble_sum[prog.stage] += step > 0 ? 1.0 - rr.pipeline_compute_s / step : 0.0;
    for (size_t i = 0; i < prog.ops.size(); ++i)
      if (prog.ops[i].category != "optimizer") rr.wall_s = std::max(rr.wall_s, rr.spans[i].end);
    measured_sum[prog.stage] += rr.wall_s > 0 ? 1.0 - rr.pipeline_compute_s / rr.wall_s : 0.0;
    ++count[prog.stage];

    // Memory: events sorted by time, frees before allocations at the same instant.
    struct Ev {
      double t;
      MemKind k;
      int64_t b;
    };
    std::vector<Ev> ev;
    for (size_t i = 0; i < prog.ops.size(); ++i) {
      for (const MemDelta& d : prog.ops[i].mem_start)
        ev.push_back({rr.spans[i].start, d.kind, d.bytes});
      for (const MemDelta& d : prog.ops[i].mem_end)
        ev.push_back({rr.spans[i].end, d.kind, d.bytes});
    }
    std::stable_sort(ev.begin(), ev.end(), [](const Ev& a, const Ev& b) {
      return a.t < b.t || (a.t == b.t && a.b < 0 && b.b >= 0);
    });
    std::array<int64_t, kMemKinds> cur = prog.initial_mem;
    int64_t total = 0;
    for (int64_t v : cur) total += v;
    rr.peak_mem = total;
    rr.mem_at_peak = cur;
    rr.memory.push_back({0.0, total, cur});
    for (const Ev& e : ev) {
      cur[static_cast<int>(e.k)] += e.b;
      total += e.b;
      if (!rr.memory.empty() && rr.memory.back().t == e.t)
        rr.memory.back().bytes = total, rr.memory.back().kinds = cur;
      else
        rr.memory.push_back({e.t, total, cur});
      if (total > rr.peak_mem) rr.peak_mem = total, rr.mem_at_peak = cur;
    }
  }
  res.bubble.assign(S, 0.0);
  res.bubble_measured.assign(S, 0.0);
  for (int s = 0; s < S; ++s) {
    res.bubble[s] = count[s] ? bubble_sum[s] / count[s] : 0.0;
    res.bubble_measured[s] = count[s] ? measured_sum[s] / count[s] : 0.0;
  }
  res.bubble_mean = step > 0 ? 1.0 - pc_total / (static_cast<double>(w.ranks.size()) * step) : 0;
}

}  // namespace

ReplayResult replay(const Workload& w, const Cluster& c, const ReplayOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  const detail::Matching m = detail::check_and_match(w);
  CAI_CHECK(static_cast<int64_t>(w.ranks.size()) * w.copies <= c.max_ranks(),
            "[sim] workload '{}' has {} ranks but cluster '{}' ({}) has {} GPUs{}", w.name,
            static_cast<int64_t>(w.ranks.size()) * w.copies, c.name, c.origin, c.gpus(),
            c.max_ranks_per_gpu > 1 ? fmt::format(" for {} ranks", c.max_ranks()) : "");
  CAI_CHECK(w.copies == 1 || opt.collectives != CollectiveModel::Step,
            "[sim] workload '{}' folds {} identical copies, which only the bulk and flows models "
            "replay: build it unfolded for the step-by-step model",
            w.name, w.copies);
  TimingSources timing;
  const auto dur = compute_durations(w, c, opt.calibration, &timing);
  {
    bool receives = false;
    for (const RankProgram& rp : w.ranks)
      for (const Op& o : rp.ops) receives = receives || (o.kind == OpKind::Recv && !o.copy_engine);
    const double share = opt.calibration.receive_share_at(static_cast<double>(w.micro_batch));
    if (receives && share > 0) {
      timing.posted_share = share;
      timing.posted_micro_batch = w.micro_batch;
    }
  }
  CommDurations cd = comm_durations(w, m, opt.calibration, &timing);
  // Flows: the link model of the calibration's collectives, which times every covered op. Bulk
  // with a calibration of collectives: the same model times the covered ops the calibration has
  // no sample for (group sizes it never ran: a 2-GPU profile predicting 4 GPUs), the measured
  // ones keep their measured times.
  LinkModel lm;
  const bool flows =
      opt.collectives == CollectiveModel::Flows ||
      (opt.collectives == CollectiveModel::Bulk && !opt.calibration.collectives.empty());
  if (flows) {
    lm = fit_links(opt.calibration, c.intra.latency);
    flow_timing(w, m, opt.calibration, lm, cd, timing, opt.collectives == CollectiveModel::Bulk);
  }
  // Buffered output would be written twice (by the child too) if it were not flushed now.
  std::fflush(stdout);
  std::fflush(stderr);
  int fds[2];
  CAI_CHECK(::pipe(fds) == 0, "[sim] pipe() failed: {}", std::strerror(errno));
  const pid_t pid = ::fork();
  CAI_CHECK(pid >= 0, "[sim] fork() failed: {}", std::strerror(errno));
  if (pid == 0) {
    ::close(fds[0]);
    child(fds[1], w, m, c, dur, cd, opt, flows && !lm.ops.empty() ? &lm : nullptr);
  }
  ::close(fds[1]);
  std::string data;
  char buf[1 << 16];
  for (;;) {
    const ssize_t k = ::read(fds[0], buf, sizeof buf);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    data.append(buf, static_cast<size_t>(k));
  }
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!data.empty() && data[0] == 'E') throw Error(data.substr(1));
  size_t total_ops = 0;
  for (const auto& r : w.ranks) total_ops += r.ops.size();
  const size_t want = 1 + (1 + 2 * total_ops) * sizeof(double);
  CAI_CHECK(data.size() == want && data[0] == 'O',
            "[sim] the SimGrid process {} (returned {} of {} bytes)",
            WIFSIGNALED(status) ? fmt::format("died of signal {}", WTERMSIG(status))
                                : fmt::format("exited with {}", WEXITSTATUS(status)),
            data.size(), want);
  std::vector<double> v(1 + 2 * total_ops);
  std::memcpy(v.data(), data.data() + 1, v.size() * sizeof(double));
  ReplayResult res;
  res.cluster = c.name;
  res.collectives = opt.collectives;
  res.copies = w.copies;
  res.simgrid_s = v[0];
  res.timing = timing;
  res.memory_limit = c.gpu.memory_bytes;
  res.ranks.resize(w.ranks.size());
  size_t k = 1;
  for (size_t r = 0; r < w.ranks.size(); ++r) {
    RankResult& rr = res.ranks[r];
    rr.spans.resize(w.ranks[r].ops.size());
    for (auto& s : rr.spans) {
      s.start = v[k++];
      s.end = v[k++];
      rr.end_s = std::max(rr.end_s, s.end);
    }
  }
  measure(w, res);
  res.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace cai::sim
