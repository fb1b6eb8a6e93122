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

Op host_copy(std::string name, int64_t bytes, bool to_device, int stream) {
  Op o;
  o.kind = OpKind::HostCopy;
  o.name = std::move(name);
  o.category = "offload";
  o.bytes = bytes;
  o.to_device = to_device;
  o.stream = stream;
  return o;
}

Op host_op(std::string name, std::string kind, int64_t bytes) {
  Op o;
  o.kind = OpKind::Host;
  o.name = std::move(name);
  o.category = "offload";
  o.op_kind = std::move(kind);
  o.bytes = bytes;
  o.stream = kHostStream;
  return o;
}

void OffloadLaneOps::push(int k, int reduce, int64_t packed, int64_t chunk, int base,
                          std::vector<Op>& ops) {
  Op o = Op::compute(fmt::format("bucket {} to host", k), 0.0, -1, "offload");
  o.deps.push_back(dep_on(reduce, base));
  if (adds.size() >= 2) o.deps.push_back(dep_on(adds[adds.size() - 2], base));
  if (held.size() == 2) {
    o.mem_end.push_back({MemKind::Buffers, -held.front()});
    held.pop_front();
  }
  o.mem_end.push_back({MemKind::Buffers, -packed});
  held.push_back(chunk);
  const int at = base + static_cast<int>(ops.size());
  ops.push_back(std::move(o));
  const int64_t bytes = off.bucket_download.at(static_cast<size_t>(k));
  Op c = host_copy(fmt::format("bucket {} to host", k), bytes, false, kOffloadCopyStream);
  c.deps.push_back(dep_on(at, base));
  ops.push_back(std::move(c));
  Op h = host_op(fmt::format("bucket {} host add", k), "host_add", bytes);
  h.deps.push_back(dep_on(at + 1, base));
  adds.push_back(base + static_cast<int>(ops.size()));
  ops.push_back(std::move(h));
}

void OffloadLaneOps::flush(int base, std::vector<Op>& ops) {
  Op f = Op::compute("offload flush", 0.0, -1, "offload");
  if (!adds.empty()) f.deps.push_back(dep_on(adds.back(), base));
  for (int64_t c : held) f.mem_end.push_back({MemKind::Buffers, -c});
  held.clear();
  ops.push_back(std::move(f));
}

std::vector<int> OffloadLaneOps::upload(int base, std::vector<Op>& ops, bool end_wait) const {
  std::vector<int> copies;
  for (size_t k = 0; k < off.upload.size(); ++k) {
    const schedule::OffloadLayout::UploadPiece& u = off.upload[k];
    // The slot's previous copy has left before the host writes it again.
    std::vector<int> slot;
    if (k >= 2) slot.push_back(dep_on(copies[k - 2], base));
    int last = -1;
    if (u.step > 0) {
      Op s = host_op(fmt::format("upload {} step", k), "host_adam", 0);
      s.flops = static_cast<double>(u.step);
      s.category = "optimizer";
      s.deps = slot;
      last = base + static_cast<int>(ops.size());
      ops.push_back(std::move(s));
    }
    if (u.cast) {
      Op c = host_op(fmt::format("upload {} cast", k), "host_cast", 4 * u.numel);
      c.category = "optimizer";
      c.deps = slot;
      if (last >= 0) c.deps.push_back(dep_on(last, base));
      last = base + static_cast<int>(ops.size());
      ops.push_back(std::move(c));
    }
    Op c = host_copy(fmt::format("upload {}", k), u.bytes, true, kOffloadCopyStream);
    c.category = "optimizer";
    if (last >= 0) c.deps.push_back(dep_on(last, base));
    copies.push_back(base + static_cast<int>(ops.size()));
    ops.push_back(std::move(c));
  }
  if (end_wait) {
    Op done = Op::compute("upload done", 0.0, -1, "optimizer");
    if (!copies.empty()) done.deps.push_back(dep_on(copies.back(), base));
    ops.push_back(std::move(done));
  }
  return copies;
}

}  // namespace cai::sim
