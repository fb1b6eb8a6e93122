#include "platform.h"

#include <fmt/format.h>

#include <simgrid/s4u.hpp>

#include "cai/core/error.h"

namespace sg4 = simgrid::s4u;

namespace cai::sim {

std::vector<std::string> simgrid_args() {
  return {"--log=root.thresh:critical", "--log=xbt_cfg.thresh:critical",
          "--cfg=network/model:CM02",   "--cfg=network/crosstraffic:0",
          "--cfg=network/TCP-gamma:0",  "--cfg=contexts/factory:raw"};
}

Platform build_platform(const Cluster& c, int nproc, DType dtype) {
  CAI_CHECK(nproc >= 1 && nproc <= c.gpus(),
            "[sim] {} ranks on cluster '{}' ({}): it has {} GPUs ({} nodes × {})", nproc, c.name,
            c.origin, c.gpus(), c.nodes, c.gpus_per_node);
  const double speed = c.gpu.peak_flops(dtype);
  const int nodes = (nproc + c.gpus_per_node - 1) / c.gpus_per_node;
  Platform p;
  p.hosts.reserve(nproc);
  auto* root = sg4::create_star_zone(c.name);
  for (int n = 0; n < nodes; ++n) {
    auto* nz = sg4::create_star_zone(fmt::format("node{}", n));
    nz->set_parent(root);
    auto* gw = nz->create_router(fmt::format("node{}-gw", n));
    for (int g = 0; g < c.gpus_per_node && n * c.gpus_per_node + g < nproc; ++g) {
      auto* h = nz->create_host(fmt::format("node{}-gpu{}", n, g), speed)->seal();
      auto* l = nz->create_split_duplex_link(
                      fmt::format("node{}-gpu{}-{}", n, g, fabric_name(c.intra.fabric)),
                      c.intra.bandwidth)
                    ->set_latency(c.intra.latency / 2)
                    ->seal();
      nz->add_route(h->get_netpoint(), nullptr, nullptr, nullptr,
                    {{l, sg4::LinkInRoute::Direction::UP}}, true);
      p.hosts.push_back(h);
      p.node_of.push_back(n);
    }
    nz->seal();
    if (nodes > 1) {
      auto* nic = root->create_split_duplex_link(fmt::format("node{}-nics", n),
                                                 c.inter.nic_bandwidth * c.inter.nics_per_node)
                      ->set_latency(c.inter.latency / 2)
                      ->seal();
      root->add_route(nz->get_netpoint(), nullptr, gw, nullptr,
                      {{nic, sg4::LinkInRoute::Direction::UP}}, true);
    }
  }
  root->seal();
  return p;
}

}  // namespace cai::sim
