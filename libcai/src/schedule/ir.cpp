// The schedule IR (names, printing) and layer partitioning.
#include <fmt/format.h>

#include <limits>
#include <numeric>

#include "cai/core/error.h"
#include "cai/schedule/schedule.h"

namespace cai::schedule {

const char* op_name(Op op) {
  switch (op) {
    case Op::LoadMicroBatch:
      return "LoadMicroBatch";
    case Op::Forward:
      return "Forward";
    case Op::Backward:
      return "Backward";
    case Op::BackwardInput:
      return "BackwardInput";
    case Op::BackwardWeight:
      return "BackwardWeight";
    case Op::SendActivation:
      return "SendActivation";
    case Op::RecvActivation:
      return "RecvActivation";
    case Op::SendGrad:
      return "SendGrad";
    case Op::RecvGrad:
      return "RecvGrad";
    case Op::ReduceGrads:
      return "ReduceGrads";
    case Op::OptimizerStep:
      return "OptimizerStep";
  }
  return "?";
}

bool is_compute(Op op) {
  return op == Op::Forward || op == Op::Backward || op == Op::BackwardInput ||
         op == Op::BackwardWeight;
}
bool is_send(Op op) {
  return op == Op::SendActivation || op == Op::SendGrad;
}
bool is_recv(Op op) {
  return op == Op::RecvActivation || op == Op::RecvGrad;
}

std::string Instr::str() const {
  switch (op) {
    case Op::LoadMicroBatch:
      return fmt::format("Load(mb={})", mb);
    case Op::Forward:
      return fmt::format("F(mb={},c={})", mb, chunk);
    case Op::Backward:
      return fmt::format("B(mb={},c={})", mb, chunk);
    case Op::BackwardInput:
      return fmt::format("BI(mb={},c={})", mb, chunk);
    case Op::BackwardWeight:
      return fmt::format("BW(mb={},c={})", mb, chunk);
    case Op::SendActivation:
      return fmt::format("SendAct(mb={},c={},->{})", mb, chunk, peer);
    case Op::RecvActivation:
      return fmt::format("RecvAct(mb={},c={},<-{})", mb, chunk, peer);
    case Op::SendGrad:
      return fmt::format("SendGrad(mb={},c={},->{})", mb, chunk, peer);
    case Op::RecvGrad:
      return fmt::format("RecvGrad(mb={},c={},<-{})", mb, chunk, peer);
    case Op::ReduceGrads:
      return "ReduceGrads";
    case Op::OptimizerStep:
      return "OptStep";
  }
  return fmt::format("?(op={})", static_cast<int>(op));
}

std::string Schedule::str() const {
  std::string out;
  for (size_t r = 0; r < programs.size(); ++r) {
    out += fmt::format("rank {}:", r);
    for (const Instr& in : programs[r]) {
      out += ' ';
      out += in.str();
    }
    out += "\n";
  }
  return out;
}

int Partition::total_layers() const {
  return std::accumulate(layers_per_virtual_stage.begin(), layers_per_virtual_stage.end(), 0);
}

int Partition::first_layer(int vstage) const {
  CAI_CHECK(vstage >= 0 && vstage < virtual_stages(),
            "[partition] virtual stage {} out of range (partition has {})", vstage,
            virtual_stages());
  int first = 0;
  for (int i = 0; i < vstage; ++i) first += layers_per_virtual_stage[i];
  return first;
}

Partition partition_uniform(int num_layers, int virtual_stages) {
  CAI_CHECK(virtual_stages >= 1, "[partition] virtual_stages must be >= 1 (got {})",
            virtual_stages);
  CAI_CHECK(num_layers >= virtual_stages,
            "[partition] {} layers cannot fill {} virtual stages (every stage needs >= 1 layer)",
            num_layers, virtual_stages);
  Partition p;
  p.layers_per_virtual_stage.assign(virtual_stages, num_layers / virtual_stages);
  for (int i = 0; i < num_layers % virtual_stages; ++i) ++p.layers_per_virtual_stage[i];
  return p;
}

Partition partition_balanced(const std::vector<int64_t>& layer_costs, int virtual_stages) {
  const int n = static_cast<int>(layer_costs.size());
  const int k = virtual_stages;
  CAI_CHECK(k >= 1, "[partition] virtual_stages must be >= 1 (got {})", k);
  CAI_CHECK(n >= k,
            "[partition] {} layers cannot fill {} virtual stages (every stage needs >= 1 layer)", n,
            k);
  for (int i = 0; i < n; ++i)
    CAI_CHECK(layer_costs[i] >= 0, "[partition] layer {} has negative cost {}", i, layer_costs[i]);
  std::vector<int64_t> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + layer_costs[i];
  auto cost = [&](int a, int b) { return prefix[b] - prefix[a]; };  // layers [a, b)

  // Pass 1: the smallest achievable maximum stage cost. best[s][i]: first i layers in s stages.
  constexpr int64_t kInf = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int64_t>> best(k + 1, std::vector<int64_t>(n + 1, kInf));
  best[0][0] = 0;
  for (int s = 1; s <= k; ++s)
    for (int i = s; i <= n - (k - s); ++i)
      for (int j = s - 1; j < i; ++j)
        if (best[s - 1][j] != kInf)
          best[s][i] = std::min(best[s][i], std::max(best[s - 1][j], cost(j, i)));
  const int64_t limit = best[k][n];

  // Pass 2: under that maximum, the smallest sum of squared stage costs (exact in __int128).
  using Wide = __int128;
  const Wide kWideInf = static_cast<Wide>(kInf) * kInf;
  std::vector<std::vector<Wide>> sq(k + 1, std::vector<Wide>(n + 1, kWideInf));
  sq[0][0] = 0;
  for (int s = 1; s <= k; ++s)
    for (int i = s; i <= n - (k - s); ++i)
      for (int j = s - 1; j < i; ++j) {
        const int64_t c = cost(j, i);
        if (sq[s - 1][j] == kWideInf || c > limit) continue;
        sq[s][i] = std::min(sq[s][i], sq[s - 1][j] + static_cast<Wide>(c) * c);
      }

  // Walk back from the end; among ties take the latest start for the last stage, so earlier
  // stages get more layers (equal costs reproduce partition_uniform).
  Partition p;
  p.layers_per_virtual_stage.assign(k, 0);
  int i = n;
  for (int s = k; s >= 1; --s) {
    int pick = -1;
    for (int j = i - 1; j >= s - 1; --j) {
      const int64_t c = cost(j, i);
      if (sq[s - 1][j] == kWideInf || c > limit) continue;
      if (sq[s - 1][j] + static_cast<Wide>(c) * c == sq[s][i]) {
        pick = j;
        break;
      }
    }
    CAI_CHECK(pick >= 0, "[partition] internal error reconstructing the balanced split");
    p.layers_per_virtual_stage[s - 1] = i - pick;
    i = pick;
  }
  return p;
}

Partition partition_explicit(const std::vector<int>& num_layers_per_stage, int num_layers,
                             int virtual_stages) {
  const int k = static_cast<int>(num_layers_per_stage.size());
  CAI_CHECK(k >= 1, "[partition] explicit num_layers_per_stage is empty");
  if (virtual_stages > 0)
    CAI_CHECK(k == virtual_stages,
              "[partition] explicit num_layers_per_stage has {} entries, expected {} (one per "
              "virtual stage)",
              k, virtual_stages);
  int64_t sum = 0;
  for (int i = 0; i < k; ++i) {
    CAI_CHECK(num_layers_per_stage[i] >= 1,
              "[partition] explicit num_layers_per_stage[{}] = {}: every stage needs >= 1 layer", i,
              num_layers_per_stage[i]);
    sum += num_layers_per_stage[i];
  }
  CAI_CHECK(sum == num_layers,
            "[partition] explicit num_layers_per_stage sums to {}, the model has {} layers", sum,
            num_layers);
  return Partition{num_layers_per_stage};
}

}  // namespace cai::schedule

