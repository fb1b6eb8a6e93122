#include "cai/nn/tensor_parallel.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "cai/core/error.h"
#include "cai/ops/ops.h"
#include "kernels/device.h"
#include "kernels/tokens.h"

namespace cai::nn {

namespace {

bool is_half(DType t) {
  return t == DType::BF16 || t == DType::F16;
}

// Per dimension of spec.full, the coordinates rank r's part keeps, in order.
std::vector<std::vector<int64_t>> kept_coords(const ShardSpec& s, int r) {
  std::vector<std::vector<int64_t>> k(s.full.size());
  for (size_t d = 0; d < s.full.size(); ++d) {
    k[d].resize(s.full[d]);
    for (int64_t i = 0; i < s.full[d]; ++i) k[d][i] = i;
  }
  for (size_t i = 0; i < s.cuts.size(); ++i) {
    const ShardCut& c = s.cuts[i];
    CAI_CHECK(c.dim >= 0 && c.dim < static_cast<int>(s.full.size()),
              "[tensor_parallel] shard dimension {} is outside shape {}", c.dim, shape_str(s.full));
    std::vector<int64_t>& v = k[c.dim];
    const int64_t n = static_cast<int64_t>(v.size());
    CAI_CHECK(c.groups >= 1 && c.count >= 1 && n % (c.groups * c.count) == 0,
              "[tensor_parallel] dimension {} of {} ({} left) is not divisible by {} groups × {} "
              "parts",
              c.dim, shape_str(s.full), n, c.groups, c.count);
    const int64_t chunk = n / (c.groups * c.count), p = s.part(i, r);
    std::vector<int64_t> out;
    out.reserve(n / c.count);
    for (int64_t g = 0; g < c.groups; ++g)
      for (int64_t j = 0; j < chunk; ++j) out.push_back(v[(g * c.count + p) * chunk + j]);
    v = std::move(out);
  }
  return k;
}

// Calls f(full element offset, part element offset, run length) for the runs of rank r's part.
template <typename F>
void for_each_run(const ShardSpec& s, int r, F&& f) {
  const auto k = kept_coords(s, r);
  const size_t nd = k.size();
  if (nd == 0) {
    f(0, 0, 1);
    return;
  }
  std::vector<int64_t> stride(nd, 1);
  for (size_t d = nd - 1; d-- > 0;) stride[d] = stride[d + 1] * s.full[d + 1];
  // Runs along the last dimension: consecutive kept coordinates copy together.
  const std::vector<int64_t>& last = k[nd - 1];
  std::vector<std::pair<int64_t, int64_t>> runs;  // (first coordinate, length)
  for (size_t j = 0; j < last.size(); ++j) {
    if (!runs.empty() && runs.back().first + runs.back().second == last[j])
      ++runs.back().second;
    else
      runs.push_back({last[j], 1});
  }
  int64_t outer = 1;
  for (size_t d = 0; d + 1 < nd; ++d) outer *= static_cast<int64_t>(k[d].size());
  std::vector<size_t> idx(nd, 0);
  int64_t part_off = 0;
  for (int64_t o = 0; o < outer; ++o) {
    int64_t base = 0;
    for (size_t d = 0; d + 1 < nd; ++d) base += k[d][idx[d]] * stride[d];
    for (const auto& [first, len] : runs) {
      f(base + first, part_off, len);
      part_off += len;
    }
    for (size_t d = nd - 1; d-- > 0;) {
      if (++idx[d] < k[d].size()) break;
      idx[d] = 0;
    }
  }
}

}  // namespace

Shape shard_shape(const Shape& full, int dim, int count) {
  Shape s = full;
  s[dim] /= count;
  return s;
}

Tensor shard_of(const Tensor& full, const ShardSpec& s) {
  if (!s.sharded()) return full.clone();
  CAI_CHECK(!full.is_cuda(), "[tensor_parallel] shard_of works on CPU tensors, got {}", full.str());
  CAI_CHECK(full.shape() == s.full, "[tensor_parallel] shard_of: tensor {} is not the full {}",
            full.str(), shape_str(s.full));
  CAI_CHECK(s.rank >= 0 && s.rank < s.size, "[tensor_parallel] rank {} outside {} ranks", s.rank,
            s.size);
  Tensor out = Tensor::empty(shard_local_shape(s), full.dtype());
  const size_t es = dtype_size(full.dtype());
  const char* src = static_cast<const char*>(full.raw());
  char* dst = static_cast<char*>(out.raw());
  for_each_run(s, s.rank, [&](int64_t from, int64_t to, int64_t len) {
    std::memcpy(dst + to * es, src + from * es, len * es);
  });
  return out;
}

Tensor unshard(const std::vector<Tensor>& parts, const ShardSpec& s) {
  CAI_CHECK(!parts.empty(), "[tensor_parallel] unshard needs the parts");
  if (!s.sharded()) return parts.front().clone();
  CAI_CHECK(static_cast<int>(parts.size()) == s.size,
            "[tensor_parallel] unshard of {} needs {} parts (one per tensor-parallel rank), got {}",
            shape_str(s.full), s.size, parts.size());
  const Shape part_shape = shard_local_shape(s);
  Tensor out = Tensor::empty(s.full, parts.front().dtype());
  const size_t es = dtype_size(out.dtype());
  char* dst = static_cast<char*>(out.raw());
  for (int r = 0; r < s.size; ++r) {
    bool first = true;  // ranks holding the same part: the lowest one's copy
    for (int q = 0; q < r && first; ++q) first = !s.same_part(q, r);
    if (!first) continue;
    const Tensor& t = parts[r];
    CAI_CHECK(!t.is_cuda() && t.shape() == part_shape && t.dtype() == out.dtype(),
              "[tensor_parallel] part {} of {} is {}, expected {} on the CPU", r, shape_str(s.full),
              t.str(), shape_str(part_shape));
    const char* src = static_cast<const char*>(t.raw());
    for_each_run(s, r, [&](int64_t to, int64_t from, int64_t len) {
      std::memcpy(dst + to * es, src + from * es, len * es);
    });
  }
  return out;
}

const char* tp_group_name(TpGroup g) {
  switch (g) {
    case TpGroup::All:
      return "tp";
    case TpGroup::Row:
      return "row";
    case TpGroup::Col:
      return "col";
    case TpGroup::Depth:
      return "depth";
    case TpGroup::ColDepth:
      return "col×depth";
    case TpGroup::Input:
      return "input";
    case TpGroup::Weight:
      return "weight";
    case TpGroup::Output:
      return "output";
    case TpGroup::InputWeight:
      return "input×weight";
    case TpGroup::OutputWeight:
      return "output×weight";
  }
  return "?";
}

namespace {

int int_root(int n, int k) {  // the integer r with r^k == n, or -1
  for (int r = 1;; ++r) {
    int64_t p = 1;
    for (int i = 0; i < k; ++i) p *= r;
    if (p == n) return r;
    if (p > n) return -1;
  }
}

std::string valid_sizes(const std::string& mode, int depth) {
  std::vector<std::string> v;
  for (int r = 2; v.size() < 5; ++r) {
    if (mode == "2d") v.push_back(std::to_string(r * r));
    if (mode == "2.5d") v.push_back(std::to_string(r * r * depth));
    if (mode == "3d") v.push_back(std::to_string(r * r * r));
  }
  return fmt::format("{}, ...", fmt::join(v, ", "));
}

// The members of group g holding tensor-parallel rank r, in the group's order. Coordinates:
// 2d/2.5d r = a + q·(b + q·k); 3d r = i + q·(j + q·k) (a, i fastest).
std::vector<int> members_of(TpGroup g, int r, int q, int size) {
  const int x = r % q, y = (r / q) % q, z = r / (q * q);
  std::vector<int> m;
  auto at = [q](int i, int j, int k) { return i + q * (j + q * k); };
  const int zs = size / (q * q);
  switch (g) {
    case TpGroup::All:
      for (int s = 0; s < size; ++s) m.push_back(s);
      break;
    case TpGroup::Row:     // vary a
    case TpGroup::Weight:  // vary i
      for (int i = 0; i < q; ++i) m.push_back(at(i, y, z));
      break;
    case TpGroup::Col:    // vary b
    case TpGroup::Input:  // vary j
      for (int j = 0; j < q; ++j) m.push_back(at(x, j, z));
      break;
    case TpGroup::Depth:   // vary k
    case TpGroup::Output:  // vary k
      for (int k = 0; k < zs; ++k) m.push_back(at(x, y, k));
      break;
    case TpGroup::ColDepth:  // vary (b, k), index k·q + b
      for (int k = 0; k < zs; ++k)
        for (int j = 0; j < q; ++j) m.push_back(at(x, j, k));
      break;
    case TpGroup::InputWeight:  // vary (i, j), index i·q + j
      for (int i = 0; i < q; ++i)
        for (int j = 0; j < q; ++j) m.push_back(at(i, j, z));
      break;
    case TpGroup::OutputWeight:  // vary (i, k), index i·q + k
      for (int i = 0; i < q; ++i)
        for (int k = 0; k < zs; ++k) m.push_back(at(i, y, k));
      break;
  }
  return m;
}

}  // namespace

std::vector<int> tp_group_members(const std::string& mode, int size, int depth,
                                  const std::string& group, int rank) {
  TensorParallel::validate_size(mode, size, depth);
  CAI_CHECK(rank >= 0 && rank < size, "[tensor_parallel] rank {} outside {} ranks", rank, size);
  const std::vector<TpGroup> all = {TpGroup::All,         TpGroup::Row,      TpGroup::Col,
                                    TpGroup::Depth,       TpGroup::ColDepth, TpGroup::Input,
                                    TpGroup::Weight,      TpGroup::Output,   TpGroup::InputWeight,
                                    TpGroup::OutputWeight};
  for (TpGroup g : all)
    if (group == tp_group_name(g)) {
      if (g == TpGroup::All) return members_of(g, rank, 1, size);
      CAI_CHECK(mode != "1d", "[tensor_parallel] 1d has no {} group", group);
      return members_of(g, rank, TensorParallel::grid(mode, size, depth).q, size);
    }
  fail("[tensor_parallel] no tensor-parallel group named '{}'", group);
}

void TensorParallel::validate_size(const std::string& mode, int size, int depth) {
  CAI_CHECK(mode == "1d" || mode == "2d" || mode == "2.5d" || mode == "3d",
            "[tensor_parallel] mode '{}' is not one of 1d, 2d, 2.5d, 3d", mode);
  CAI_CHECK(size >= 1, "[tensor_parallel] size {} must be at least 1", size);
  CAI_CHECK(depth >= 1, "[tensor_parallel] depth {} must be at least 1", depth);
  CAI_CHECK(mode == "2.5d" || depth == 1,
            "[tensor_parallel] depth {} applies to mode 2.5d only (mode is {})", depth, mode);
  if (mode == "2d")
    CAI_CHECK(size > 1 && int_root(size, 2) > 1,
              "[tensor_parallel] 2d needs a square size (q × q ranks), got {}: valid sizes are {}",
              size, valid_sizes(mode, 1));
  if (mode == "2.5d")
    CAI_CHECK(size % depth == 0 && int_root(size / depth, 2) > 1,
              "[tensor_parallel] 2.5d with depth {} needs size / depth to be a square (q × q × "
              "depth ranks), got size {}: valid sizes are {}",
              depth, size, valid_sizes(mode, depth));
  if (mode == "3d")
    CAI_CHECK(
        int_root(size, 3) > 1,
        "[tensor_parallel] 3d needs a cube size (q × q × q ranks), got {}: valid sizes are {}",
        size, valid_sizes(mode, 1));
}

TensorParallel::Grid TensorParallel::grid(const std::string& mode, int size, int depth) {
  validate_size(mode, size, depth);
  Grid g;
  if (mode == "1d") return g;
  g.q = mode == "3d" ? int_root(size, 3) : int_root(size / depth, 2);
  g.chunks = mode == "3d" ? g.q * g.q : g.q * depth;
  g.in_cut = mode == "3d" ? g.q * g.q : g.q;
  return g;
}

std::vector<TensorParallel::ModeChoice> TensorParallel::modes_for(int size) {
  std::vector<ModeChoice> out;
  if (size < 2) return out;
  out.push_back({"1d", 1});
  if (int_root(size, 2) > 1) out.push_back({"2d", 1});
  for (int d = 1; d < size; ++d)
    if (size % d == 0 && int_root(size / d, 2) > 1) out.push_back({"2.5d", d});
  if (int_root(size, 3) > 1) out.push_back({"3d", 1});
  return out;
}

TensorParallel::TensorParallel(dist::Communicator& tp, std::string mode, bool sequence_parallel,
                               int depth)
    : comm_(tp),
      mode_(std::move(mode)),
      sequence_parallel_(sequence_parallel),
      size_(tp.size()),
      rank_(tp.rank()) {
  validate_size(mode_, size_, depth);
  // The ranks of a tensor group compute some layers alike (the patch embedding, the LayerNorms'
  // inputs) and keep those parameters equal by computing equal gradients: their GEMMs must run
  // the same algorithms, which per-process timing does not promise.
  if (size_ > 1) kernels::cuda::set_gemm_timing(false);
  CAI_CHECK(mode_ == "1d" || !sequence_parallel_,
            "[tensor_parallel] sequence parallelism is a 1d feature; mode {} splits the batch "
            "and the features instead",
            mode_);
  if (mode_ == "1d") return;
  depth_ = depth;
  q_ = grid(mode_, size_, depth_).q;
  const int q = q_, r = rank_;
  std::vector<TpGroup> gs;
  if (mode_ == "3d") {
    gs = {TpGroup::Input, TpGroup::Weight, TpGroup::Output, TpGroup::InputWeight,
          TpGroup::OutputWeight};
    const int i = r % q, j = (r / q) % q, k = r / (q * q);
    layouts_[0] = Layout{i * q + j, q * q, k, q, q * q, TpGroup::Output, TpGroup::InputWeight};
    layouts_[1] = Layout{i * q + k, q * q, j, q, q, TpGroup::Input, TpGroup::OutputWeight};
  } else {
    gs = {TpGroup::Row, TpGroup::Col, TpGroup::Depth, TpGroup::ColDepth};
    const int a = r % q, b = (r / q) % q, k = r / (q * q);
    layouts_[0] = Layout{k * q + b, q * depth_, a, q, 1, TpGroup::Row, TpGroup::ColDepth};
    layouts_[1] = layouts_[0];
  }
  // Every rank splits every group in the same order (collective over tp).
  for (TpGroup g : gs) {
    const std::vector<int> m = members_of(g, r, q, size_);
    int key = 0;
    while (m[key] != r) ++key;
    groups_[g] = comm_.split(m.front(), key,
                             fmt::format("{}.{}{}", comm_.name(), tp_group_name(g), m.front()));
  }
}

TensorParallel::~TensorParallel() = default;

std::string TensorParallel::describe() const {
  if (mode_ == "1d")
    return fmt::format("tp {} (1d{})", size_, sequence_parallel_ ? ", sequence parallel" : "");
  if (mode_ == "2.5d") return fmt::format("tp {} (2.5d, q {}, depth {})", size_, q_, depth_);
  return fmt::format("tp {} ({}, q {})", size_, mode_, q_);
}

dist::Communicator& TensorParallel::group(TpGroup g) const {
  if (g == TpGroup::All) return comm_;
  const auto it = groups_.find(g);
  CAI_CHECK(it != groups_.end(), "[tensor_parallel] mode {} has no {} group", mode_,
            tp_group_name(g));
  return *it->second;
}

std::pair<int64_t, int64_t> TensorParallel::batch_range(int64_t batch, int orient) const {
  const Layout& l = layout(orient);
  CAI_CHECK(batch % l.chunks == 0,
            "[tensor_parallel] {} splits the batch into {} chunks: a (micro-)batch of {} samples "
            "is not divisible by {}",
            mode_, l.chunks, batch, l.chunks);
  const int64_t n = batch / l.chunks;
  return {n * l.chunk, n * (l.chunk + 1)};
}

std::pair<int64_t, int64_t> TensorParallel::feature_slice(int64_t features, int orient) const {
  const Layout& l = layout(orient);
  CAI_CHECK(features % l.features == 0,
            "[tensor_parallel] {} features are not divisible by {}'s {} feature chunks", features,
            mode_, l.features);
  const int64_t n = features / l.features;
  return {n * l.feature, n * (l.feature + 1)};
}

ShardSpec TensorParallel::feature_spec(const Shape& full, int dim, int orient, int groups) const {
  const Layout& l = layout(orient);
  ShardSpec s;
  s.full = full;
  s.rank = rank_, s.size = size_;
  s.cuts.push_back(ShardCut{dim, groups, l.features, l.feature_stride});
  return s;
}

std::pair<ShardSpec, ShardSpec> TensorParallel::linear_specs(int64_t in, int64_t out, int orient,
                                                             int groups) const {
  CAI_CHECK(nd(), "[tensor_parallel] linear_specs is for 2d, 2.5d and 3d (mode is {})", mode_);
  const int q = q_;
  ShardSpec w, b;
  if (mode_ == "3d") {
    const Layout& li = layout(orient);
    const Layout& lo = layout(1 - orient);
    w = feature_spec({out, in}, 0, 1 - orient, groups);
    w.cuts.push_back(ShardCut{1, 1, q, li.feature_stride});
    w.cuts.push_back(ShardCut{1, 1, q, 1});  // the weight index i
    (void)lo;
    b = feature_spec({out}, 0, 1 - orient, groups);
  } else {
    w = feature_spec({out, in}, 0, 0, groups);  // output features a
    w.cuts.push_back(ShardCut{1, 1, q, q});     // input features b
    b = feature_spec({out}, 0, 0, groups);
  }
  return {w, b};
}

void TensorParallel::count(TpGroup g, int64_t bytes) {
  comm_bytes_ += bytes;
  CommCount& c = by_group_[tp_group_name(g)];
  ++c.ops;
  c.bytes += bytes;
}

TensorParallel::Pending TensorParallel::all_reduce_start(TpGroup g, const Tensor& t) {
  dist::Communicator& c = group(g);
  Pending p;
  p.dtype = t.dtype();
  p.result = !t.is_cuda() && is_half(t.dtype()) ? t.to(DType::F32) : t.clone();
  if (c.size() == 1) return p;
  const double tc = profile_start(t);
  count(g, static_cast<int64_t>(t.nbytes()));
  p.work = c.all_reduce_async(p.result, dist::ReduceOp::Sum);
  profile_end(p.work.get(), t, tc);
  return p;
}

Tensor TensorParallel::all_gather(TpGroup g, const Tensor& part,
                                  const std::vector<int64_t>& counts) {
  dist::Communicator& c = group(g);
  CAI_CHECK(static_cast<int>(counts.size()) == c.size() && counts[c.rank()] == part.numel(),
            "[tensor_parallel] all_gather over {} ({} members): {} counts, this member's {} "
            "elements",
            tp_group_name(g), c.size(), counts.size(), part.numel());
  int64_t total = 0;
  for (int64_t n : counts) total += n;
  Tensor out = Tensor::empty({total}, part.dtype(), part.device());
  if (c.size() == 1) {
    out.copy_from(part.reshape({part.numel()}));
    return out;
  }
  const double tc = profile_start(part);
  count(g, total * static_cast<int64_t>(dtype_size(part.dtype())));
  auto w = c.all_gather_async(part.reshape({part.numel()}), out, counts);
  profile_end(w.get(), part, tc);
  complete(std::move(w));
  return out;
}

TensorParallel::Pending TensorParallel::reduce_scatter_start(TpGroup g, const Tensor& staged,
                                                             const std::vector<int64_t>& counts) {
  dist::Communicator& c = group(g);
  int64_t total = 0;
  for (int64_t n : counts) total += n;
  CAI_CHECK(static_cast<int>(counts.size()) == c.size() && total == staged.numel(),
            "[tensor_parallel] reduce_scatter over {} ({} members): {} counts summing to {}, "
            "input of {} elements",
            tp_group_name(g), c.size(), counts.size(), total, staged.numel());
  Pending p;
  p.dtype = staged.dtype();
  const Tensor in = !staged.is_cuda() && is_half(staged.dtype()) ? staged.to(DType::F32) : staged;
  if (c.size() == 1) {
    p.result = in.reshape({in.numel()}).clone();
    return p;
  }
  p.result = Tensor::empty({counts[c.rank()]}, in.dtype(), in.device());
  const double tc = profile_start(in);
  count(g, static_cast<int64_t>(staged.nbytes()));
  p.work = c.reduce_scatter_async(in.reshape({in.numel()}), p.result, counts, dist::ReduceOp::Sum);
  profile_end(p.work.get(), in, tc);
  return p;
}

TensorParallel::Pending TensorParallel::broadcast_start(TpGroup g, const Tensor& t, int root) {
  dist::Communicator& c = group(g);
  Pending p;
  p.dtype = t.dtype();
  p.result = t;
  if (c.size() == 1) return p;
  const double tc = profile_start(t);
  count(g, static_cast<int64_t>(t.nbytes()));
  p.work = c.broadcast_async(p.result, root);
  profile_end(p.work.get(), t, tc);
  return p;
}

std::pair<int64_t, int64_t> TensorParallel::token_range(int64_t tokens, int r) const {
  CAI_CHECK(tokens >= size_,
            "[tensor_parallel] sequence parallelism over {} ranks needs at least as many tokens, "
            "got {}",
            size_, tokens);
  return {tokens * r / size_, tokens * (r + 1) / size_};
}

TensorParallel::SeqPart TensorParallel::seq_part(int64_t batch, int64_t tokens, int r) const {
  SeqPart p;
  if (batch % size_ == 0) {
    const int64_t each = batch / size_;
    p.by_samples = true;
    p.s0 = each * r, p.s1 = each * (r + 1), p.t0 = 0, p.t1 = tokens;
  } else {
    const auto [t0, t1] = token_range(tokens, r);
    p.s0 = 0, p.s1 = batch, p.t0 = t0, p.t1 = t1;
  }
  return p;
}

TensorParallel::SeqPart TensorParallel::seq_part_of(const Tensor& part, int64_t tokens) const {
  CAI_CHECK(part.dim() == 3,
            "[tensor_parallel] a sequence-parallel part is [batch, tokens, features], got {}",
            part.str());
  const bool whole_tokens = part.size(1) == tokens;
  const SeqPart p = my_seq_part(whole_tokens ? part.size(0) * size_ : part.size(0), tokens);
  CAI_CHECK(
      p.by_samples == whole_tokens && p.samples() == part.size(0) && p.tokens() == part.size(1),
      "[tensor_parallel] rank {} of {}: {} is not its sequence-parallel part of {} tokens "
      "(a batch divisible by {} is cut by samples, else every sample's tokens are)",
      rank_, size_, part.str(), tokens, size_);
  return p;
}

std::pair<int64_t, int64_t> TensorParallel::feature_range(int64_t features, int r) const {
  CAI_CHECK(features % size_ == 0,
            "[tensor_parallel] {} features are not divisible by the tensor-parallel size {}",
            features, size_);
  const int64_t n = features / size_;
  return {n * r, n * (r + 1)};
}

void TensorParallel::complete(std::unique_ptr<dist::Work> w) {
  pending_.add(std::move(w));
}

void TensorParallel::drain() {
  pending_.drain();
}

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

double TensorParallel::profile_start(const Tensor& t) {
  if (!profiling_) return 0;
  if (t.is_cuda()) kernels::cuda::synchronize();
  return now_s();
}

void TensorParallel::profile_end(dist::Work* w, const Tensor& t, double t0) {
  if (!profiling_) return;
  if (w) w->wait();
  if (t.is_cuda()) kernels::cuda::synchronize();
  comm_seconds_ += now_s() - t0;
}

TensorParallel::Pending TensorParallel::all_reduce_start(const Tensor& t) {
  Pending p;
  p.dtype = t.dtype();
  p.result = !t.is_cuda() && is_half(t.dtype()) ? t.to(DType::F32) : t;
  const double tc = profile_start(t);
  if (size_ > 1) {
    count(TpGroup::All, static_cast<int64_t>(t.nbytes()));
    p.work = comm_.all_reduce_async(p.result, dist::ReduceOp::Sum);
  }
  profile_end(p.work.get(), t, tc);
  return p;
}

Tensor TensorParallel::finish(Pending p) {
  if (p.work) complete(std::move(p.work));
  return p.result.dtype() == p.dtype ? p.result : p.result.to(p.dtype);
}

bool TensorParallel::padded_staging(const Tensor& t) const {
  return pad_staging_ || t.is_cuda();
}

namespace {
// dst (flat) = src's elements (same dtype and device): one copy, asynchronous on a GPU.
void copy_flat(Tensor& dst, const Tensor& src) {
  Tensor d = dst.reshape({1, dst.numel(), 1});
  ops::copy_tokens_(d, 0, src.reshape({1, src.numel(), 1}), 0, src.numel());
}
}  // namespace

TensorParallel::TokenGather TensorParallel::gather_tokens_start(const Tensor& part,
                                                                int64_t tokens) {
  const SeqPart sp = seq_part_of(part, tokens);
  TokenGather g;
  g.batch = sp.by_samples ? part.size(0) * size_ : part.size(0);
  g.tokens = tokens, g.features = part.size(2);
  g.by_samples = sp.by_samples;
  g.p.dtype = part.dtype();
  if (size_ == 1) {
    g.p.result = part;
    return g;
  }
  const bool widen = !part.is_cuda() && is_half(part.dtype());
  const Tensor in = widen ? part.to(DType::F32) : part;
  std::vector<int64_t> counts = token_counts(g.batch, tokens, g.features);
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  Tensor src = in.reshape({in.numel()});
  if (g.by_samples) {
    // Every rank's samples are one contiguous block of [B, N, F]: gathered in place.
    g.p.result = Tensor::empty({total}, in.dtype(), in.device());
  } else {
    g.padded = padded_staging(in);
    if (g.padded) {
      // Every rank's block as long as the largest (an even-count collective: NCCL moves it with
      // no staging of its own); a part shorter than that is copied into a padded buffer first.
      const int64_t most = *std::max_element(counts.begin(), counts.end());
      if (src.numel() != most) {
        Tensor padded = Tensor::empty({most}, in.dtype(), in.device());
        Tensor head = padded.narrow(0, src.numel());
        copy_flat(head, src);
        src = padded;
      }
      counts.assign(size_, most);
    }
    g.p.result =
        Tensor::empty({kernels::staged_numel(g.batch, tokens, g.features, size_, g.padded)},
                      in.dtype(), in.device());  // staged, rank by rank
  }
  const double tc = profile_start(in);
  count(TpGroup::All, total * static_cast<int64_t>(dtype_size(part.dtype())));
  g.p.work = comm_.all_gather_async(src, g.p.result, counts);
  profile_end(g.p.work.get(), in, tc);
  return g;
}

Tensor TensorParallel::gather_tokens_finish(TokenGather g) {
  if (size_ == 1) return g.p.result;
  if (g.p.work) complete(std::move(g.p.work));
  const Tensor& staged = g.p.result;
  Tensor full;
  if (g.by_samples) {
    full = staged.reshape({g.batch, g.tokens, g.features});
  } else {
    full = Tensor::empty({g.batch, g.tokens, g.features}, staged.dtype(), staged.device());
    ops::tokens_from_ranks_(full, staged, size_, g.padded);
  }
  return full.dtype() == g.p.dtype ? full : full.to(g.p.dtype);
}

std::vector<int64_t> TensorParallel::token_counts(int64_t batch, int64_t tokens,
                                                  int64_t features) const {
  std::vector<int64_t> counts(size_);
  for (int r = 0; r < size_; ++r) {
    const SeqPart p = seq_part(batch, tokens, r);
    counts[r] = p.samples() * p.tokens() * features;
  }
  return counts;
}

TensorParallel::Pending TensorParallel::reduce_scatter_tokens_start(const Tensor& full) {
  CAI_CHECK(full.dim() == 3,
            "[tensor_parallel] reduce_scatter_tokens expects [batch, tokens, features], got {}",
            full.str());
  Pending p;
  p.dtype = full.dtype();
  if (size_ == 1) {
    p.result = full;
    return p;
  }
  const int64_t b = full.size(0), tokens = full.size(1), f = full.size(2);
  const Tensor in = !full.is_cuda() && is_half(full.dtype()) ? full.to(DType::F32) : full;
  std::vector<int64_t> counts = token_counts(b, tokens, f);
  const int64_t mine = counts[rank_];
  const SeqPart sp = my_seq_part(b, tokens);
  Tensor staged, flat;
  if (sp.by_samples) {
    // Every rank's samples are one contiguous block of [B, N, F]: reduced in place.
    staged = in.reshape({in.numel()});
    flat = Tensor::empty({mine}, in.dtype(), in.device());
  } else {
    const bool padded = padded_staging(in);
    staged = Tensor::empty({kernels::staged_numel(b, tokens, f, size_, padded)}, in.dtype(),
                           in.device());
    ops::tokens_to_ranks_(staged, in, size_, padded);
    // Padded: the sum of this rank's block lands in a buffer as long as the largest block, and
    // the result is its head (a view: no copy out).
    if (padded) counts.assign(size_, *std::max_element(counts.begin(), counts.end()));
    flat = Tensor::empty({counts[rank_]}, in.dtype(), in.device());
  }
  p.result = flat.narrow(0, mine).reshape({sp.samples(), sp.tokens(), f});
  const double tc = profile_start(in);
  count(TpGroup::All, static_cast<int64_t>(full.nbytes()));
  p.work = comm_.reduce_scatter_async(staged, flat, counts, dist::ReduceOp::Sum);
  profile_end(p.work.get(), in, tc);
  return p;
}

Tensor TensorParallel::slice_tokens(const Tensor& full) const {
  CAI_CHECK(full.dim() == 3,
            "[tensor_parallel] slice_tokens expects [batch, tokens, features], "
            "got {}",
            full.str());
  const SeqPart sp = my_seq_part(full.size(0), full.size(1));
  if (sp.by_samples) return full.narrow(sp.s0, sp.samples()).clone();
  Tensor out =
      Tensor::empty({full.size(0), sp.tokens(), full.size(2)}, full.dtype(), full.device());
  ops::copy_tokens_(out, 0, full, sp.t0, sp.tokens());
  return out;
}

Tensor TensorParallel::pad_tokens(const Tensor& part, int64_t tokens) const {
  const SeqPart sp = seq_part_of(part, tokens);
  const int64_t batch = sp.by_samples ? part.size(0) * size_ : part.size(0);
  Tensor full = Tensor::zeros({batch, tokens, part.size(2)}, part.dtype(), part.device());
  if (sp.by_samples) {
    Tensor mine = full.narrow(sp.s0, sp.samples());
    mine.copy_from(part);
  } else {
    ops::copy_tokens_(full, sp.t0, part, 0, sp.tokens());
  }
  return full;
}

Tensor TensorParallel::slice_features(const Tensor& x) const {
  CAI_CHECK(x.dim() == 2, "[tensor_parallel] slice_features expects [rows, features], got {}",
            x.str());
  const int64_t rows = x.size(0), f = x.size(1);
  const auto [c0, c1] = feature_range(f, rank_);
  Tensor out = Tensor::empty({rows, c1 - c0}, x.dtype(), x.device());
  Tensor o3 = out.reshape({rows, c1 - c0, 1});
  ops::copy_tokens_(o3, 0, x.reshape({rows, f, 1}), c0, c1 - c0);
  return out;
}

Tensor TensorParallel::gather_features(const Tensor& part) {
  CAI_CHECK(part.dim() == 2, "[tensor_parallel] gather_features expects [rows, features], got {}",
            part.str());
  if (size_ == 1) return part;
  const int64_t rows = part.size(0), n = part.size(1), f = n * size_;
  const bool widen = !part.is_cuda() && is_half(part.dtype());
  const Tensor in = widen ? part.to(DType::F32) : part;
  Tensor staged = Tensor::empty({rows * f}, in.dtype(), in.device());
  const double tc = profile_start(in);
  count(TpGroup::All, rows * f * static_cast<int64_t>(dtype_size(part.dtype())));
  auto w = comm_.all_gather_async(in.reshape({in.numel()}), staged,
                                  std::vector<int64_t>(size_, rows * n));
  profile_end(w.get(), in, tc);
  complete(std::move(w));
  // Rank-major [rank][rows][n] -> [rows, f]: the token permutation with the features as tokens.
  Tensor full = Tensor::empty({rows, f, 1}, in.dtype(), in.device());
  ops::tokens_from_ranks_(full, staged, size_, false);
  Tensor out = full.reshape({rows, f});
  return widen ? out.to(part.dtype()) : out;
}

Tensor row_linear_fwd(TensorParallel* tp, const Tensor& x, Linear& l) {
  const bool split = tp && tp->size() > 1;
  Tensor y = ops::linear_fwd(x, l.w(), !split || tp->rank() == 0 ? &l.b() : nullptr);
  if (!split) return y;
  return tp->sequence_parallel() ? tp->reduce_scatter_tokens(y) : tp->all_reduce(y);
}

Tensor column_linear_bwd(TensorParallel* tp, const Tensor& x_in, Linear& l, const Tensor& dy,
                         bool bias_grad, WeightGrads* wg, TensorParallel::TokenGather* x_gather) {
  WeightGrads now{ForwardCtx{}};
  WeightGrads& w_grads = wg ? *wg : now;
  const bool split = tp && tp->size() > 1;
  CAI_CHECK(!x_gather || split,
            "[{}] column_linear_bwd: an input still being gathered needs a tensor-parallel group",
            l.weight.name);
  if (!split) return linear_bwd(w_grads, x_in, l.w(), dy, &l.weight, bias_grad ? &l.bias : nullptr);
  if (!x_gather) {
    Shape want = x_in.shape();
    if (!want.empty()) want.back() = l.w().size(0);
    CAI_CHECK(x_in.dim() >= 1 && dy.shape() == want, "[{}] grad {} does not match input {}",
              l.weight.name, dy.str(), x_in.str());
  }
  // The weight and the output gradient in the compute dtype once for both halves (linear_bwd
  // would round them again for each).
  const DType xt = x_gather ? x_gather->p.dtype : x_in.dtype();
  const Tensor w = xt == DType::F32 || l.w().dtype() == xt ? l.w() : l.w().to(xt);
  const Tensor g = dy.dtype() == xt ? dy : dy.to(xt);
  Tensor dx = ops::linear_bwd_input(w, g, xt);
  auto pending =
      tp->sequence_parallel() ? tp->reduce_scatter_tokens_start(dx) : tp->all_reduce_start(dx);
  // The input (re-gathered: waited for here, after the input gradient's GEMM) for the weight's.
  const Tensor x = x_gather ? tp->gather_tokens_finish(std::move(*x_gather)) : x_in;
  w_grads.run([x, g, &l, bias_grad] {
    ops::linear_bwd_weight(x, g, &l.weight.grad, bias_grad ? &l.bias.grad : nullptr);
  });
  return tp->finish(std::move(pending));
}

namespace {
struct LinearCache : Cache {
  Tensor x;
};
}  // namespace

ParallelLinear::ParallelLinear(const std::string& name, int64_t in, int64_t out, Kind kind,
                               TensorParallel* tp, int orient)
    : name_(name), kind_(kind), tp_(tp), orient_(orient) {
  const int T = tp ? tp->size() : 1, r = tp ? tp->rank() : 0;
  CAI_CHECK(kind == Kind::Whole || !tp || !tp->sequence_parallel(),
            "[{}] ParallelLinear has no sequence-parallel form", name);
  CAI_CHECK((kind == Kind::Nd) == (tp && tp->nd()) || kind == Kind::Whole,
            "[{}] ParallelLinear kind Nd is for the 2d, 2.5d and 3d modes (tp is {})", name,
            tp ? tp->describe() : std::string("none"));
  if (kind == Kind::Nd) {
    const auto [w, b] = tp->linear_specs(in, out, orient);
    lin = Linear::sharded(name, in, out, w, b);
  } else if (kind == Kind::Column)
    lin = Linear::column(name, in, out, r, T);
  else if (kind == Kind::Row)
    lin = Linear::row(name, in, out, r, T);
  else
    lin = Linear(name, in, out);
}

Tensor ParallelLinear::forward(const Tensor& x, std::unique_ptr<Cache>& cache, const ForwardCtx&) {
  auto c = std::make_unique<LinearCache>();
  c->x = x;
  Tensor y = kind_ == Kind::Nd    ? nd_linear_fwd(*tp_, x, lin, orient_)
             : kind_ == Kind::Row ? row_linear_fwd(tp_, x, lin)
                                  : ops::linear_fwd(x, lin.weight.value, &lin.bias.value);
  cache = std::move(c);
  return y;
}

Tensor ParallelLinear::backward(const Tensor& dy, std::unique_ptr<Cache>& cache,
                                const ForwardCtx& ctx) {
  auto* c = dynamic_cast<LinearCache*>(cache.get());
  CAI_CHECK(c, "[{}] backward called without a matching forward cache", name_);
  // Nd keeps a combined backward (its weight gradients are all-reduced inside): all in B.
  WeightGrads wg(kind_ == Kind::Nd ? ForwardCtx{} : ctx);
  Tensor dx = kind_ == Kind::Nd ? nd_linear_bwd(*tp_, c->x, lin, dy, orient_)
              : kind_ == Kind::Column
                  ? column_linear_bwd(tp_, c->x, lin, dy, true, &wg)
                  : linear_bwd(wg, c->x, lin.weight.value, dy, &lin.weight, &lin.bias);
  wg.finish(cache);
  return dx;
}

}  // namespace cai::nn
