// The replay's SimGrid side (replay.cpp): the Replayer that every actor shares, its ring and chain
// costs and collectives (replay_collectives.cpp), its streams and launch (replay.cpp). Internal to
// the replay; lives in the SimGrid process only.
#pragma once
#include <fmt/format.h>

#include <simgrid/s4u.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cai/core/error.h"
#include "cai/dist/communicator.h"
#include "flows.h"
#include "platform.h"
#include "replay.h"

namespace cai::sim::detail {

namespace sg4 = simgrid::s4u;

// Ring steps and bytes per step of a collective over n ranks of a `bytes` buffer. Broadcast is a
// chain pipelined in n chunks: n + (n - 2) steps of bytes / n.
inline void ring_shape(OpKind k, int n, int64_t bytes, int* steps, double* chunk) {
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

inline uint64_t as_bytes(double b) {
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
  // Calibration::receive_share_at the workload's micro-batch, a waiting posted receive's (-1:
  // overlap_share).
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
  // Per rank and op: how many receives (Op::posted_after) are posted when it ends.
  std::vector<std::vector<int>> posts_at;
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
           bool merge, double overlap_share, double contention_share, double posted = -1)
      : w(w_),
        m(m_),
        c(c_),
        dur(d),
        comm_dur(cd),
        model(mo),
        posted_share(posted),
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
    posts_at.resize(R);
    for (size_t r = 0; r < R; ++r) {
      const auto& ops = w.ranks[r].ops;
      posts_next[r].assign(ops.size(), 0);
      posts_at[r].assign(ops.size(), 0);
      std::map<std::string, int> last;  // kind (the name up to its first '(' or space) -> op
      for (size_t i = 0; i < ops.size(); ++i) {
        if (ops[i].kind != OpKind::Recv) continue;
        const int after = ops[i].posted_after;
        if (after >= -1) {  // posted where the workload says
          CAI_CHECK(after < static_cast<int>(i),
                    "[sim] rank {} op {} ({}): posted after op {}, not an earlier one", r, i,
                    ops[i].name, after);
          if (after < 0) {
            ++receives_posted[r];
          } else {
            ++posts_at[r][after];
            needed_elsewhere[r][after] = 1;  // its end is an event: no merged run hides it
          }
          continue;
        }
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
    const Op& o = w.ranks[r].ops[i];
    if (o.copy_engine) return false;
    // A posted receive holds its own share (posted_share) also where transfers hold none.
    if (o.kind == OpKind::Recv && posted_share > 0) return true;
    if (share <= 0) return false;
    switch (o.kind) {
      case OpKind::Compute:
      case OpKind::HostCopy:
      case OpKind::Host:
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
    if (posts_at[r][i] > 0) {  // receives posted now: the hold of all that wait
      let_go(receive_hold[r]);
      receives_posted[r] += posts_at[r][i];
      receive_hold[r] = hold({r}, posted_hold(receives_posted[r]));
    }
    if (awaited[r][i] > 0) {
      std::unique_lock<sg4::Mutex> lock(*mutex[r]);
      cv[r]->notify_all();
    }
  }

  // Latency and bottleneck bandwidth of the route a -> b, without contention.
  std::pair<double, double> edge(int a, int b) const;

  // Whether group g's ring goes on through the next copies of the job.
  bool wraps(int g) const { return w.copies > 1 && w.spans_copies(g); }

  // The host member q of group g sends to in its ring: the next member, or after the last listed
  // member of a ring spanning the copies, the first member's GPU in the next copy.
  sg4::Host* successor(int g, int q) const;

  // Largest route latency over the ring's edges: the per-step latency of the slowest edge.
  double latency_of(int g);

  // Sum over the job's ring edges of latency + c / bandwidth (the listed edges, the last one to
  // the next copy for a ring spanning copies, times the copies), per group and chunk size.
  std::map<std::pair<int, double>, double> ring_cost_cache;
  double ring_cost(int g, double c);

  // A pipelined chain (broadcast) of C chunks of c bytes takes sum_e t_e + (C - 1) max_e t_e with
  // t_e = latency_e + c / bandwidth_e: the first chunk crosses every edge, the others follow at
  // the pace of the slowest edge. Returns {sum_e t_e, largest latency} over the chain's edges.
  std::pair<double, double> chain_fill(int id, const std::vector<int>& G, int root_pos, double c);

  // Rank r's collective op i, under `model` (bulk, step or flows): it waits for its group, holds
  // its share of the GPUs while data moves, and pays the wake-up of napping members.
  void collective(int r, int i);

  static std::string p2p_box(int src, int dst, int64_t tag) {
    return fmt::format("p{}>{}#{}", src, dst, tag);
  }

  // The actor running one stream of one rank.
  void stream(int r, std::vector<int> ops);

  void launch();

  // Every rank's first unfinished op, or "" when all finished.
  std::string unfinished() const;
};

}  // namespace cai::sim::detail