namespace cai::schedule {

Partition partition_layers(int num_layers, int virtual_stages, const std::string& how,
                           const std::vector<int64_t>& layer_costs,
                           const std::vector<int>& explicit_layers) {
  if (!explicit_layers.empty())
    return partition_explicit(explicit_layers, num_layers, virtual_stages);
  if (how == "balanced") return partition_balanced(layer_costs, virtual_stages);
  CAI_CHECK(how == "uniform", "[partition] partition '{}' is not uniform or balanced", how);
  const int middle = num_layers - 2;
  if (middle >= virtual_stages) {
    std::vector<int> n = partition_uniform(middle, virtual_stages).layers_per_virtual_stage;
    n.front() += 1;
    n.back() += 1;
    return partition_explicit(n, num_layers, virtual_stages);
  }
  return partition_uniform(num_layers, virtual_stages);
}

int requested_micro_batches(int64_t batch, int num_microbatches, int microbatch_size, int stages) {
  if (num_microbatches > 0) return num_microbatches;
  if (microbatch_size > 0) return static_cast<int>((batch + microbatch_size - 1) / microbatch_size);
  return stages;
}

int micro_batch_count(int64_t batch, int num_microbatches, int microbatch_size, int stages,
                      const std::string& style) {
  const int m = requested_micro_batches(batch, num_microbatches, microbatch_size, stages);
  if (style == "interleaved")
    CAI_CHECK(m % stages == 0,
              "[pipeline] interleaved schedules need the micro-batch count ({}) to be a multiple "
              "of the stage count ({})",
              m, stages);
  CAI_CHECK(batch >= m, "[pipeline] a batch of {} samples cannot make {} micro-batches", batch, m);
  return m;
}

}  // namespace cai::schedule

