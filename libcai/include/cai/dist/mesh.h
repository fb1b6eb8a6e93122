// The process mesh dp × pp × tp with Colossal-AI's rank order: tensor-parallel ranks are
// contiguous, then pipeline stages, data parallelism outermost:
//   rank = dp·(pp_size·tp_size) + pp·tp_size + tp.
#pragma once
#include <string>
#include <vector>

namespace cai::dist {

struct MeshCoord {
  int dp = 0, pp = 0, tp = 0;
  bool operator==(const MeshCoord&) const = default;
};

class ProcessMesh {
 public:
  // world must be divisible by tp·pp (the error says so); dp = world / (tp·pp).
  ProcessMesh(int world, int tp, int pp);
  int world() const { return world_; }
  int dp_size() const { return dp_; }
  int pp_size() const { return pp_; }
  int tp_size() const { return tp_; }
  MeshCoord coord(int rank) const;
  int rank_of(MeshCoord c) const;
  // The ranks sharing this rank's other two coordinates, in order.
  std::vector<int> dp_group(int rank) const;
  std::vector<int> pp_group(int rank) const;
  std::vector<int> tp_group(int rank) const;
  std::string describe() const;  // "dp 2 × pp 1 × tp 1"

 private:
  int world_, dp_, pp_, tp_;
};

}  // namespace cai::dist
