// Where a pipeline executor may post each receive ahead of its instruction (see schedule.h,
// receive_post_points): a vector-clock replay of the programs, pairing each channel's sends and
// receives in order, as NCCL does.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "cai/core/error.h"
#include "cai/schedule/schedule.h"

namespace cai::schedule {

std::vector<std::vector<size_t>> receive_post_points(const Schedule& s) {
  const int p = s.stages;
  CAI_CHECK(static_cast<int>(s.programs.size()) == p, "[schedule] {} programs for {} stages",
            s.programs.size(), p);
  // The k-th send of a (kind, src, dst) channel pairs with the k-th receive of it.
  using Channel = std::tuple<bool, int, int>;  // grad?, src, dst
  std::map<Channel, std::vector<size_t>> sends;
  for (int r = 0; r < p; ++r)
    for (size_t i = 0; i < s.programs[r].size(); ++i) {
      const Instr& in = s.programs[r][i];
      if (!is_send(in.op)) continue;
      CAI_CHECK(in.peer >= 0 && in.peer < p, "[schedule] rank {} #{} {}: peer out of range", r, i,
                in.str());
      sends[{in.op == Op::SendGrad, r, in.peer}].push_back(i);
    }
  // matched[r][i]: for a receive, the position of its send on the peer.
  std::vector<std::vector<size_t>> matched(p);
  std::map<Channel, size_t> taken;
  for (int r = 0; r < p; ++r) {
    matched[r].assign(s.programs[r].size(), 0);
    for (size_t i = 0; i < s.programs[r].size(); ++i) {
      const Instr& in = s.programs[r][i];
      if (!is_recv(in.op)) continue;
      CAI_CHECK(in.peer >= 0 && in.peer < p, "[schedule] rank {} #{} {}: peer out of range", r, i,
                in.str());
      const Channel c{in.op == Op::RecvGrad, in.peer, r};
      const size_t k = taken[c]++;
      const auto it = sends.find(c);
      CAI_CHECK(it != sends.end() && k < it->second.size(),
                "[schedule] rank {} #{} {}: no matching send on rank {}", r, i, in.str(), in.peer);
      matched[r][i] = it->second[k];
    }
  }
  // Vector clocks: clock[r][i][q] = the last position of rank q that instruction i of rank r
  // depends on (program order within a rank, send -> receive across ranks), -1 for none.
  std::vector<std::vector<std::vector<int>>> clock(p);
  for (int r = 0; r < p; ++r) clock[r].resize(s.programs[r].size());
  std::vector<size_t> pc(p, 0);
  for (;;) {
    bool progress = false, finished = true;
    for (int r = 0; r < p; ++r) {
      const Program& prog = s.programs[r];
      while (pc[r] < prog.size()) {
        const size_t i = pc[r];
        std::vector<int> v = i > 0 ? clock[r][i - 1] : std::vector<int>(p, -1);
        if (is_recv(prog[i].op)) {
          const int q = prog[i].peer;
          if (pc[q] <= matched[r][i]) break;  // its send has not run yet
          const std::vector<int>& sv = clock[q][matched[r][i]];
          for (int k = 0; k < p; ++k) v[k] = std::max(v[k], sv[k]);
        }
        v[r] = static_cast<int>(i);
        clock[r][i] = std::move(v);
        ++pc[r];
        progress = true;
      }
      finished = finished && pc[r] == prog.size();
    }
    if (finished) break;
    CAI_CHECK(progress, "[schedule] {}: the programs deadlock (validate() names where)", s.name);
  }
  std::vector<std::vector<size_t>> points(p);
  for (int r = 0; r < p; ++r) {
    const Program& prog = s.programs[r];
    points[r].resize(prog.size());
    for (size_t i = 0; i < prog.size(); ++i) {
      points[r][i] = i;
      if (!is_recv(prog[i].op)) continue;
      const int need = clock[prog[i].peer][matched[r][i]][r];
      points[r][i] = static_cast<size_t>(need + 1);
    }
  }
  return points;
}

}  // namespace cai::schedule

namespace cai::schedule {

std::vector<std::vector<size_t>> receive_posting(const Schedule& s, int rank, bool ahead) {
  CAI_CHECK(rank >= 0 && rank < s.stages, "[schedule] rank {} outside [0, {})", rank, s.stages);
  const Program& prog = s.programs[rank];
  std::vector<std::vector<size_t>> before(prog.size());
  const std::vector<size_t> safe =
      ahead ? receive_post_points(s)[rank] : std::vector<size_t>(prog.size());
  std::vector<size_t> order[2];  // receive positions per kind (activation, gradient)
  for (size_t i = 0; i < prog.size(); ++i)
    if (is_recv(prog[i].op)) order[prog[i].op == Op::RecvGrad].push_back(i);
  size_t next[2] = {0, 0};  // the kind's next receive not posted yet
  bool outstanding[2] = {false, false};
  for (size_t pos = 0; pos < prog.size(); ++pos) {
    if (ahead)
      for (int k = 0; k < 2; ++k)
        if (!outstanding[k] && next[k] < order[k].size() && safe[order[k][next[k]]] <= pos) {
          before[pos].push_back(order[k][next[k]++]);
          outstanding[k] = true;
        }
    if (!is_recv(prog[pos].op)) continue;
    const int k = prog[pos].op == Op::RecvGrad;
    if (!outstanding[k]) {  // not posted ahead: now
      CAI_CHECK(order[k][next[k]] == pos, "[schedule] rank {}: receive order broken at #{}", rank,
                pos);
      before[pos].push_back(order[k][next[k]++]);
    }
    outstanding[k] = false;  // taken here
  }
  return before;
}

}  // namespace cai::schedule
