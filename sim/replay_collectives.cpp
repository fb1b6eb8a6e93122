// The replay's collectives (replay_internal.h's Replayer): route latencies and ring costs per
// group, broadcast chains, and collective(), which runs one collective op of a rank under the
// chosen CollectiveModel (bulk, step or flows) with its wake-ups and GPU holds.
#include <fmt/format.h>

#include <simgrid/s4u.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "cai/core/error.h"
#include "replay_internal.h"

namespace cai::sim::detail {

// Latency and bottleneck bandwidth of the route a -> b, without contention.
std::pair<double, double> Replayer::edge(int a, int b) const {
  std::vector<sg4::Link*> links;
  double lat = 0, bw = 1e300;
  p.hosts[a]->route_to(p.hosts[b], links, &lat);
  for (const sg4::Link* l : links) bw = std::min(bw, l->get_bandwidth());
  return {lat, bw};
}

// Whether group g's ring goes on through the next copies of the job.

// The host member q of group g sends to in its ring: the next member, or after the last listed
// member of a ring spanning the copies, the first member's GPU in the next copy.
sg4::Host* Replayer::successor(int g, int q) const {
  const auto& G = w.groups[g];
  const int m = static_cast<int>(G.size());
  if (q + 1 < m) return p.hosts[G[q + 1]];
  return wraps(g) ? p.next[G[0]] : p.hosts[G[0]];
}

// Largest route latency over the ring's edges: the per-step latency of the slowest edge.
double Replayer::latency_of(int g) {
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
double Replayer::ring_cost(int g, double c) {
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
std::pair<double, double> Replayer::chain_fill(int id, const std::vector<int>& G, int root_pos,
                                               double c) {
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

void Replayer::collective(int r, int i) {
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
  if (links && links->covers(measured_op_name(in.kind)) && comm_dur.instance[id] < 0) {
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
      run_flows(*links, measured_op_name(in.kind), n, static_cast<double>(in.bytes), edges);
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

}  // namespace cai::sim::detail
