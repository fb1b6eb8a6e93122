// The shipped inputs the simulator's tests read: configs (CAI_CONFIG_DIR) and cluster files
// (CAI_CLUSTER_DIR), as tests/CMakeLists.txt defines them for test_sim.
#pragma once
#include <string>
#include <vector>

#include "cai/config/config.h"
#include "cluster.h"

namespace cai::sim::test {

// apps/vit_train/configs/fmnist_tiny.toml with `sets` (vit_train --set) applied.
inline config::TrainConfig fmnist(const std::vector<std::string>& sets) {
  return config::load_config(std::string(CAI_CONFIG_DIR) + "/fmnist_tiny.toml", sets);
}

// hostfiles/clusters/NAME.toml.
inline Cluster cluster(const std::string& name) {
  return load_cluster(std::string(CAI_CLUSTER_DIR) + "/" + name + ".toml");
}

}  // namespace cai::sim::test
