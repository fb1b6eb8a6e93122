// Where this process sits in the job, from the launcher's environment: OpenMPI (mpirun and
// `colossalai run`), SLURM (srun) or torchrun-style variables. No MPI call is made.
#pragma once
#include <string>

namespace cai::dist {

struct LaunchInfo {
  int rank = 0, local_rank = 0, world_size = 1, local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "single";  // single | openmpi | slurm | torchrun
};

// Reads OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}, else SLURM_{PROCID,NTASKS,LOCALID,
// NTASKS_PER_NODE}, else RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE; MASTER_ADDR/MASTER_PORT.
// Inconsistent values (rank outside [0, world)) throw naming the variables.
LaunchInfo launch_from_env();

}  // namespace cai::dist
