// In-process Communicator for unit tests: n ranks are n threads sharing one Group. Collectives
// match by call order (each rank's k-th collective meets the others' k-th); inputs are copied at
// the call, results computed when the last rank arrives, delivered at wait(). CUDA and half
// tensors are staged through fp32 host copies (reduced in fp32, rounded once on the way back), so
// tensor-parallel layers can be tested on one GPU with several threads.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>

#include "cai/core/error.h"
#include "cai/dist/communicator.h"

namespace cai::dist {

namespace {

struct Group;

struct Collective {
  std::string op;
  int arrived = 0, departed = 0;
  std::vector<std::vector<float>> inputs;
  std::vector<int64_t> ints;                   // split: (color, key) per rank
  std::vector<std::shared_ptr<Group>> groups;  // split: each rank's new group
  std::vector<int> new_ranks;
  bool ready = false;
};

struct Group {
  explicit Group(int n, std::string nm, double t) : size(n), name(std::move(nm)), timeout(t) {}
  int size;
  std::string name;
  double timeout;
  std::mutex m;
  std::condition_variable cv;
  std::map<uint64_t, Collective> colls;
  std::map<std::tuple<int, int, int>, std::deque<std::vector<float>>> mail;  // (src, dst, tag)
};

std::vector<float> copy_in(const Tensor& t) {
  CAI_CHECK(t.dtype() != DType::I32,
            "[fake] the in-process communicator moves float tensors, got {}", t.str());
  if (t.is_cuda() || t.dtype() != DType::F32) return t.to_vector();
  const float* p = t.data<float>();
  return std::vector<float>(p, p + t.numel());
}

void copy_out(const std::vector<float>& v, size_t off, Tensor& t) {
  CAI_CHECK(off + static_cast<size_t>(t.numel()) <= v.size(), "[fake] result size mismatch");
  if (!t.is_cuda() && t.dtype() == DType::F32) {
    std::memcpy(t.data<float>(), v.data() + off, sizeof(float) * t.numel());
    return;
  }
  const std::vector<float> part(v.begin() + static_cast<std::ptrdiff_t>(off),
                                v.begin() + static_cast<std::ptrdiff_t>(off + t.numel()));
  t.copy_from(Tensor::from_vector(part, t.shape()).to(t.dtype()).to(t.device()));
}

float reduce(float a, float b, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return a + b;
    case ReduceOp::Max:
      return std::max(a, b);
    case ReduceOp::Min:
      return std::min(a, b);
  }
  return a;
}

class FakeWork : public Work {
 public:
  explicit FakeWork(std::function<bool(bool)> step) : step_(std::move(step)) {}
  void wait() override {
    if (!done_) done_ = step_(true);
  }
  bool test() override {
    if (!done_) done_ = step_(false);
    return done_;
  }

 private:
  std::function<bool(bool)> step_;  // (block) -> completed
  bool done_ = false;
};

class FakeCommunicator : public Communicator {
 public:
  FakeCommunicator(std::shared_ptr<Group> g, int rank) : g_(std::move(g)), rank_(rank) {
    timeout_ = g_->timeout;
  }
  int rank() const override { return rank_; }
  int size() const override { return g_->size; }
  std::string name() const override { return g_->name; }
  bool supports(Device) const override { return true; }  // staged through the host

  // Deposits this rank's input for collective #seq; `finish` runs on the completed collective.
  std::unique_ptr<Work> collective(const std::string& op, std::vector<float> input,
                                   std::function<void(Collective&)> compute,
                                   std::function<void(Collective&)> finish, int64_t int_value = 0) {
    const uint64_t seq = seq_++;
    {
      std::lock_guard<std::mutex> l(g_->m);
      Collective& c = g_->colls[seq];
      if (c.inputs.empty()) {
        c.op = op;
        c.inputs.resize(g_->size);
        c.ints.resize(g_->size);
      }
      CAI_CHECK(c.op == op,
                "[fake] rank {} called {} while other ranks of group '{}' called {} (call #{})",
                rank_, op, g_->name, c.op, seq);
      c.inputs[rank_] = std::move(input);
      c.ints[rank_] = int_value;
      if (++c.arrived == g_->size) {
        compute(c);
        c.ready = true;
        g_->cv.notify_all();
      }
    }
    auto g = g_;
    const int r = rank_;
    const double timeout = timeout_;
    return std::make_unique<FakeWork>([g, seq, finish, op, r, timeout](bool block) {
      std::unique_lock<std::mutex> l(g->m);
      Collective& c = g->colls[seq];
      if (!c.ready) {
        if (!block) return false;
        const bool ok = g->cv.wait_for(l, std::chrono::duration<double>(timeout),
                                       [&] { return g->colls[seq].ready; });
        if (!ok)
          fail(
              "[fake] {} on group '{}' ({} ranks, rank {}) did not complete within {} s: {} of "
              "{} ranks arrived",
              op, g->name, g->size, r, timeout, g->colls[seq].arrived, g->size);
      }
      Collective& done = g->colls[seq];
      finish(done);
      if (++done.departed == g->size) g->colls.erase(seq);
      return true;
    });
  }

