// `colossalai benchmark --calibrate`'s communication measurements (calibrate.h): collectives per
// message size and group, compute beside a collective (overlap), and ranks computing at once and
// their waits' naps (contention). The kernels and the run itself stay in calibrate.cpp.
#include "calibrate.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "cai/config/config.h"
#include "cai/core/error.h"
#include "cai/core/host_memory.h"
#include "cai/core/rng.h"
#include "cai/dist/communicator.h"
#include "cai/dist/launch.h"
#include "cai/dist/nccl.h"
#include "cai/nn/module.h"
#include "cai/nn/vit.h"
#include "cai/ops/ops.h"
#include "cai/optim/optimizer.h"
#include "cai/plan/plan.h"
#include "calibrate_internal.h"
#include "kernels/cpu/parallel.h"
#include "kernels/device.h"

namespace cai::app {

using namespace detail;

namespace {

// Seconds per call of f, which every member of `comm` runs: warm twice, one call to size the
// repetitions (the same count on every member: 20 ms, at least 5 and at most 50 calls), each call
// timed on every member; the median over the calls of the slowest member's time (a call the
// host's scheduler interrupted does not move it, as it would a mean).
double time_collective(dist::Communicator& comm, const std::function<void()>& f) {
  f();
  f();
  comm.barrier();
  auto t0 = Clock::now();
  f();
  const double first = comm.all_reduce_scalar(seconds_since(t0), dist::ReduceOp::Max);
  const int n = std::clamp(static_cast<int>(std::ceil(0.02 / std::max(first, 1e-7))), 5, 50);
  std::vector<float> each(n);
  comm.barrier();
  for (int k = 0; k < n; ++k) {
    t0 = Clock::now();
    f();
    each[k] = static_cast<float>(seconds_since(t0));
  }
  Tensor t = Tensor::from_vector(each, {n});  // a CPU tensor: every backend serves those
  comm.all_reduce(t, dist::ReduceOp::Max);
  std::vector<float> v = t.to_vector();
  std::nth_element(v.begin(), v.begin() + n / 2, v.end());
  return v[n / 2];
}

// Element counts per member of a buffer of `elements` split over g members (the first ones one
// more when it does not divide), as the trainer's uneven ZeRO chunks.
std::vector<int64_t> split_counts(int64_t elements, int g) {
  std::vector<int64_t> c(g, elements / g);
  for (int r = 0; r < elements % g; ++r) ++c[r];
  return c;
}

}  // namespace

std::vector<double> calibration_message_sizes(double params, double activation_elements) {
  const double top = 4.0 * std::max(params, activation_elements);
  std::vector<double> v;
  for (double b = 64;; b *= 2) {
    v.push_back(b);
    if (b >= top) break;
  }
  return v;
}

std::vector<CollectiveTiming> time_collectives(dist::Communicator& world,
                                               const std::vector<double>& sizes, bool cuda,
                                               int cuda_device, const dist::P2POptions& p2p) {
  const int N = world.size(), me = world.rank();
  const Device dev = cuda ? Device::cuda(cuda_device) : Device::cpu();
  auto buffer = [&](int64_t n) {
    return Tensor::zeros({std::max<int64_t>(n, 1)}, DType::F32, dev);
  };
  std::vector<CollectiveTiming> out;
  const auto t0 = Clock::now();
  for (int g = 2; g <= N; ++g) {
    // The first g ranks (consecutive: one node's GPUs first, as the launcher places them); the
    // others form a group of their own and wait.
    auto sub = world.split(me < g ? 0 : 1, me, fmt::format("calibrate[{}]", g));
    sub->set_timeout(world.timeout());
    if (me < g) {
      dist::Communicator& c = *sub;
      for (const char* op : {"all_reduce", "reduce_scatter", "all_gather", "broadcast"}) {
        const std::string name = op;
        for (double bytes : sizes) {
          const int64_t elems = static_cast<int64_t>(bytes) / 4;
          if (elems < g) continue;  // every member gets at least one element
          const std::vector<int64_t> counts = split_counts(elems, g);
          Tensor full = buffer(elems), part = buffer(counts[c.rank()]);
          std::function<void()> f;
          if (name == "all_reduce")
            f = [&] { c.all_reduce(full); };
          else if (name == "reduce_scatter")
            f = [&] { c.reduce_scatter(full, part, counts); };
          else if (name == "all_gather")
            f = [&] { c.all_gather(part, full, counts); };
          else
            f = [&] { c.broadcast(full, 0); };
          out.push_back({name, g, bytes, time_collective(c, f)});
        }
        if (me == 0)
          std::cerr << fmt::format("[calibrate] {} over {} ranks: {} sizes, {:.1f} s so far\n",
                                   name, g, sizes.size(), seconds_since(t0));
      }
      if (g == 2) {
        // p2p between ranks 0 and 1, one way: half a ping-pong.
        c.connect_p2p({{0, 1}, {1, 0}}, p2p);
        for (double bytes : sizes) {
          Tensor t = buffer(static_cast<int64_t>(bytes) / 4);
          const int peer = 1 - c.rank();
          const auto f = [&] {
            if (c.rank() == 0) {
              c.send(t, peer, 7);
              c.recv(t, peer, 8);
            } else {
              c.recv(t, peer, 7);
              c.send(t, peer, 8);
            }
          };
          out.push_back({"p2p", 2, bytes, time_collective(c, f) / 2});
        }
      }
    }
    world.barrier();
  }
  // Pairs as the meshes' rows and columns use them (CollectiveTiming::layout), all-reduces only.
  if (N >= 4 && N % 2 == 0) {
    struct Layout {
      const char* name;
      int color;      // the pair of this rank
      bool everyone;  // every pair runs, or the first only
    };
    for (const Layout& l :
         {Layout{"strided", me % (N / 2), false}, Layout{"strided_concurrent", me % (N / 2), true},
          Layout{"concurrent", me / 2, true}}) {
      auto pair = world.split(l.color, me, fmt::format("calibrate[{}]", l.name));
      pair->set_timeout(world.timeout());
      const bool runs = l.everyone || l.color == 0;
      for (double bytes : sizes) {
        const int64_t elems = static_cast<int64_t>(bytes) / 4;
        if (elems < 2) continue;
        Tensor full = buffer(elems);
        world.barrier();  // the pairs start together
        if (!runs) continue;
        const double t = time_collective(*pair, [&] { pair->all_reduce(full); });
        out.push_back({"all_reduce", 2, bytes, t, l.name});
      }
      world.barrier();
      if (me == 0)
        std::cerr << fmt::format(
            "[calibrate] all_reduce over pairs, {}: {} sizes, {:.1f} s so far\n", l.name,
            sizes.size(), seconds_since(t0));
    }
  }
  return out;
}

namespace {
// One real block of a model at a micro-batch size, whose forward + backward the sharing
// measurements (overlap, contention) time.
class OneBlock {
 public:
  OneBlock(const nn::ViTConfig& model, int64_t batch, Device dev, DType compute)
      : vc_(one_block(model)), m_(vc_) {
    m_.init(5);
    if (dev.is_cuda()) m_.to(dev);
    m_.set_compute_dtype(compute);
    x_ = randn({batch, vc_.num_patches() + 1, vc_.embed_dim}, DType::F32, dev, 50);
    std::unique_ptr<nn::Cache> cache;
    dy_ = randn(block().forward(x_, cache, ctx_).shape(), DType::F32, dev, 51);
  }
  void run() {
    std::unique_ptr<nn::Cache> k;
    block().forward(x_, k, ctx_);
    block().backward(dy_, k, ctx_);
  }

