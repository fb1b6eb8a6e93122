// The data-parallel plugin's ops in the simulator's step program (from_config.cpp): its copies
// as memory-bound compute ops, and ZeRO-1/2's deferred parameter gathers from the executor's own
// schedule::ParamGatherQueue actions.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

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

}  // namespace cai::sim