  std::unique_ptr<Work> all_reduce_async(Tensor& t, ReduceOp op) override {
    Tensor out = t;
    const int r = rank_;
    return collective(
        "all_reduce", copy_in(t),
        [op](Collective& c) {
          for (size_t i = 1; i < c.inputs.size(); ++i)
            for (size_t j = 0; j < c.inputs[0].size(); ++j)
              c.inputs[0][j] = reduce(c.inputs[0][j], c.inputs[i][j], op);
        },
        [out, r](Collective& c) mutable {
          copy_out(c.inputs[0], 0, out);
          (void)r;
        });
  }

  std::unique_ptr<Work> reduce_scatter_async(const Tensor& in, Tensor& out,
                                             const std::vector<int64_t>& counts,
                                             ReduceOp op) override {
    CAI_CHECK(static_cast<int>(counts.size()) == size(), "[fake] reduce_scatter needs {} counts",
              size());
    int64_t off = 0;
    for (int i = 0; i < rank_; ++i) off += counts[i];
    Tensor o = out;
    return collective(
        "reduce_scatter", copy_in(in),
        [op](Collective& c) {
          for (size_t i = 1; i < c.inputs.size(); ++i)
            for (size_t j = 0; j < c.inputs[0].size(); ++j)
              c.inputs[0][j] = reduce(c.inputs[0][j], c.inputs[i][j], op);
        },
        [o, off](Collective& c) mutable { copy_out(c.inputs[0], static_cast<size_t>(off), o); });
  }

  std::unique_ptr<Work> all_gather_async(const Tensor& in, Tensor& out,
                                         const std::vector<int64_t>&) override {
    Tensor o = out;
    return collective(
        "all_gather", copy_in(in), [](Collective&) {},
        [o](Collective& c) mutable {
          std::vector<float> all;
          for (const auto& v : c.inputs) all.insert(all.end(), v.begin(), v.end());
          copy_out(all, 0, o);
        });
  }

  std::unique_ptr<Work> broadcast_async(Tensor& t, int root) override {
    Tensor o = t;
    return collective(
        "broadcast", copy_in(t), [](Collective&) {},
        [o, root](Collective& c) mutable { copy_out(c.inputs[root], 0, o); });
  }

  std::unique_ptr<Work> send_async(const Tensor& t, int peer, int tag) override {
    std::lock_guard<std::mutex> l(g_->m);
    g_->mail[{rank_, peer, tag}].push_back(copy_in(t));
    g_->cv.notify_all();
    return std::make_unique<FakeWork>([](bool) { return true; });
  }

  std::unique_ptr<Work> recv_async(Tensor& t, int peer, int tag) override {
    auto g = g_;
    const int r = rank_;
    const double timeout = timeout_;
    Tensor o = t;
    return std::make_unique<FakeWork>([g, r, peer, tag, o, timeout](bool block) mutable {
      std::unique_lock<std::mutex> l(g->m);
      auto& q = g->mail[{peer, r, tag}];
      if (q.empty()) {
        if (!block) return false;
        if (!g->cv.wait_for(l, std::chrono::duration<double>(timeout), [&] {
              return !g->mail[{peer, r, tag}].empty();
            }))
          fail("[fake] recv from {} (tag {}) on group '{}' (rank {}) did not complete within {} s",
               peer, tag, g->name, r, timeout);
      }
      auto& q2 = g->mail[{peer, r, tag}];
      copy_out(q2.front(), 0, o);
      q2.pop_front();
      return true;
    });
  }