namespace cai::schedule {

std::vector<int> v_placement(int stages) {
  CAI_CHECK(stages >= 1, "[schedule] v_placement: stages must be >= 1 (got {})", stages);
  std::vector<int> out(2 * stages);
  for (int r = 0; r < stages; ++r) out[r] = out[2 * stages - 1 - r] = r;
  return out;
}

std::vector<int> placement_of(const std::string& style, int stages, int chunks) {
  if (style == "zbv") {
    CAI_CHECK(chunks == 2, "[schedule] zbv holds 2 chunks per rank (got chunks = {})", chunks);
    return v_placement(stages);
  }
  return {};
}

std::vector<int> placement_table(const std::vector<int>& placement, int stages, int chunks) {
  const int nv = stages * chunks;
  if (placement.empty()) {
    std::vector<int> out(nv);
    for (int v = 0; v < nv; ++v) out[v] = v % stages;
    return out;
  }
  CAI_CHECK(static_cast<int>(placement.size()) == nv,
            "[schedule] placement has {} entries, expected stages {} x chunks {} = {}",
            placement.size(), stages, chunks, nv);
  std::vector<int> count(stages, 0);
  for (int v = 0; v < nv; ++v) {
    CAI_CHECK(placement[v] >= 0 && placement[v] < stages,
              "[schedule] placement[{}] = {} is not a rank in [0, {})", v, placement[v], stages);
    ++count[placement[v]];
  }
  for (int r = 0; r < stages; ++r)
    CAI_CHECK(count[r] == chunks,
              "[schedule] placement gives rank {} {} virtual stages, expected chunks = {}", r,
              count[r], chunks);
  return placement;
}

int Schedule::virtual_stage(int rank, int chunk) const {
  CAI_CHECK(rank >= 0 && rank < stages && chunk >= 0 && chunk < chunks,
            "[schedule] rank {} chunk {} out of range (stages {}, chunks {})", rank, chunk, stages,
            chunks);
  if (placement.empty()) return chunk * stages + rank;
  int seen = 0;
  for (int v = 0; v < static_cast<int>(placement.size()); ++v)
    if (placement[v] == rank && seen++ == chunk) return v;
  fail("[schedule] placement gives rank {} no chunk {}", rank, chunk);
}

int Schedule::rank_of(int vstage) const {
  CAI_CHECK(vstage >= 0 && vstage < virtual_stages(),
            "[schedule] virtual stage {} out of range [0, {})", vstage, virtual_stages());
  if (placement.empty()) return vstage % stages;
  return placement.at(vstage);
}

int Schedule::chunk_of(int vstage) const {
  const int r = rank_of(vstage);
  if (placement.empty()) return vstage / stages;
  int c = 0;
  for (int v = 0; v < vstage; ++v) c += placement[v] == r;
  return c;
}

}  // namespace cai::schedule
