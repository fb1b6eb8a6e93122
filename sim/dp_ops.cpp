#include "dp_ops.h"

#include <fmt/format.h>

#include <utility>

namespace cai::sim {

Op dp_copy(std::string name, int64_t bytes, int64_t calls) {
  Op o;
  o.calls = calls;
  o.kind = OpKind::Compute;
  o.name = std::move(name);
  o.category = "compute";
  o.mem_bytes = static_cast<double>(bytes);
  o.op_kind = "elementwise";
  return o;
}

void param_gather_ops(const std::vector<schedule::ParamGatherQueue::Action>& acts, int group,
                      const BucketSizes& sizes, std::map<int, int>& gather_op, int base,
                      std::vector<Op>& ops) {
  for (const auto& a : acts) {
    const int b = a.bucket;
    const int64_t buffers = 4 * (sizes.numel[b] + sizes.chunk[b]);
    if (a.issue) {
      ops.push_back(dp_copy(fmt::format("bucket {} parameters pack", b), 8 * sizes.chunk[b], 1));
      Op ag = Op::collective(OpKind::AllGather, fmt::format("bucket {} parameters all_gather", b),
                             group, sizes.gather[b], 3);
      ag.category = "reduce";
      ag.mem_start.push_back({MemKind::Buffers, buffers});
      gather_op[b] = base + static_cast<int>(ops.size());
      ops.push_back(std::move(ag));
    } else {
      Op un = dp_copy(fmt::format("bucket {} parameters unpack", b), 8 * sizes.numel[b], 1);
      un.deps.push_back(dep_on(gather_op.at(b), base));
      gather_op.erase(b);
      un.mem_end.push_back({MemKind::Buffers, -buffers});
      ops.push_back(std::move(un));
    }
  }
}

}  // namespace cai::sim
