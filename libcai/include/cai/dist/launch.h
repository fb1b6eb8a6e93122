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

// Several processes on GPUs: sets CUDA_MODULE_LOADING=EAGER unless the environment sets it, and
// returns whether it did. Call before the process's first CUDA call (it has no effect after).
// Why: an NCCL kernel spins on the GPU until its peer arrives, and CUDA's lazy module loading (the
// default) loads a kernel at its first launch only once the device has drained. A pipeline
// stage that has posted its next receive ahead (pipeline.cpp prefetches them) and then launches a
// kernel for the first time waits for that receive, whose sender waits for this stage: both
// hang (seen on 2 H200 with vit_train pp 2, every schedule). Eager loading loads every kernel
// when CUDA starts. One process, or a user's own CUDA_MODULE_LOADING: unchanged.
bool prefer_eager_cuda_module_loading(const LaunchInfo& li);

}  // namespace cai::dist
