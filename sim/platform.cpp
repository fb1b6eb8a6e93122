#include "platform.h"

#include <fmt/format.h>

#include <algorithm>

#include <simgrid/s4u.hpp>

#include "cai/core/error.h"

namespace sg4 = simgrid::s4u;

namespace cai::sim {

std::vector<std::string> simgrid_args() {
  return {"--log=root.thresh:critical",    "--log=xbt_cfg.thresh:critical",
          "--cfg=network/model:CM02",      "--cfg=network/crosstraffic:0",
          "--cfg=network/TCP-gamma:1e300", "--cfg=contexts/factory:raw",
          "--cfg=surf/precision:1e-13"};
}

RouteCost route_cost(const Cluster& c, int nproc, int a, int b) {
  const int used = std::min(nproc, c.gpus());
  const int ga = a % used, gb = b % used;
  if (ga == gb) return {c.intra.latency, c.intra.bandwidth};  // loopback of a shared GPU
  if (ga / c.gpus_per_node == gb / c.gpus_per_node) return {c.intra.latency, c.intra.bandwidth};
  return {c.intra.latency + c.inter.latency,
          std::min(c.intra.bandwidth, c.inter.nic_bandwidth * c.inter.nics_per_node)};
}

double collective_lower_bound(const Cluster& c, int nproc, OpKind kind, int64_t bytes,
                              const std::vector<int>& ring, int root_pos) {
  const int n = static_cast<int>(ring.size());
  if (n <= 1) return 0;
  const double chunk = static_cast<double>(bytes) / n;
  auto edge = [&](int k) {  // k -> k + 1 along the ring (or the chain from the root)
    const int from = (k + root_pos) % n, to = (k + 1 + root_pos) % n;
    return route_cost(c, nproc, ring[from], ring[to]);
  };
  if (kind == OpKind::BroadcastRound) {  // n broadcasts, rooted at each member in turn
    double sum = 0;
    for (int t = 0; t < n; ++t)
      sum += collective_lower_bound(c, nproc, OpKind::Broadcast, bytes, ring, t);
    return sum;
  }
  if (kind == OpKind::Broadcast) {  // replay_collectives.cpp's bulk chain: n chunks
    double fill = 0, lat_max = 0, flows = 0;
    for (int k = 0; k + 1 < n; ++k) {
      const RouteCost e = edge(k);
      fill += e.latency + chunk / e.bandwidth;
      lat_max = std::max(lat_max, e.latency);
      flows = std::max(flows, e.latency + (n - 1) * chunk / e.bandwidth);
    }
    return flows + fill + (n - 2) * lat_max;
  }
  const int steps = kind == OpKind::AllReduce ? 2 * (n - 1) : n - 1;
  double flows = 0, lat_max = 0;
  for (int k = 0; k < n; ++k) {
    const RouteCost e = edge(k);
    flows = std::max(flows, e.latency + steps * chunk / e.bandwidth);
    lat_max = std::max(lat_max, e.latency);
  }
  return flows + (steps - 1) * lat_max;
}

Platform build_platform(const Cluster& c, int nproc, DType dtype, int copies,
                        const std::vector<int>& gpu_of) {
  CAI_CHECK(nproc >= 1 && nproc <= c.max_ranks(),
            "[sim] {} ranks on cluster '{}' ({}): it has {} GPUs ({} nodes × {}){}", nproc, c.name,
            c.origin, c.gpus(), c.nodes, c.gpus_per_node,
            c.max_ranks_per_gpu > 1 ? fmt::format(", {} ranks per GPU", c.max_ranks_per_gpu) : "");
  CAI_CHECK(copies == 1 ||
                (nproc % c.gpus_per_node == 0 && static_cast<int64_t>(nproc) * copies <= c.gpus()),
            "[sim] {} copies of {} ranks on cluster '{}' ({}): copies need whole nodes of {} GPUs "
            "and at most {} GPUs in all",
            copies, nproc, c.name, c.origin, c.gpus_per_node, c.gpus());
  const double speed = c.gpu.peak_flops(dtype);
  const int used = std::min(nproc, c.gpus());  // GPUs in use; slot g is GPU g mod used
  const int nodes = (used + c.gpus_per_node - 1) / c.gpus_per_node;
  const bool nics = nodes > 1 || copies > 1;
  Platform p;
  std::vector<sg4::Host*> gpu_hosts, next_hosts;  // per GPU slot below `used`
  std::vector<int> gpu_node;
  auto* root = sg4::create_star_zone(c.name);
  // Every link is created in the root zone before any node zone exists: SimGrid 3.32 checks a new
  // link's name against every zone (and a new host's against every zone too), so creating links
  // inside 2,048 node zones made platform building quadratic (30 s at 16,384 GPUs).
  std::vector<sg4::Link*> gpu_links(used), nic_links(nics ? nodes : 0);
  for (int r = 0; r < used; ++r)
    gpu_links[r] = root->create_split_duplex_link(
                           fmt::format("node{}-gpu{}-{}", r / c.gpus_per_node, r % c.gpus_per_node,
                                       fabric_name(c.intra.fabric)),
                           c.intra.bandwidth)
                       ->set_latency(c.intra.latency / 2)
                       ->seal();
  for (int n = 0; n < static_cast<int>(nic_links.size()); ++n)
    nic_links[n] = root->create_split_duplex_link(fmt::format("node{}-nics", n),
                                                  c.inter.nic_bandwidth * c.inter.nics_per_node)
                       ->set_latency(c.inter.latency / 2)
                       ->seal();
  // CPU processes on shared memory: the node is one host with a core per "GPU" slot, so the OS's
  // work-conserving scheduling is what SimGrid's multicore CPU model does. A rank's compute runs
  // on one core at a time (a sequential execution); ranks take whichever cores are free, and share
  // them only while more compute than there are cores (4 processes on 2 cores: while both ranks
  // of one pipeline stage wait in the bubble, the other stage's two have both cores).
  // Pinned processes (intra_node.placement = "pinned"): a host per core, rank r on core r mod
  // cores, as for GPUs; ranks of one core share it and talk through its loopback.
  const bool cpu_node = c.intra.fabric == Fabric::SharedMemory && !c.intra.pinned;
  for (int n = 0; n < nodes; ++n) {
    auto* nz = sg4::create_star_zone(fmt::format("node{}", n));
    nz->set_parent(root);
    auto* gw = nz->create_router(fmt::format("node{}-gw", n));
    // Host `name` (`cores` cores) on slot r's link; ranks sharing it talk through a loopback.
    auto add_host = [&](const std::string& name, int cores, int r, bool loopback) {
      auto* h = nz->create_host(name, speed)->set_core_count(cores)->seal();
      nz->add_route(h->get_netpoint(), nullptr, nullptr, nullptr,
                    {{gpu_links[r], sg4::LinkInRoute::Direction::UP}}, true);
      if (loopback) {
        auto* lb = nz->create_link(name + "-loopback", c.intra.bandwidth)
                       ->set_latency(c.intra.latency)
                       ->seal();
        nz->add_route(h->get_netpoint(), h->get_netpoint(), nullptr, nullptr,
                      {sg4::LinkInRoute(lb)}, false);
      }
      return h;
    };
    const int first = n * c.gpus_per_node, slots = std::min(c.gpus_per_node, used - first);
    sg4::Host* cpu =
        cpu_node ? add_host(fmt::format("node{}-cpu", n), slots, first, true) : nullptr;
    for (int g = 0; g < slots; ++g) {
      gpu_hosts.push_back(
          cpu ? cpu : add_host(fmt::format("node{}-gpu{}", n, g), 1, first + g, nproc > used));
      gpu_node.push_back(n);
    }
    nz->seal();
    if (nics)
      root->add_route(nz->get_netpoint(), nullptr, gw, nullptr,
                      {{nic_links[n], sg4::LinkInRoute::Direction::UP}}, true);
  }
  // The next copy's GPUs: shadow zones over the same links (no actor runs on them).
  for (int n = 0; copies > 1 && n < nodes; ++n) {
    auto* nz = sg4::create_star_zone(fmt::format("node{}-next", n));
    nz->set_parent(root);
    auto* gw = nz->create_router(fmt::format("node{}-next-gw", n));
    for (int g = 0; g < c.gpus_per_node; ++g) {
      const int r = n * c.gpus_per_node + g;
      auto* h = nz->create_host(fmt::format("node{}-next-gpu{}", n, g), speed)->seal();
      nz->add_route(h->get_netpoint(), nullptr, nullptr, nullptr,
                    {{gpu_links[r], sg4::LinkInRoute::Direction::UP}}, true);
      next_hosts.push_back(h);
    }
    nz->seal();
    root->add_route(nz->get_netpoint(), nullptr, gw, nullptr,
                    {{nic_links[n], sg4::LinkInRoute::Direction::UP}}, true);
  }
  root->seal();
  for (int r = 0; r < nproc; ++r) {
    const int g = (gpu_of.empty() ? r : gpu_of.at(r)) % used;
    p.hosts.push_back(gpu_hosts[g]);
    p.node_of.push_back(gpu_node[g]);
    if (copies > 1) p.next.push_back(next_hosts[g]);
  }
  return p;
}

}  // namespace cai::sim
