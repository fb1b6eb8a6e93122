// The data-parallel plugin's ops in the simulator's step program (from_config.cpp): its copies
// as memory-bound compute ops, and ZeRO-1/2's deferred parameter gathers from the executor's own
// schedule::ParamGatherQueue actions.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "cai/schedule/offload.h"
#include "cai/schedule/param_gathers.h"
#include "workload.h"

namespace cai::sim {

// The plugin's streams in a rank's program: the data-parallel collectives (3), and ZeRO-Offload's
// copies between the GPU and pinned host memory (4) and its host thread's adds (5).
constexpr int kDpStream = 3, kOffloadCopyStream = 4, kHostStream = 5;

// A copy of the plugin (pack, unpack, cast, shard add): `bytes` moved in `calls` launches.
Op dp_copy(std::string name, int64_t bytes, int64_t calls);
// A dependency of an op in a list that starts at program index `base` on program op `abs`
// (an earlier list's, or this one's): expand.h's convention.
inline int dep_on(int abs, int base) {
  return abs >= base ? abs - base : -1 - abs;
}

// ZeRO-1/2's parameter-gather actions appended to `ops` (a list starting at program index
// `base`): an issue packs this rank's shards (one launch) and starts the all-gather on stream 3
// (its buffers: the bucket and this rank's chunk); a completion unpacks every rank's chunks into
// the parameters (one launch) after the gather and frees the buffers. gather_op: bucket -> program
// index of its pending all-gather.
struct BucketSizes {
  const std::vector<int64_t>& numel;   // elements per bucket
  const std::vector<int64_t>& chunk;   // this rank's chunk elements per bucket
  const std::vector<int64_t>& gather;  // the all-gather's bytes per bucket (the plan's)
};
void param_gather_ops(const std::vector<schedule::ParamGatherQueue::Action>& acts, int group,
                      const BucketSizes& sizes, std::map<int, int>& gather_op, int base,
                      std::vector<Op>& ops);

// ZeRO-Offload's ops: a copy of `bytes` between the GPU and pinned host memory on `stream`
// (OpKind::HostCopy), and host-thread work of kind "host_add" / "host_cast" over `bytes` of fp32
// on kHostStream (OpKind::Host). Category "offload".
Op host_copy(std::string name, int64_t bytes, bool to_device, int stream);
Op host_op(std::string name, std::string kind, int64_t bytes);

// One rank's ZeRO-Offload lane as DataParallelPlugin's OffloadLane runs it, with the sizes of the
// shared description (`off`, cai/schedule/offload.h). Ops go into a list starting at program
// index `base` (expand.h's convention).
struct OffloadLaneOps {
  schedule::OffloadLayout off;
  std::vector<int> adds;     // program indices of the host adds pushed so far
  std::deque<int64_t> held;  // device bytes of the reduced chunks the two slots hold

  // Stages 2/3, bucket k's reduction done (program op `reduce`): the host takes the next of the
  // two pinned slots once the host thread has added the chunk that slot held (pushed two
  // before: its device memory goes), the packed bucket (`packed` bytes) goes, the chunk (`chunk`
  // device bytes, off.bucket_download[k] copied) goes device -> host on kOffloadCopyStream after
  // the compute issued so far and is added into the host gradients on kHostStream.
  void push(int k, int reduce, int64_t packed, int64_t chunk, int base, std::vector<Op>& ops);
  // sync_gradients: the host waits for the last add; the slots' chunks go.
  void flush(int base, std::vector<Op>& ops);
  // The host step's upload (off.upload's pieces): per copy, the host steps the piece's `step`
  // elements ("host_adam"; bf16: writing the pinned slot itself) and/or casts its fp32 values into
  // the slot ("host_cast"), after that slot's previous copy (two slots), and the copy stream
  // moves it host -> device while the host goes on. end_wait: the compute stream then waits for
  // the last copy ("upload done": the step ends with its upload); else (the step beside the next
  // forward) the caller makes each gather wait for its parameters' copies. Returns each piece's
  // copy as a program index.
  std::vector<int> upload(int base, std::vector<Op>& ops, bool end_wait) const;
};

}  // namespace cai::sim