 private:
  static nn::ViTConfig one_block(nn::ViTConfig vc) {
    vc.depth = 1;
    return vc;
  }
  nn::Layer& block() { return *m_.layers().at(1); }
  nn::ViTConfig vc_;
  nn::ViT m_;
  Tensor x_, dy_;
  nn::ForwardCtx ctx_{true, 1, 0, 0};
};
}  // namespace

OverlapTiming time_overlap(dist::Communicator& comm, const nn::ViTConfig& model, int64_t batch,
                           DType compute, int cuda_device, const dist::P2POptions& p2p,
                           int posted_gemm_sm_margin) {
  const Device dev = Device::cuda(cuda_device);
  OneBlock one_block(model, batch, dev, compute);
  auto fb = [&] { one_block.run(); };
  OverlapTiming o;
  o.group = comm.size();
  o.bytes = 64.0 * (1 << 20);  // larger than DDP's 25 MiB buckets: fewer calls to cover the window
  Tensor buf = Tensor::zeros({static_cast<int64_t>(o.bytes) / 4}, DType::F32, dev);
  // One all-reduce alone, and the repetitions of the block that fill about 100 ms (the same
  // counts on every member).
  const double ar = time_collective(comm, [&] { comm.all_reduce(buf); });
  const double one = comm.all_reduce_scalar(time_it(fb, dev), dist::ReduceOp::Max);
  const int reps = std::clamp(static_cast<int>(std::ceil(0.1 / std::max(one, 1e-6))), 3, 200);
  const int calls =
      static_cast<int>(std::ceil(1.5 * reps * one / std::max(ar, 1e-6))) + 2;  // outlast them
  void* done = kernels::cuda::event_create();
  auto window = [&](bool beside) {
    kernels::cuda::synchronize();
    comm.barrier();
    std::vector<std::unique_ptr<dist::Work>> works;
    const auto t0 = Clock::now();
    if (beside)
      for (int k = 0; k < calls; ++k)
        works.push_back(comm.all_reduce_async(buf, dist::ReduceOp::Sum));
    for (int k = 0; k < reps; ++k) fb();
    kernels::cuda::event_record(done, nullptr);  // the blocks' end on the compute stream
    kernels::cuda::event_synchronize(done);
    const double s = seconds_since(t0) / reps;
    for (auto& w : works) w->wait();
    return comm.all_reduce_scalar(s, dist::ReduceOp::Max);
  };
  // Alone, beside, alone again: the alone time is their mean (the clocks move over a run).
  const double a1 = window(false);
  o.beside_s = window(true);
  o.alone_s = 0.5 * (a1 + window(false));
  // A posted receive: rank 1 times the blocks with a receive from rank 0 posted before them, whose
  // send rank 0 issues only after its own blocks (the receive's kernel waits through rank 1's
  // window), between two windows of rank 1 alone; at the batch and its halves down to a
  // sixteenth (at least 1), each with the repetitions that fill about 100 ms.
  if (comm.size() >= 2) {
    comm.connect_p2p({{0, 1}}, p2p);  // collective: every rank declares the pair
    o.p2p_max_ctas = p2p.max_ctas;
    o.gemm_sm_margin = posted_gemm_sm_margin;
    const int margin_was = kernels::cuda::gemm_sm_margin();
    kernels::cuda::set_gemm_sm_margin(posted_gemm_sm_margin);
    for (int64_t b = batch; b >= std::max<int64_t>(1, batch / 16); b /= 2) {
      // The config's batch is the block above (and its time `one`); the halves get their own.
      std::unique_ptr<OneBlock> half;
      if (b != batch) half = std::make_unique<OneBlock>(model, b, dev, compute);
      OneBlock& at = half ? *half : one_block;
      auto run = [&] { at.run(); };
      const double t1 = half ? comm.all_reduce_scalar(time_it(run, dev), dist::ReduceOp::Max) : one;
      const int n = std::clamp(static_cast<int>(std::ceil(0.1 / std::max(t1, 1e-6))), 3, 400);
      auto posted = [&](bool post) {
        kernels::cuda::synchronize();
        comm.barrier();
        std::unique_ptr<dist::Work> w;
        if (post && comm.rank() == 1) w = comm.recv_async(buf, 0, 9001);
        const auto t0 = Clock::now();
        if (comm.rank() <= 1)
          for (int k = 0; k < n; ++k) run();
        kernels::cuda::event_record(done, nullptr);
        kernels::cuda::event_synchronize(done);
        const double s = seconds_since(t0) / n;
        if (post && comm.rank() == 0) w = comm.send_async(buf, 1, 9001);
        if (w) w->wait();
        return comm.all_reduce_scalar(comm.rank() == 1 ? s : 0.0, dist::ReduceOp::Max);
      };
      OverlapTiming::Posted p;
      p.batch = b;
      const double p1 = posted(false);
      p.beside_s = posted(true);
      p.alone_s = 0.5 * (p1 + posted(false));
      o.posted.push_back(p);
      if (b == 1) break;
    }
    kernels::cuda::set_gemm_sm_margin(margin_was);
  }
  // Every GPU's speed under sustained load, all at once: each rank runs the block for at least
  // 3 s (the clocks settle at the power cap), then for at least 2 s more, timed, by its own clock
  // (no collective between: a barrier would leave the faster GPUs idle while the slowest
  // finishes, and their clocks would rise). Blocks in groups of 8 between synchronisations.
  {
    auto run_for = [&](double seconds, int64_t* blocks) {
      const auto t0 = Clock::now();
      int64_t n = 0;
      do {
        for (int k = 0; k < 8; ++k) fb();
        n += 8;
        kernels::cuda::event_record(done, nullptr);
        kernels::cuda::event_synchronize(done);
      } while (seconds_since(t0) < seconds);
      if (blocks) *blocks = n;
      return seconds_since(t0);
    };
    kernels::cuda::synchronize();
    comm.barrier();
    const double warm = run_for(3.0, nullptr);
    int64_t timed = 0;
    const double mine = run_for(2.0, &timed) / static_cast<double>(timed);
    o.gpu_sustain_s = comm.all_reduce_scalar(warm, dist::ReduceOp::Max);
    for (int q = 0; q < comm.size(); ++q)
      o.gpu_block_s.push_back(
          comm.all_reduce_scalar(q == comm.rank() ? mine : 0.0, dist::ReduceOp::Sum));
  }
  kernels::cuda::event_destroy(done);
  if (comm.rank() == 0) {
    std::string by_rank;
    for (double s : o.gpu_block_s)
      by_rank += fmt::format("{}{:.3f}", by_rank.empty() ? "" : " / ", 1e3 * s);
    std::cerr << fmt::format(
        "[calibrate] GPU speeds: one block's forward + backward on every rank at once, after "
        "{:.1f} s of the same: {} ms by rank\n",
        o.gpu_sustain_s, by_rank);
  }
  if (comm.rank() == 0) {
    std::string posted;
    for (const OverlapTiming::Posted& p : o.posted)
      posted += fmt::format("{}batch {}: {:.3f} / {:.3f} ms", posted.empty() ? "" : ", ", p.batch,
                            1e3 * p.alone_s, 1e3 * p.beside_s);
    std::cerr << fmt::format(
        "[calibrate] overlap: one block's forward + backward {:.3f} ms alone, {:.3f} ms beside "
        "{} all-reduces of {:.0f} MiB ({:.3f} ms each alone) on {} ranks; alone / beside a "
        "posted receive on rank 1 (max_ctas {}, GEMMs leaving {} SMs): {}\n",
        1e3 * o.alone_s, 1e3 * o.beside_s, calls, o.bytes / (1 << 20), 1e3 * ar, o.group,
        o.p2p_max_ctas, o.gemm_sm_margin, posted.empty() ? "not measured" : posted);
  }
  return o;
}

// The waits' naps (ContentionTiming::poll_s, late_s, base_s), on every rank of `comm`.
static void time_wake(dist::Communicator& comm, ContentionTiming& t) {
  Tensor x = Tensor::zeros({16}, DType::F32, Device::cpu());
  t.base_s = time_collective(comm, [&] { comm.all_reduce(x); });
  const auto late_by = std::chrono::milliseconds(5);  // past every wait policy's yield window
  std::vector<double> poll, late;
  for (int k = 0; k < 15; ++k) {
    // Rank 0 tests an all-reduce the others join 5 ms later: the time of one test.
    comm.barrier();
    if (comm.rank() == 0) {
      auto w = comm.all_reduce_async(x, dist::ReduceOp::Sum);
      const auto t0 = Clock::now();
      int n = 0;
      while (n < 1000 && !w->test()) ++n;
      if (n == 1000) poll.push_back(seconds_since(t0) / n);
      w->wait();
    } else {
      std::this_thread::sleep_for(late_by);
      comm.all_reduce(x);
    }
    // The others wait (napping by 5 ms) for rank 0, which times its all-reduce.
    comm.barrier();
    if (comm.rank() == 0) {
      std::this_thread::sleep_for(late_by);
      const auto t0 = Clock::now();
      comm.all_reduce(x);
      late.push_back(seconds_since(t0));
    } else {
      comm.all_reduce(x);
    }
  }
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  t.poll_s = comm.all_reduce_scalar(median(poll), dist::ReduceOp::Max);
  t.late_s = comm.all_reduce_scalar(median(late), dist::ReduceOp::Max);
  t.wake_group = comm.size();
  if (comm.rank() == 0)
    std::cerr << fmt::format(
        "[calibrate] waits: a test {:.2f} µs; a 64-byte all-reduce on {} ranks {:.3f} ms with "
        "all there, {:.3f} ms for one arriving 5 ms after the others\n",
        1e6 * t.poll_s, t.wake_group, 1e3 * t.base_s, 1e3 * t.late_s);
}

ContentionTiming time_contention(dist::Communicator& comm, const nn::ViTConfig& model,
                                 int64_t batch) {
  OneBlock one_block(model, batch, Device::cpu(), DType::F32);
  auto fb = [&] { one_block.run(); };
  ContentionTiming t;
  // One rank per core the job spreads over (bound ranks 0 and 1 on cores 0 and 1).
  t.group = std::min(comm.size(), kernels::cpu::job_cores());
  // The same count everywhere: the repetitions of the block that fill about 0.2 s on rank 0.
  fb();
  const double one = comm.all_reduce_scalar(comm.rank() == 0 ? time_it(fb, Device::cpu()) : 0.0,
                                            dist::ReduceOp::Max);
  const int reps = std::clamp(static_cast<int>(std::ceil(0.2 / std::max(one, 1e-6))), 3, 500);
  // Ranks below `computing` run the block `reps` times from a common start; rank 0's time per
  // block is the figure (the others do the same work, so they finish together). The other ranks
  // sleep through the window: a wait that polls would take cores from the computing ranks where
  // there are more ranks than cores.
  auto window = [&](int computing) {
    comm.barrier();
    double s = 0;
    if (comm.rank() < computing) {
      const auto t0 = Clock::now();
      for (int k = 0; k < reps; ++k) fb();
      s = seconds_since(t0) / reps;
    } else {
      std::this_thread::sleep_for(std::chrono::duration<double>(2.0 * reps * one + 0.05));
    }
    comm.barrier();
    return comm.all_reduce_scalar(s, dist::ReduceOp::Max);
  };
  // Alone, together, alone again: the alone time is their mean (a host's speed drifts).
  const double a1 = window(1);
  t.together_s = window(t.group);
  t.alone_s = 0.5 * (a1 + window(1));
  if (comm.rank() == 0)
    std::cerr << fmt::format(
        "[calibrate] contention: one block's forward + backward {:.3f} ms alone, {:.3f} ms with "
        "{} ranks computing at once\n",
        1e3 * t.alone_s, 1e3 * t.together_s, t.group);
  time_wake(comm, t);
  return t;
}

}  // namespace cai::app
