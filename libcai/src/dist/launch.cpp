#include "cai/dist/launch.h"

#include <cstdlib>
#include <string>

#include "cai/core/error.h"
#include "cai/dist/mesh.h"

namespace cai::dist {

namespace {
const char* env(const char* name) {
  return std::getenv(name);
}

int env_int(const char* name, int fallback) {
  const char* v = env(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  CAI_CHECK(end && *end == '\0' && x >= 0 && x < (1 << 30),
            "[launch] environment variable {}='{}' is not a non-negative integer", name, v);
  return static_cast<int>(x);
}
}  // namespace

LaunchInfo launch_from_env() {
  LaunchInfo li;
  const char *rank_var = nullptr, *size_var = nullptr;
  if (env("OMPI_COMM_WORLD_RANK")) {
    li.source = "openmpi";
    rank_var = "OMPI_COMM_WORLD_RANK", size_var = "OMPI_COMM_WORLD_SIZE";
    li.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    li.local_world_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  } else if (env("SLURM_PROCID")) {
    li.source = "slurm";
    rank_var = "SLURM_PROCID", size_var = "SLURM_NTASKS";
    li.local_rank = env_int("SLURM_LOCALID", 0);
    li.local_world_size = env_int("SLURM_NTASKS_PER_NODE", 1);
  } else if (env("RANK")) {
    li.source = "torchrun";
    rank_var = "RANK", size_var = "WORLD_SIZE";
    li.local_rank = env_int("LOCAL_RANK", 0);
    li.local_world_size = env_int("LOCAL_WORLD_SIZE", 1);
  }
  if (rank_var) {
    li.rank = env_int(rank_var, 0);
    li.world_size = env_int(size_var, 1);
    CAI_CHECK(li.world_size >= 1 && li.rank < li.world_size,
              "[launch] {}={} is not a rank of {}={}", rank_var, li.rank, size_var, li.world_size);
    CAI_CHECK(li.local_rank < std::max(li.local_world_size, 1) || li.local_world_size <= 1,
              "[launch] local rank {} is not below the local world size {}", li.local_rank,
              li.local_world_size);
  }
  if (const char* a = env("MASTER_ADDR")) li.master_addr = a;
  li.master_port = env_int("MASTER_PORT", 29500);
  return li;
}

ProcessMesh::ProcessMesh(int world, int tp, int pp) : world_(world), pp_(pp), tp_(tp) {
  CAI_CHECK(world >= 1 && tp >= 1 && pp >= 1,
            "[mesh] world {} , tensor {} and pipeline {} sizes must be positive", world, tp, pp);
  CAI_CHECK(world % (tp * pp) == 0,
            "[mesh] world size {} is not divisible by tensor size {} × pipeline size {} = {}",
            world, tp, pp, tp * pp);
  dp_ = world / (tp * pp);
}

MeshCoord ProcessMesh::coord(int rank) const {
  CAI_CHECK(rank >= 0 && rank < world_, "[mesh] rank {} outside [0, {})", rank, world_);
  return {rank / (pp_ * tp_), rank / tp_ % pp_, rank % tp_};
}

int ProcessMesh::rank_of(MeshCoord c) const {
  CAI_CHECK(c.dp >= 0 && c.dp < dp_ && c.pp >= 0 && c.pp < pp_ && c.tp >= 0 && c.tp < tp_,
            "[mesh] coordinate (dp {}, pp {}, tp {}) outside {}", c.dp, c.pp, c.tp, describe());
  return c.dp * pp_ * tp_ + c.pp * tp_ + c.tp;
}

std::vector<int> ProcessMesh::dp_group(int rank) const {
  MeshCoord c = coord(rank);
  std::vector<int> g;
  for (c.dp = 0; c.dp < dp_; ++c.dp) g.push_back(rank_of(c));
  return g;
}

std::vector<int> ProcessMesh::pp_group(int rank) const {
  MeshCoord c = coord(rank);
  std::vector<int> g;
  for (c.pp = 0; c.pp < pp_; ++c.pp) g.push_back(rank_of(c));
  return g;
}

std::vector<int> ProcessMesh::tp_group(int rank) const {
  MeshCoord c = coord(rank);
  std::vector<int> g;
  for (c.tp = 0; c.tp < tp_; ++c.tp) g.push_back(rank_of(c));
  return g;
}

std::string ProcessMesh::describe() const {
  return fmt::format("dp {} × pp {} × tp {}", dp_, pp_, tp_);
}

bool prefer_eager_cuda_module_loading(const LaunchInfo& li) {
  if (li.world_size <= 1 || std::getenv("CUDA_MODULE_LOADING")) return false;
  return ::setenv("CUDA_MODULE_LOADING", "EAGER", 0) == 0;
}

}  // namespace cai::dist
