// The SimGrid platform of a cluster (SimGrid 3.32's platform API lives only in platform.cpp; newer
// SimGrid renamed these calls). Needs a live s4u::Engine.
//
// Model: a host per rank (GPU r of the cluster, node r / gpus_per_node), its speed the GPU's peak
// FLOP/s of the workload's dtype. A node is a star zone with one split-duplex up-link per GPU
// (NVSwitch port, PCIe lane set or a process's shared-memory copy bandwidth), latency half the
// GPU-to-GPU latency each way; no backbone, so the node is non-blocking. Nodes hang off a root star
// zone through one split-duplex NIC link each, carrying the node's NICs together
// (nics × bandwidth: NCCL spreads a collective's channels over every rail) with half the NIC-to-NIC
// latency each way; a full-bisection network (fat-tree / non-blocking). Point-to-point transfers
// between nodes are capped at one NIC's bandwidth by the replay (a p2p pair uses one rail).
#pragma once
#include <vector>

#include "cluster.h"
#include "workload.h"

namespace simgrid::s4u {
class Host;
}

namespace cai::sim {

struct Platform {
  std::vector<simgrid::s4u::Host*> hosts;  // per rank (Workload::gpu_of)
  std::vector<int> node_of;                // per rank
  // With copies: per rank, its GPU in the next copy of the job. A host of a shadow node zone
  // whose routes use the same links as the rank's own GPU and node (GPU link, then the node's
  // NICs), so a transfer to it crosses the rank's node's NIC link up and down: by the copies'
  // symmetry, the load the next copy's NIC and GPU links carry is this copy's.
  std::vector<simgrid::s4u::Host*> next;
};

// Builds the zones for the first `nproc` GPUs of `c`; throws "[sim] ..." when nproc exceeds the
// cluster's GPUs. Speeds in FLOP/s of `dtype`. `copies`: the job holds that many copies of these
// nproc ranks (Workload::copies); > 1 needs whole nodes (nproc a multiple of gpus_per_node, no
// rank sharing a GPU) and builds `next` and the NIC links even for one node.
// `gpu_of`: per rank its GPU slot (Workload::gpus); empty: rank r on slot r.
Platform build_platform(const Cluster& c, int nproc, DType dtype, int copies = 1,
                        const std::vector<int>& gpu_of = {});

// Uncontended latency (s) and bottleneck bandwidth (bytes/s) of the route build_platform lays
// between GPU slots a and b of nproc ranks (no SimGrid needed): the loopback of a shared GPU, two
// GPU links inside a node, or GPU, NIC, NIC, GPU links between nodes. The layout search bounds step
// times with it; a test holds it against the replay.
struct RouteCost {
  double latency = 0, bandwidth = 0;
};
RouteCost route_cost(const Cluster& c, int nproc, int a, int b);

// A lower bound on the time the bulk collective model gives a collective of `kind` over `ring`
// (the members' GPU slots in ring order, `copies` × as many in the job's ring when it spans copies)
// of `bytes`: its time alone on the platform when no two of its flows share a link, less otherwise.
double collective_lower_bound(const Cluster& c, int nproc, OpKind kind, int64_t bytes,
                              const std::vector<int>& ring, int root_pos);

// The SimGrid configuration every replay uses (SIMGRID.md): CM02 network model without its LV08
// factors, no cross-traffic, no TCP window cap (gamma 1e300: a cap of gamma / (2 · latency) no
// flow reaches; gamma 0 also lifts the cap but makes CM02 drop every comm's set_rate bound, as
// min(rate, 0) reads "unbounded"), raw contexts, quiet logs, and a timing precision
// of 1e-13 s instead of 1e-9 (each executed op otherwise ended up to a nanosecond off, which
// thousands of ops per rank turned into microseconds through the links' sharing).
std::vector<std::string> simgrid_args();

}  // namespace cai::sim