  double all_reduce_scalar(double v, ReduceOp op) override {
    // The double travels bit for bit in two float slots; reduced in double.
    std::vector<float> bits(2);
    std::memcpy(bits.data(), &v, sizeof(double));
    double out = 0;
    collective(
        "all_reduce(scalar)", bits,
        [op](Collective& c) {
          double acc = 0;
          for (size_t i = 0; i < c.inputs.size(); ++i) {
            double x;
            std::memcpy(&x, c.inputs[i].data(), sizeof(double));
            acc = i == 0                ? x
                  : op == ReduceOp::Sum ? acc + x
                  : op == ReduceOp::Max ? std::max(acc, x)
                                        : std::min(acc, x);
          }
          std::memcpy(c.inputs[0].data(), &acc, sizeof(double));
        },
        [&out](Collective& c) { std::memcpy(&out, c.inputs[0].data(), sizeof(double)); })
        ->wait();
    return out;
  }

  void barrier() override {
    collective(
        "barrier", {}, [](Collective&) {}, [](Collective&) {})
        ->wait();
  }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    std::shared_ptr<Group> mine;
    int new_rank = 0;
    const double timeout = timeout_;
    const int64_t ck = (static_cast<int64_t>(color) << 32) | static_cast<uint32_t>(key);
    collective(
        "split", {},
        [name, timeout](Collective& c) {
          // Ranks with one color form a group ordered by (key, old rank).
          const int n = static_cast<int>(c.ints.size());
          c.groups.resize(n);
          c.new_ranks.resize(n);
          std::map<int32_t, std::vector<std::pair<int32_t, int>>> by_color;
          for (int i = 0; i < n; ++i)
            by_color[static_cast<int32_t>(c.ints[i] >> 32)].push_back(
                {static_cast<int32_t>(c.ints[i] & 0xffffffff), i});
          for (auto& [col, members] : by_color) {
            std::sort(members.begin(), members.end());
            auto g = std::make_shared<Group>(static_cast<int>(members.size()), name, timeout);
            for (size_t j = 0; j < members.size(); ++j) {
              c.groups[members[j].second] = g;
              c.new_ranks[members[j].second] = static_cast<int>(j);
            }
          }
        },
        [&, r = rank_](Collective& c) {
          mine = c.groups[r];
          new_rank = c.new_ranks[r];
        },
        ck)
        ->wait();
    return std::make_unique<FakeCommunicator>(mine, new_rank);
  }

 private:
  std::shared_ptr<Group> g_;
  int rank_;
  uint64_t seq_ = 0;
};

class SingleCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "single"; }
  bool supports(Device) const override { return true; }  // copies only, on any device
  std::unique_ptr<Work> done() {
    return std::make_unique<FakeWork>([](bool) { return true; });
  }
  std::unique_ptr<Work> all_reduce_async(Tensor&, ReduceOp) override { return done(); }
  std::unique_ptr<Work> reduce_scatter_async(const Tensor& in, Tensor& out,
                                             const std::vector<int64_t>&, ReduceOp) override {
    out.copy_from(in.reshape(out.shape()));
    return done();
  }
  std::unique_ptr<Work> all_gather_async(const Tensor& in, Tensor& out,
                                         const std::vector<int64_t>&) override {
    out.copy_from(in.reshape(out.shape()));
    return done();
  }
  std::unique_ptr<Work> broadcast_async(Tensor&, int) override { return done(); }
  std::unique_ptr<Work> send_async(const Tensor&, int peer, int) override {
    fail("[single] send to {}: a one-rank group has no peers", peer);
  }
  std::unique_ptr<Work> recv_async(Tensor&, int peer, int) override {
    fail("[single] recv from {}: a one-rank group has no peers", peer);
  }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int, const std::string&) override {
    return std::make_unique<SingleCommunicator>();
  }
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_fake_group(int n, double timeout_seconds) {
  CAI_CHECK(n >= 1, "[fake] group size {} must be positive", n);
  auto g = std::make_shared<Group>(n, "fake", timeout_seconds);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int i = 0; i < n; ++i) out.push_back(std::make_unique<FakeCommunicator>(g, i));
  return out;
}

std::unique_ptr<Communicator> make_single() {
  return std::make_unique<SingleCommunicator>();
}

}  // namespace cai::dist
