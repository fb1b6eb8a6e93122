#include "flows.h"

#include <simgrid/s4u.hpp>

#include <algorithm>
#include <cmath>

#include "replay.h"

namespace sg4 = simgrid::s4u;

namespace cai::sim {

Cluster flow_cluster(const Cluster& c, const LinkModel& m) {
  if (m.ops.empty() || m.capacity <= 0) return c;
  Cluster f = c;
  f.intra.bandwidth = m.capacity;
  f.intra.latency = m.latency;
  return f;
}

void run_flows(const LinkModel& m, const std::string& op, int n, double bytes,
               const std::vector<Edge>& edges, double bound) {
  const LinkFit& f = m.ops.at(op);
  const RingSteps s = ring_steps(op, n, bytes);
  const double beta = f.bandwidth(n, bytes);
  double rate = beta < kNoBandwidth ? beta : 0;
  if (bound > 0) rate = rate > 0 ? std::min(rate, bound) : bound;
  const double launch = f.launch(n);
  if (launch > 0) sg4::this_actor::sleep_for(launch);
  // One flow per edge carrying link_bytes, bounded to beta: alone it runs at beta, and flows
  // sharing a link share its capacity once their bounds together exceed it (max-min). Mailbox
  // transfers between an actor on each end: SimGrid 3.32 bounds those by set_rate (with a TCP
  // gamma other than 0, simgrid_args), not host-to-host sendto comms.
  static char payload = 0;
  static uint64_t serial = 0;
  // At least a byte: a zero-byte host-to-host comm took longer than its route's latency.
  const uint64_t size = std::max<uint64_t>(1, std::llround(std::max(0.0, s.link_bytes)));
  std::vector<sg4::ActorPtr> senders;
  double route_max = 0;
  for (const auto& [from, to] : edges) {
    std::vector<sg4::Link*> links;
    double lat = 0;
    from->route_to(to, links, &lat);
    route_max = std::max(route_max, lat);
    sg4::Mailbox* box = sg4::Mailbox::by_name("flow#" + std::to_string(serial++));
    sg4::Actor::create("flow-rx", to, [box] { box->get<char>(); });
    senders.push_back(sg4::Actor::create("flow-tx", from, [box, size, rate] {
      sg4::CommPtr comm = box->put_init(&payload, size);
      if (rate > 0) comm->set_rate(rate);
      comm->wait();
    }));
  }
  for (const sg4::ActorPtr& a : senders) a->join();
  // The steps' latencies the flows did not take: steps · alpha in all, plus what the slowest
  // route adds over one inside a node at every further step.
  const double extra = std::max(0.0, route_max - m.latency);
  const double after = s.steps * f.alpha + (s.steps - 1) * extra - route_max + extra;
  if (after > 0) sg4::this_actor::sleep_for(after);
}

void flow_timing(const Workload& w, const detail::Matching& m, const Calibration& cal,
                 const LinkModel& lm, CommDurations& cd, TimingSources& t, bool unmeasured_only) {
  // Recounted: each collective instance and each send once (as comm_durations does).
  t.comm_measured = t.comm_interpolated = t.comm_network = t.comm_flows = 0;
  auto count = [&](bool covered, OpKind kind, int n, int64_t bytes) {
    bool interpolated = false;
    const double s = calibrated_collective_seconds(cal, kind, n, bytes, &interpolated);
    if (covered && !(unmeasured_only && s >= 0)) return ++t.comm_flows, -1.0;
    ++(s < 0 ? t.comm_network : interpolated ? t.comm_interpolated : t.comm_measured);
    return s;
  };
  for (size_t id = 0; id < m.instances.size(); ++id) {
    const detail::Instance& in = m.instances[id];
    const int n = w.group_size(in.group_id);
    if (n <= 1) continue;
    cd.instance[id] = count(lm.covers(measured_op_name(in.kind)), in.kind, n, in.bytes);
  }
  for (size_t r = 0; r < w.ranks.size(); ++r)
    for (size_t i = 0; i < w.ranks[r].ops.size(); ++i)
      if (const Op& o = w.ranks[r].ops[i]; o.kind == OpKind::Send)
        cd.send[r][i] = count(lm.covers("p2p"), OpKind::Send, 2, o.bytes);
}

SendFlow send_flow(const LinkModel& m, double bytes, double bound) {
  const LinkFit& f = m.ops.at("p2p");
  const double beta = f.bandwidth(2, bytes);
  SendFlow out;
  out.rate = beta < kNoBandwidth ? beta : 0;
  if (bound > 0) out.rate = out.rate > 0 ? std::min(out.rate, bound) : bound;
  out.delay = std::max(0.0, f.launch(2) + f.alpha - m.latency);
  return out;
}

}  // namespace cai::sim
