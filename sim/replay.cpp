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
  bool interpolated = false;
  const double measured =
      o.cal_key.empty() ? -1 : cal.seconds_of(o.cal_key, o.flops, &interpolated);
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
}  // namespace

std::vector<std::vector<double>> compute_durations(const Workload& w, const Cluster& c,
                                                   const Calibration& cal, TimingSources* sources) {
  const double peak = c.gpu.peak_flops(w.dtype);
  const double per_call = std::max(0.0, cal.seconds_of("copy|call", 1.0, nullptr));
  std::vector<std::vector<double>> out(w.ranks.size());
  for (size_t r = 0; r < w.ranks.size(); ++r) {
    out[r].assign(w.ranks[r].ops.size(), 0.0);
    TimingSources* count = r == 0 ? sources : nullptr;
    for (size_t i = 0; i < w.ranks[r].ops.size(); ++i) {
      const Op& o = w.ranks[r].ops[i];
      if (o.kind != OpKind::Compute) continue;
      // A split op (Op::share) takes its share of the timed op's duration.
      out[r][i] = o.share * op_seconds(o, c, cal, peak, per_call, count);
    }
  }
  return out;
}

double calibrated_collective_seconds(const Calibration& cal, OpKind kind, int n, int64_t bytes,
                                     bool* interpolated) {
  if (cal.collectives.empty() || n <= 1) return -1;
  const bool round = kind == OpKind::BroadcastRound;
  const std::string op = kind == OpKind::Send ? "p2p" : round ? "broadcast" : op_kind_name(kind);
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

namespace {

// Ring steps and bytes per step of a collective over n ranks of a `bytes` buffer. Broadcast is a
// chain pipelined in n chunks: n + (n - 2) steps of bytes / n.
void ring_shape(OpKind k, int n, int64_t bytes, int* steps, double* chunk) {
  *chunk = static_cast<double>(bytes) / n;
  switch (k) {
    case OpKind::AllReduce:
    case OpKind::Broadcast:
    case OpKind::BroadcastRound:  // per broadcast
      *steps = 2 * (n - 1);
      break;
    default:  // reduce-scatter, all-gather
      *steps = n - 1;
      break;
  }
}

uint64_t as_bytes(double b) {
  return static_cast<uint64_t>(std::llround(std::max(0.0, b)));
}

// Everything the actors share; lives in the SimGrid process only.
struct Replayer {
  const Workload& w;
  const detail::Matching& m;
  const Cluster& c;
  const std::vector<std::vector<double>>& dur;
  const CommDurations& comm_dur;
  CollectiveModel model;
  // CollectiveModel::Flows: the link model its collectives and sends run over (null otherwise).
  const LinkModel* links = nullptr;
  Platform p;
  std::vector<std::vector<double>> start, end;
  std::vector<std::vector<char>> done;
  // Per [rank][op]: how many actors wait for it now (finish() signals only then), and whether an
  // op of another stream depends on it (a run of compute ops must end there, see stream()).
  std::vector<std::vector<int>> awaited;
  std::vector<std::vector<char>> needed_elsewhere;
  // Per rank: its compute ops may run as sleeps, several in one: no other actor computes on its
  // GPU (ranks sharing a GPU, or compute ops on two streams of a rank, share the host's speed).
  std::vector<char> exclusive;
  std::vector<sg4::MutexPtr> mutex;
  std::vector<sg4::ConditionVariablePtr> cv;
  struct Meeting {  // a bulk collective's members so far
    int arrived = 0;
    std::vector<sg4::SemaphorePtr> waiting;
    std::vector<std::pair<int, double>> arrivals;  // {rank, clock}; only with `wake`
  };
  std::vector<Meeting> meetings;  // per collective instance
  std::unordered_map<int, double> group_latency;
  std::unordered_map<int, std::pair<double, double>> chain_cache;
  char payload = 0;  // SimGrid needs a non-null payload pointer

  // Calibration::overlap_share: the compute share a rank's in-flight communication takes;
  // Calibration::posted_share (-1: none measured, overlap_share then), a waiting posted receive's.
  double posted_share = -1;
  double share = 0;
  // Calibration::contention_share: the share of a core each other computing rank of the node
  // takes; per rank, the other hosts of its node (filled in launch()).
  double contention = 0;
  std::vector<std::vector<sg4::Host*>> node_peers;
  // Posted receives (the pipeline's, one per kind ahead, as the executor posts them): NCCL's
  // receive kernel holds its SMs from its posting until its data is in. Per rank: how many are
  // posted, the hold while any is, and per receive op whether another of its kind follows (it is
  // posted when this one completes).
  std::vector<int> receives_posted;
  std::vector<std::vector<sg4::ExecPtr>> receive_hold;
  std::vector<std::vector<char>> posts_next;
  // Calibration::wake_s, and per rank how long its waits poll before they nap
  // (dist::mpi_wait_policy of its node: more ranks than cores or not), its compute ops running
  // now, and when its last one ended: a rank that computes is not asleep in a wait.
  double wake = 0, wake_poll = 0;
  std::vector<double> wait_window;
  std::vector<int> computing_now;
  std::vector<double> idle_since;
  // CPU ranks whose core others share (more ranks than cores): a rank that stops computing
  // waits, and its wait's busy polls (dist::mpi_wait_policy: busy_polls tests of `wake_poll`)
  // take its core as any process does: `poll_cpu` seconds of it, shared with whoever computes
  // there, until it computes again or the polls are over. Per rank: whether it does, its polls
  // now, and its ops not yet done (its last one ends the polls: it is not waiting any more).
  double poll_cpu = 0;
  std::vector<char> polls;
  std::vector<sg4::ExecPtr> polling;
  std::vector<size_t> ops_left;

  Replayer(const Workload& w_, const detail::Matching& m_, const Cluster& c_,
           const std::vector<std::vector<double>>& d, const CommDurations& cd, CollectiveModel mo,
           bool merge, double overlap_share, double contention_share)
      : w(w_),
        m(m_),
        c(c_),
        dur(d),
        comm_dur(cd),
        model(mo),
        share(overlap_share),
        contention(contention_share) {
    const size_t R = w.ranks.size();
    start.resize(R);
    end.resize(R);
    done.resize(R);
    mutex.resize(R);
    cv.resize(R);
    meetings.resize(m.instances.size());
    awaited.resize(R);
    needed_elsewhere.resize(R);
    exclusive.assign(R, 1);
    // GPU of rank r: its slot mod GPUs (build_platform); count the actors computing on each.
    const size_t gpus = std::min<size_t>(R, static_cast<size_t>(c.gpus()));
    std::vector<int> computing(gpus, 0);
    for (size_t r = 0; r < R; ++r) {
      const auto& ops = w.ranks[r].ops;
      start[r].assign(ops.size(), -1.0);
      end[r].assign(ops.size(), -1.0);
      done[r].assign(ops.size(), 0);
      awaited[r].assign(ops.size(), 0);
      needed_elsewhere[r].assign(ops.size(), 0);
      std::vector<int> streams;
      bool talks = false;
      for (size_t i = 0; i < ops.size(); ++i) {
        for (int d : ops[i].deps)
          if (ops[d].stream != ops[i].stream) needed_elsewhere[r][d] = 1;
        if (ops[i].kind == OpKind::Compute && dur[r][i] > 0 &&
            std::find(streams.begin(), streams.end(), ops[i].stream) == streams.end())
          streams.push_back(ops[i].stream);
        talks = talks || takes_share(static_cast<int>(r), static_cast<int>(i));
      }
      // A rank whose communication takes a share of its GPU computes at a changing speed.
      computing[w.gpu_of(static_cast<int>(r)) % gpus] +=
          static_cast<int>(streams.size()) + (talks ? 1 : 0);
    }
    for (size_t r = 0; r < R; ++r)
      exclusive[r] = merge && computing[w.gpu_of(static_cast<int>(r)) % gpus] <= 1;
    receives_posted.assign(R, 0);
    receive_hold.resize(R);
    posts_next.resize(R);
    for (size_t r = 0; r < R; ++r) {
      const auto& ops = w.ranks[r].ops;
      posts_next[r].assign(ops.size(), 0);
      std::map<std::string, int> last;  // kind (the name up to its first '(' or space) -> op
      for (size_t i = 0; i < ops.size(); ++i) {
        if (ops[i].kind != OpKind::Recv) continue;
        const std::string kind = ops[i].name.substr(0, ops[i].name.find_first_of("( "));
        auto it = last.find(kind);
        if (it == last.end())
          ++receives_posted[r];
        else
          posts_next[r][it->second] = 1;
        last[kind] = static_cast<int>(i);
      }
    }
  }

  // The share of a rank's GPU that k posted receive kinds hold at once (a pipeline's middle
  // stage waits for activations and gradients): each posted NCCL receive holds SMs of its own, so
  // the work left runs at (1 - s)^k of its speed, s one posted receive's measured share.
  double posted_hold(int k) const {
    const double s1 = posted_share >= 0 ? posted_share : share;
    return 1.0 - std::pow(1.0 - s1, std::max(k, 1));
  }

  // Whether op i of rank r is communication that holds a share of the rank's GPU while in flight:
  // a transfer, or a collective over more than one rank.
  bool takes_share(int r, int i) const {
    if (share <= 0) return false;
    const Op& o = w.ranks[r].ops[i];
    if (o.copy_engine) return false;
    switch (o.kind) {
      case OpKind::Compute:
      case OpKind::HostCopy:
        return false;
      case OpKind::Send:
      case OpKind::Recv:
        return true;
      default:
        return w.group_size(m.instances[m.instance_of[r][i]].group_id) > 1;
    }
  }

  // While data moves, the communication's kernels take `share` of each GPU it moves on: an
  // execution bounded to that share of the host's speed beside the compute's, which SimGrid's
  // max-min sharing slows accordingly (waiting for a peer takes none).
  std::vector<sg4::ExecPtr> hold(const std::vector<int>& ranks, double fraction = -1) const {
    std::vector<sg4::ExecPtr> held;
    if (fraction < 0) fraction = share;
    if (fraction <= 0) return held;
    for (int q : ranks) held.push_back(take(p.hosts[q], fraction));
    return held;
  }
  // An endless execution on `h` bounded to `fraction` of its speed: what else runs there gets
  // the rest (SimGrid's max-min sharing); cancelled by let_go().
  static sg4::ExecPtr take(sg4::Host* h, double fraction) {
    return sg4::Exec::init()
        ->set_flops_amount(1e300)
        ->set_host(h)
        ->set_bound(fraction * h->get_speed())
        ->start();
  }
  // While rank r computes, it takes `contention` of every other host of its node: an execution
  // bounded to that share on each, which slows whatever computes there meanwhile (max-min
  // sharing) and costs nothing where nothing does.
  std::vector<sg4::ExecPtr> press(int r) const {
    std::vector<sg4::ExecPtr> held;
    if (contention <= 0) return held;
    for (sg4::Host* h : node_peers[r]) held.push_back(take(h, contention));
    return held;
  }
  static void let_go(std::vector<sg4::ExecPtr>& held) {
    for (const sg4::ExecPtr& e : held) e->cancel();
    held.clear();
  }

  // Whether rank q, waiting since `since` (its arrival at an operation), naps by now: it
  // computes nothing and has waited longer than its polling.
  bool asleep(int q, double since) const {
    const double waited = sg4::Engine::get_clock() - std::max(since, idle_since[q]);
    return computing_now[q] == 0 && waited > wait_window[q];
  }
  // The wake-up a collective pays when the last member arrives (`arrivals`: each member's
  // arrival): `wake` if a member arrived earlier and naps by now, else 0.
  double woken(const std::vector<std::pair<int, double>>& arrivals) const {
    if (wake <= 0) return 0;
    for (const auto& [q, t] : arrivals)
      if (asleep(q, t)) return wake;
    return 0;
  }
  void computing(int r, int delta) {
    if (computing_now[r] == 0 && delta > 0) stop_polling(r);
    computing_now[r] += delta;
    if (computing_now[r] == 0) {
      idle_since[r] = sg4::Engine::get_clock();
      if (polls[r] && ops_left[r] > 0)
        polling[r] = sg4::Exec::init()
                         ->set_flops_amount(poll_cpu * p.hosts[r]->get_speed())
                         ->set_host(p.hosts[r])
                         ->start();
    }
  }
  void stop_polling(int r) {
    if (polling[r] && polling[r]->get_state() != sg4::Activity::State::FINISHED)
      polling[r]->cancel();
    polling[r] = nullptr;
  }

  void wait_deps(int r, const Op& o) {
    for (int d : o.deps) {
      if (done[r][d]) continue;
      if (!mutex[r]) {  // actors are cooperative: creation cannot race
        mutex[r] = sg4::Mutex::create();
        cv[r] = sg4::ConditionVariable::create();
      }
      ++awaited[r][d];  // before the lock, which may yield: finish() sees it
      std::unique_lock<sg4::Mutex> lock(*mutex[r]);
      cv[r]->wait(lock, [&] { return done[r][d] != 0; });
      --awaited[r][d];
    }
  }

  void finish(int r, int i) {
    end[r][i] = sg4::Engine::get_clock();
    done[r][i] = 1;
    if (--ops_left[r] == 0) stop_polling(r);
    if (w.ranks[r].ops[i].kind == OpKind::Recv && !posts_next[r][i]) {
      // One kind fewer posted: the hold of the kinds still waiting (none: released).
      let_go(receive_hold[r]);
      if (--receives_posted[r] > 0) receive_hold[r] = hold({r}, posted_hold(receives_posted[r]));
    }
    if (awaited[r][i] > 0) {
      std::unique_lock<sg4::Mutex> lock(*mutex[r]);
      cv[r]->notify_all();
    }
  }

  // Latency and bottleneck bandwidth of the route a -> b, without contention.
  std::pair<double, double> edge(int a, int b) const {
    std::vector<sg4::Link*> links;
    double lat = 0, bw = 1e300;
    p.hosts[a]->route_to(p.hosts[b], links, &lat);
    for (const sg4::Link* l : links) bw = std::min(bw, l->get_bandwidth());
    return {lat, bw};
  }

  // Whether group g's ring goes on through the next copies of the job.
  bool wraps(int g) const { return w.copies > 1 && w.spans_copies(g); }

  // The host member q of group g sends to in its ring: the next member, or after the last listed
  // member of a ring spanning the copies, the first member's GPU in the next copy.
  sg4::Host* successor(int g, int q) const {
    const auto& G = w.groups[g];
    const int m = static_cast<int>(G.size());
    if (q + 1 < m) return p.hosts[G[q + 1]];
    return wraps(g) ? p.next[G[0]] : p.hosts[G[0]];
  }

  // Largest route latency over the ring's edges: the per-step latency of the slowest edge.
  double latency_of(int g) {
    auto it = group_latency.find(g);
    if (it != group_latency.end()) return it->second;
    const auto& G = w.groups[g];
    double worst = 0;
    for (size_t i = 0; i < G.size(); ++i) {
      std::vector<sg4::Link*> links;
      double lat = 0;
      p.hosts[G[i]]->route_to(successor(g, static_cast<int>(i)), links, &lat);
      worst = std::max(worst, lat);
    }
    return group_latency[g] = worst;
  }

  // Sum over the job's ring edges of latency + c / bandwidth (the listed edges, the last one to
  // the next copy for a ring spanning copies, times the copies), per group and chunk size.
  std::map<std::pair<int, double>, double> ring_cost_cache;
  double ring_cost(int g, double c) {
    auto it = ring_cost_cache.find({g, c});
    if (it != ring_cost_cache.end()) return it->second;
    const auto& G = w.groups[g];
    double sum = 0;
    for (size_t i = 0; i < G.size(); ++i) {
      std::vector<sg4::Link*> links;
      double lat = 0, bw = 1e300;
      p.hosts[G[i]]->route_to(successor(g, static_cast<int>(i)), links, &lat);
      for (const sg4::Link* l : links) bw = std::min(bw, l->get_bandwidth());
      sum += lat + c / bw;
    }
    if (wraps(g)) sum *= w.copies;
    return ring_cost_cache[{g, c}] = sum;
  }

  // A pipelined chain (broadcast) of C chunks of c bytes takes sum_e t_e + (C - 1) max_e t_e with
  // t_e = latency_e + c / bandwidth_e: the first chunk crosses every edge, the others follow at
  // the pace of the slowest edge. Returns {sum_e t_e, largest latency} over the chain's edges.
  std::pair<double, double> chain_fill(int id, const std::vector<int>& G, int root_pos, double c) {
    auto it = chain_cache.find(id);
    if (it != chain_cache.end()) return it->second;
    const int n = static_cast<int>(G.size());
    double fill = 0, lat_max = 0;
    for (int q = 0; q + 1 < n; ++q) {
      const auto [lat, bw] = edge(G[(q + root_pos) % n], G[(q + 1 + root_pos) % n]);
      fill += lat + c / bw;
      lat_max = std::max(lat_max, lat);
    }
    return chain_cache[id] = {fill, lat_max};
  }

  void collective(int r, int i) {
    const int id = m.instance_of[r][i], pos = m.position_of[r][i];
    // Moved by the copy engines: no kernel holds a share of the GPUs.
    const double frac = w.ranks[r].ops[i].copy_engine ? 0.0 : -1.0;
    const detail::Instance& in = m.instances[id];
    const auto& G = w.groups[in.group_id];
    const int n = w.group_size(in.group_id);  // every copy's members for a spanning ring
    const int listed = static_cast<int>(G.size());
    if (n == 1) return;
    int steps = 0;
    double chunk = 0;
    ring_shape(in.kind, n, in.bytes, &steps, &chunk);
    const bool chain = in.kind == OpKind::Broadcast;
    const bool round = in.kind == OpKind::BroadcastRound;
    // Position in the ring / chain (the chain starts at the root and follows the group order).
    const int q = chain ? (pos - in.root_pos + n) % n : pos;
    auto member = [&](int k) { return G[chain ? (k + in.root_pos) % n : k % n]; };
    // The members meet: all but the last to arrive wait (false), and the last runs the
    // collective for all of them (true; what a barrier, one flow per member and a second barrier
    // would do, with fewer SimGrid calls), then wakes them at its end (release()).
    Meeting& mt = meetings[id];
    auto meet = [&] {
      if (wake > 0) mt.arrivals.emplace_back(r, sg4::Engine::get_clock());
      if (++mt.arrived < (chain ? n : listed)) {
        // Blocked on a semaphore of its own (suspending the actor would also suspend the
        // receives it posted ahead).
        sg4::SemaphorePtr wake = sg4::Semaphore::create(0);
        mt.waiting.push_back(wake);
        wake->acquire();
        return false;
      }
      return true;
    };
    auto release = [&] {
      for (const sg4::SemaphorePtr& a : mt.waiting) a->release();
      mt.waiting = {};
    };
    if (links && links->covers(link_op(in.kind))) {
      // Flows over the fitted links (flows.h); a round is n broadcasts rooted at each member.
      if (!meet()) return;
      auto held = hold(w.groups[in.group_id], frac);
      if (const double late = woken(mt.arrivals); late > 0) sg4::this_actor::sleep_for(late);
      std::vector<Edge> edges;
      for (int t = 0; t < (round ? n : 1); ++t) {
        edges.clear();
        if (chain || round) {
          const int root = round ? t : in.root_pos;
          for (int k = 0; k + 1 < n; ++k)
            edges.push_back({p.hosts[G[(k + root) % n]], p.hosts[G[(k + 1 + root) % n]]});
        } else {
          for (int k = 0; k < listed; ++k)
            edges.push_back({p.hosts[G[k]], successor(in.group_id, k)});
        }
        run_flows(*links, link_op(in.kind), n, static_cast<double>(in.bytes), edges);
      }
      let_go(held);
      release();
      return;
    }
    if (comm_dur.instance[id] >= 0) {
      // Calibrated: the measured time of this collective on this group size, from the moment
      // every member is there (either model; the links carry nothing for it).
      if (!meet()) return;
      auto held = hold(w.groups[in.group_id], frac);
      const double t = comm_dur.instance[id] + woken(mt.arrivals);
      if (t > 0) sg4::this_actor::sleep_for(t);
      let_go(held);
      release();
      return;
    }
    if (model == CollectiveModel::Bulk) {
      if (!meet()) return;
      auto held = hold(w.groups[in.group_id], frac);
      if (const double late = woken(mt.arrivals); late > 0) sg4::this_actor::sleep_for(late);
      std::vector<sg4::CommPtr> flows;
      double after = 0;
      if (chain) {
        // Concurrent flows carry the C - 1 chunks that follow the first at the slowest edge's
        // pace (with its contention); the first chunk's trip through the chain and the remaining
        // per-chunk latencies are added after.
        const int chunks = n;
        for (int k = 0; k + 1 < n; ++k)
          flows.push_back(sg4::Comm::sendto_async(p.hosts[member(k)], p.hosts[member(k + 1)],
                                                  as_bytes((chunks - 1) * chunk)));
        const auto [fill, lat_max] = chain_fill(id, G, in.root_pos, chunk);
        after = fill + (chunks - 2) * lat_max;
      } else if (round) {
        // n broadcasts rooted at each member in turn: every ring edge but the one into the root
        // carries n - 1 chunks per broadcast, the edge into it idle while the chain's slowest
        // edge sets the pace. One flow per ring edge of n × (n - 1) chunks at once (as the n
        // broadcasts' flow phases back to back, each edge in its slowest chain's place), then
        // the rest of the n bulk broadcasts: n - 1 more flow latencies, each chunk's trip
        // through its chain (every edge in n - 1 of the n chains) and n × (n - 2) latencies of
        // the slowest edge. Every member plays the same part: identical copies stay alike.
        for (int k = 0; k < listed; ++k)
          flows.push_back(sg4::Comm::sendto_async(p.hosts[G[k]], successor(in.group_id, k),
                                                  as_bytes(n * (n - 1.0) * chunk)));
        const double lat = latency_of(in.group_id);
        after = (n - 1) * lat + (n - 1) * ring_cost(in.group_id, chunk) + n * (n - 2.0) * lat;
      } else {
        // Every ring edge carries all its steps' bytes at once (contention on shared links is
        // kept); a ring spanning the copies stands for every copy's members, its last listed
        // member's flow going to the next copy. Then (steps - 1) latencies of the slowest edge.
        for (int k = 0; k < listed; ++k)
          flows.push_back(sg4::Comm::sendto_async(p.hosts[G[k]], successor(in.group_id, k),
                                                  as_bytes(steps * chunk)));
        if (steps > 1) after = (steps - 1) * latency_of(in.group_id);
      }
      for (const sg4::CommPtr& f : flows) f->wait();
      if (after > 0) sg4::this_actor::sleep_for(after);
      let_go(held);
      release();
      return;
    }
    // Step by step: each member holds its own GPU for its part (waits included).
    auto held = hold({r}, frac);
    const uint64_t b = as_bytes(chunk);
    if (round) {
      // n chains from each member in turn, step by step (mailboxes per broadcast).
      for (int t = 0; t < n; ++t) {
        const int qt = (pos - t + n) % n;
        auto bx = [&](int k) {
          return sg4::Mailbox::by_name(fmt::format("c{}:{}:{}", id, t, k % n));
        };
        if (qt == 0) {
          for (int k = 0; k < n; ++k) bx(1)->put(&payload, b);
          continue;
        }
        sg4::CommPtr prev;
        for (int k = 0; k < n; ++k) {
          bx(qt)->get<char>();
          if (qt < n - 1) {
            if (prev) prev->wait();
            prev = bx(qt + 1)->put_async(&payload, b);
          }
        }
        if (prev) prev->wait();
      }
      return;
    }
    auto box = [&](int k) { return sg4::Mailbox::by_name(fmt::format("c{}:{}", id, k % n)); };
    if (!chain) {
      sg4::Mailbox* out = box(q + 1);
      sg4::Mailbox* mine = box(q);
      for (int s = 0; s < steps; ++s) {
        sg4::CommPtr send = out->put_async(&payload, b);
        mine->get<char>();
        send->wait();
      }
      return;
    }
    const int chunks = n;  // steps = chunks + n - 2
    if (q == 0) {
      for (int k = 0; k < chunks; ++k) box(1)->put(&payload, b);
      return;
    }
    sg4::CommPtr prev;
    for (int k = 0; k < chunks; ++k) {
      box(q)->get<char>();
      if (q < n - 1) {
        if (prev) prev->wait();
        prev = box(q + 1)->put_async(&payload, b);
      }
    }
    if (prev) prev->wait();
  }

  static std::string p2p_box(int src, int dst, int64_t tag) {
    return fmt::format("p{}>{}#{}", src, dst, tag);
  }

  // The actor running one stream of one rank.
  void stream(int r, std::vector<int> ops) {
    const auto& prog = w.ranks[r].ops;
    // Receives are posted up front: a transfer runs as soon as its send starts.
    std::map<int, sg4::CommPtr> posted;
    std::vector<char*> data(ops.size(), nullptr);
    for (size_t k = 0; k < ops.size(); ++k) {
      const Op& o = prog[ops[k]];
      if (o.kind == OpKind::Recv)
        posted[ops[k]] =
            sg4::Mailbox::by_name(p2p_box(o.peer, r, o.tag))->get_async<char>(&data[k]);
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
          if (links && links->covers("p2p")) {
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
          sg4::this_actor::sleep_for(c.host.latency +
                                     static_cast<double>(o.bytes) / c.host.bandwidth);
          break;
        default:
          collective(r, i);
          break;
      }
      finish(r, i);
    }
  }

  void launch() {
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
  std::string unfinished() const {
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
};

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
                opt.calibration.contention_share);
    rp.wake = opt.calibration.wake_s;
    rp.posted_share = opt.calibration.posted_share;
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
      if (prog.ops[i].kind == OpKind::Compute) {
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
  CommDurations cd = comm_durations(w, m, opt.calibration, &timing);
  // Flows: the link model of the calibration's collectives, which times every covered op.
  LinkModel lm;
  const bool flows = opt.collectives == CollectiveModel::Flows;
  if (flows) {
    lm = fit_links(opt.calibration, c.intra.latency);
    flow_timing(w, m, opt.calibration, lm, cd, timing);
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
