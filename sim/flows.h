// Collectives as SimGrid flows over links fitted to the calibration (CollectiveModel::Flows).
// Needs a live s4u::Engine (the replay's SimGrid process).
//
// The platform's intra-node links carry the link model's capacity and latency (flow_cluster). A
// collective of `op` over n ranks of `bytes` (link_fit.h's ring shape: `steps`, `link_bytes`)
// takes launch(n), then one flow per ring edge (per chain edge for a broadcast) carrying
// link_bytes, its rate bounded to the fitted bandwidth beta(n, bytes) (flows sharing a link share
// its capacity once their bounds together exceed it, SimGrid's max-min), then the remaining step
// latencies: steps · alpha in all, less the route latency the flows took, plus (steps - 1) × what
// the slowest edge's route adds over a link inside a node (a ring across nodes pays the NICs'
// latency at every step). Alone inside a node it takes launch(n) + steps · alpha + link_bytes /
// beta: the link model's time.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "cluster.h"
#include "link_fit.h"
#include "workload.h"

namespace simgrid::s4u {
class Host;
}

namespace cai::sim {

// `c` with its intra-node links from the model (bandwidth = capacity, latency = the links'
// latency); `c` itself when the model fitted nothing.
Cluster flow_cluster(const Cluster& c, const LinkModel& m);

using Edge = std::pair<simgrid::s4u::Host*, simgrid::s4u::Host*>;

// Runs one collective (ring edges, or the chain edges of one broadcast) of `op` over n ranks of
// `bytes` as flows, in the calling actor; `bound`: a cap on every flow's rate beside the fitted
// bandwidth (a p2p pair between nodes uses one NIC), 0 for none.
void run_flows(const LinkModel& m, const std::string& op, int n, double bytes,
               const std::vector<Edge>& edges, double bound = 0);

// Marks the collective instances and sends of `w` whose op the model covers as flows: their
// calibrated durations set to -1 (the replay runs them as flows) and their counts in `t` moved
// from comm_measured / comm_interpolated / comm_network to comm_flows. unmeasured_only (the bulk
// model): only those the calibration has no time for (a group size it never ran), which bulk
// would otherwise run over the cluster file's nominal links.
struct CommDurations;
struct TimingSources;
void flow_timing(const Workload& w, const detail::Matching& m, const Calibration& cal,
                 const LinkModel& lm, CommDurations& cd, TimingSources& t,
                 bool unmeasured_only = false);

// A send of `bytes` as one flow (the replay's message to the posted receive): wait `delay`, then
// send bounded to `rate` (0: unbounded); the receive completes after launch(2) + alpha + what the
// route adds over one inside a node + bytes / rate.
struct SendFlow {
  double delay = 0, rate = 0;
};
SendFlow send_flow(const LinkModel& m, double bytes, double bound = 0);

}  // namespace cai::sim
