// NCCL backend of the Communicator: collectives and point-to-point on tensors of one CUDA device.
//
// Built from a CPU communicator over the same ranks (the MPI world, or any Communicator), which
// carries the ncclUniqueId (rank 0 creates it and broadcasts it as a CPU tensor) and serves CPU
// tensors passed to the NCCL communicator (traces, metrics), so one communicator object can be
// handed to code that moves both. Each NCCL communicator owns its ncclComm_t and its own
// non-blocking CUDA stream. An operation makes that stream wait for an event recorded on the
// compute stream (the legacy default stream: the data is ready), runs the NCCL call and records
// a completion event; Work::wait() waits for it on the host within the communicator's timeout
// (on timeout: ncclCommAbort, then cai::Error naming the operation, element count, group and
// rank), Work::test() queries it. Uneven reduce-scatter / all-gather counts go through staging
// buffers padded to the largest count. Send/recv need connect_p2p() (see communicator.h).
// fp32, bf16, fp16 and int32 tensors (reductions on int32 and floating types).
//
// Without CUDA in the build, every function here throws cai::NotImplemented.
#pragma once
#include <memory>

#include "cai/dist/communicator.h"

namespace cai::dist {

// Collective over `host`: a communicator of the same ranks on CUDA device `device` (which must be
// this process's own: NCCL allows one rank per GPU in a group). `host` must outlive the result
// (and all its splits). The timeout is the host's.
std::unique_ptr<Communicator> make_nccl(Communicator& host, int device);
// The same, owning its CPU communicator.
std::unique_ptr<Communicator> make_nccl(std::unique_ptr<Communicator> host, int device);

// Whether this build has the NCCL backend.
bool nccl_compiled();

// The GPU for a process with this node-local rank: local_rank mod the number of visible devices;
// made the calling thread's current device. Throws when there is no GPU (naming why), or when
// local_world_size processes on this node exceed the GPUs (NCCL needs one GPU per rank).
int select_cuda_device(int local_rank, int local_world_size);

}  // namespace cai::dist
