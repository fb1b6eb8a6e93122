#include "workload.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <unordered_map>

#include "cai/core/error.h"

namespace cai::sim {

const char* mem_kind_name(MemKind k) {
  switch (k) {
    case MemKind::Parameters:
      return "parameters";
    case MemKind::Gradients:
      return "gradients";
    case MemKind::Optimizer:
      return "optimizer";
    case MemKind::Activations:
      return "activations";
    case MemKind::Buffers:
      return "buffers";
  }
  return "?";
}

namespace {
// One row per OpKind: its name (traces, errors) and the op the calibration's collective samples
// and the link model are keyed by ("" for kinds that move nothing over a link).
struct OpKindRow {
  OpKind kind;
  const char* name;
  const char* measured;
};
constexpr OpKindRow kOpKinds[] = {
    {OpKind::Compute, "compute", ""},
    {OpKind::AllReduce, "all_reduce", "all_reduce"},
    {OpKind::ReduceScatter, "reduce_scatter", "reduce_scatter"},
    {OpKind::AllGather, "all_gather", "all_gather"},
    {OpKind::Broadcast, "broadcast", "broadcast"},
    {OpKind::BroadcastRound, "broadcast_round", "broadcast"},  // n broadcasts
    {OpKind::Send, "send", "p2p"},
    {OpKind::Recv, "recv", ""},
    {OpKind::HostCopy, "host_copy", ""},
    {OpKind::Host, "host", ""},
};

const OpKindRow* op_kind_row(OpKind k) {
  for (const OpKindRow& r : kOpKinds)
    if (r.kind == k) return &r;
  return nullptr;
}
}  // namespace

const char* op_kind_name(OpKind k) {
  const OpKindRow* r = op_kind_row(k);
  return r ? r->name : "?";
}

const char* measured_op_name(OpKind k) {
  const OpKindRow* r = op_kind_row(k);
  return r ? r->measured : "";
}

bool is_collective(OpKind k) {
  return k == OpKind::AllReduce || k == OpKind::ReduceScatter || k == OpKind::AllGather ||
         k == OpKind::Broadcast || k == OpKind::BroadcastRound;
}

int64_t issued_bytes(OpKind k, int64_t bytes, int n) {
  return k == OpKind::BroadcastRound ? bytes * n : bytes;
}

Op Op::compute(std::string name, double seconds, int mb, std::string category) {
  Op o;
  o.kind = OpKind::Compute;
  o.name = std::move(name);
  o.category = std::move(category);
  o.seconds = seconds;
  o.mb = mb;
  return o;
}

Op Op::collective(OpKind kind, std::string name, int group, int64_t bytes, int stream) {
  Op o;
  o.kind = kind;
  o.name = std::move(name);
  o.category = "comm";
  o.group = group;
  o.bytes = bytes;
  o.stream = stream;
  return o;
}

Op Op::send(std::string name, int peer, int64_t tag, int64_t bytes, int stream) {
  Op o;
  o.kind = OpKind::Send;
  o.name = std::move(name);
  o.category = "comm";
  o.peer = peer;
  o.tag = tag;
  o.bytes = bytes;
  o.stream = stream;
  return o;
}

Op Op::recv(std::string name, int peer, int64_t tag, int64_t bytes, int stream) {
  Op o = send(std::move(name), peer, tag, bytes, stream);
  o.kind = OpKind::Recv;
  return o;
}

int Workload::add_group(const std::vector<int>& ranks_in_ring_order, bool across) {
  for (size_t g = 0; g < groups.size(); ++g)
    if (groups[g] == ranks_in_ring_order && spans_copies(static_cast<int>(g)) == across)
      return static_cast<int>(g);
  groups.push_back(ranks_in_ring_order);
  if (across || !across_copies.empty()) across_copies.resize(groups.size(), 0);
  if (across) across_copies.back() = 1;
  return static_cast<int>(groups.size()) - 1;
}

int Workload::group_size(int g) const {
  const int n = static_cast<int>(groups.at(g).size());
  return spans_copies(g) ? n * copies : n;
}

int Workload::stages() const {
  int s = 0;
  for (const auto& r : ranks) s = std::max(s, r.stage + 1);
  return std::max(s, 1);
}

namespace detail {

Matching check_and_match(const Workload& w) {
  const int R = static_cast<int>(w.ranks.size());
  CAI_CHECK(R >= 1, "[sim] workload '{}' has no ranks", w.name);
  CAI_CHECK(w.copies >= 1, "[sim] workload '{}' has {} copies", w.name, w.copies);
  if (!w.gpus.empty()) {
    CAI_CHECK(static_cast<int>(w.gpus.size()) == R,
              "[sim] workload '{}' places {} ranks on GPUs but has {}", w.name, w.gpus.size(), R);
    std::vector<char> seen(R, 0);
    for (int g : w.gpus) {
      CAI_CHECK(g >= 0 && g < R && !seen[g],
                "[sim] workload '{}': GPU slot {} is out of [0, {}) or given twice", w.name, g, R);
      seen[g] = 1;
    }
  }
  CAI_CHECK(w.across_copies.size() <= w.groups.size(),
            "[sim] workload '{}' flags {} groups as spanning copies but has {} groups", w.name,
            w.across_copies.size(), w.groups.size());
  Matching m;
  m.instance_of.resize(R);
  m.position_of.resize(R);
  const int G = static_cast<int>(w.groups.size());
  // Per group: rank -> position, calls issued per member, and the instance of each call.
  std::vector<std::unordered_map<int, int>> position(G);
  std::vector<std::vector<int>> issued(G), calls_of(G);
  for (int g = 0; g < G; ++g) {
    const auto& grp = w.groups[g];
    CAI_CHECK(!grp.empty(), "[sim] group {} is empty", g);
    for (size_t k = 0; k < grp.size(); ++k) {
      CAI_CHECK(grp[k] >= 0 && grp[k] < R, "[sim] group {} has rank {} outside [0, {})", g, grp[k],
                R);
      CAI_CHECK(position[g].emplace(grp[k], static_cast<int>(k)).second,
                "[sim] group {} lists rank {} twice", g, grp[k]);
    }
    issued[g].assign(grp.size(), 0);
  }
  // p2p: (src, dst, tag) -> sends - receives
  std::map<std::tuple<int, int, int64_t>, std::pair<int, int>> p2p;
  for (int r = 0; r < R; ++r) {
    const auto& ops = w.ranks[r].ops;
    m.instance_of[r].assign(ops.size(), -1);
    m.position_of[r].assign(ops.size(), -1);
    CAI_CHECK(w.ranks[r].stage >= 0, "[sim] rank {}: stage {} < 0", r, w.ranks[r].stage);
    for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
      const Op& o = ops[i];
      auto where = [&] { return fmt::format("[sim] rank {} op {} ({})", r, i, o.name); };
      CAI_CHECK(o.stream >= 0, "{}: stream {} < 0", where(), o.stream);
      for (int d : o.deps)
        CAI_CHECK(d >= 0 && d < i, "{}: dependency {} is not an earlier op of the rank", where(),
                  d);
      CAI_CHECK(o.bytes >= 0, "{}: bytes {} < 0", where(), o.bytes);
      if (o.kind == OpKind::Compute) {
        CAI_CHECK(o.seconds >= 0 || (o.flops >= 0 && o.mem_bytes >= 0),
                  "{}: negative flops {} or bytes {}", where(), o.flops, o.mem_bytes);
      } else if (is_collective(o.kind)) {
        CAI_CHECK(o.group >= 0 && o.group < G, "{}: group {} is not one of the workload's {}",
                  where(), o.group, G);
        const int g = o.group;
        auto pos = position[g].find(r);
        CAI_CHECK(pos != position[g].end(), "{}: group {} [{}] does not contain rank {}", where(),
                  g, fmt::join(w.groups[g], ","), r);
        const int k = issued[g][pos->second]++;
        auto& calls = calls_of[g];
        if (k == static_cast<int>(calls.size())) {
          Instance in;
          in.kind = o.kind;
          in.bytes = o.bytes;
          in.group_id = g;
          if (o.kind == OpKind::Broadcast) {
            // One root in copy 0: the copies would not run alike.
            CAI_CHECK(!w.spans_copies(g) || w.copies == 1,
                      "{}: a broadcast over group {}, which spans the workload's {} copies",
                      where(), g, w.copies);
            const int root = o.root < 0 ? w.groups[g][0] : o.root;
            auto rp = position[g].find(root);
            CAI_CHECK(rp != position[g].end(), "{}: broadcast root {} is not in the group", where(),
                      root);
            in.root_pos = rp->second;
          }
          calls.push_back(static_cast<int>(m.instances.size()));
          m.instances.push_back(in);
        }
        const int id = calls[k];
        const Instance& in = m.instances[id];
        CAI_CHECK(in.kind == o.kind && in.bytes == o.bytes,
                  "{}: collective #{} on its group is {} of {} bytes here but {} of {} bytes on "
                  "another member",
                  where(), k, op_kind_name(o.kind), o.bytes, op_kind_name(in.kind), in.bytes);
        m.instance_of[r][i] = id;
        m.position_of[r][i] = pos->second;
      } else if (o.kind == OpKind::Send || o.kind == OpKind::Recv) {
        CAI_CHECK(o.peer >= 0 && o.peer < R && o.peer != r, "{}: peer {} is not another rank",
                  where(), o.peer);
        if (o.kind == OpKind::Send)
          ++p2p[{r, o.peer, o.tag}].first;
        else
          ++p2p[{o.peer, r, o.tag}].second;
      }
    }
  }
  for (const auto& [key, n] : p2p) {
    const auto& [src, dst, tag] = key;
    CAI_CHECK(n.first == 1 && n.second == 1,
              "[sim] {} send(s) from rank {} to rank {} with tag {} against {} receive(s): each "
              "send needs exactly one receive",
              n.first, src, dst, tag, n.second);
  }
  for (int g = 0; g < G; ++g)
    for (size_t k = 0; k < w.groups[g].size(); ++k)
      CAI_CHECK(issued[g][k] == static_cast<int>(calls_of[g].size()),
                "[sim] rank {} issues {} collective(s) on group {} but another member issues {}",
                w.groups[g][k], issued[g][k], g, calls_of[g].size());
  return m;
}

}  // namespace detail

void check(const Workload& w) {
  detail::check_and_match(w);
}

}  // namespace cai::sim
