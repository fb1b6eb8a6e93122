// Run under mpirun.
//   --check [--backend mpi|nccl]: every Communicator operation against its definition (uneven
//     counts, a zero count, non-blocking overlap, point to point, split, scalar in double); with
//     nccl on one GPU per rank, plus bf16, the ordering against the compute stream and the
//     copy-engine all-reduce (the GPUs of one host with peer access, as the GPU hosts have), and
//     that each rank holds a CUDA context on its own GPU only (after the plain operations).
//   --hang [--backend mpi|nccl|nccl-ce]: rank 1 stops joining; rank 0's all-reduce must fail
//     within CAI_COLLECTIVE_TIMEOUT, naming the operation and the group (nccl-ce: the copy-engine
//     all-reduce, whose stream waits on a flag the dead peer never raises).
// With --backend nccl the test exits 77 (skipped) when the build has no CUDA or the node has
// fewer GPUs than ranks, saying why.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "cai/core/error.h"
#include "cai/dist/communicator.h"
#include "cai/dist/nccl.h"
#include "cai/ops/ops.h"
#include "cai/optim/optimizer.h"
#include "gpu_env.h"

using namespace cai;
using namespace cai::dist;

namespace {
int failures = 0;
void expect(bool ok, const std::string& what, int rank) {
  if (!ok) {
    std::fprintf(stderr, "[rank %d] FAILED: %s\n", rank, what.c_str());
    ++failures;
  }
}

// Tensors of the test live on `dev` (the communicator's device); values are checked on the host.
struct On {
  Device dev;
  Tensor vec(const std::vector<float>& v) const {
    return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}).to(dev);
  }
  Tensor full(int64_t n, float v) const { return Tensor::full({n}, v).to(dev); }
  Tensor zeros(int64_t n) const { return Tensor::zeros({n}, DType::F32, dev); }
};

// Uneven reduce-scatter then all-gather with these per-rank counts.
void check_uneven(Communicator& c, const On& on, const std::vector<int64_t>& counts,
                  const std::string& label) {
  const int r = c.rank(), n = c.size();
  int64_t total = 0, off = 0;
  for (int i = 0; i < n; ++i) {
    if (i < r) off += counts[i];
    total += counts[i];
  }
  std::vector<float> in(total);
  for (int64_t i = 0; i < total; ++i) in[i] = float(i) + 0.25f * float(r);
  Tensor out = on.zeros(counts[r]);
  c.reduce_scatter(on.vec(in), out, counts);
  const auto got = out.to_vector();
  bool ok = true;
  for (int64_t i = 0; i < counts[r]; ++i)
    ok = ok && got[i] == float(n) * float(off + i) + 0.25f * float(n * (n - 1) / 2);
  expect(ok, "reduce_scatter " + label, r);
  Tensor all = on.zeros(total);
  c.all_gather(on.full(counts[r], float(r) + 0.5f), all, counts);
  const auto g = all.to_vector();
  ok = true;
  for (int i = 0, k = 0; i < n; ++i)
    for (int64_t j = 0; j < counts[i]; ++j, ++k) ok = ok && g[k] == float(i) + 0.5f;
  expect(ok, "all_gather " + label, r);
}

void check(Communicator& c, const On& on) {
  const int r = c.rank(), n = c.size();
  Tensor t = on.vec({float(r), 1.0f});
  c.all_reduce(t);
  expect(t.to_vector() == std::vector<float>{float(n * (n - 1) / 2), float(n)}, "all_reduce", r);
  Tensor m = on.full(1, float(r));
  c.all_reduce(m, ReduceOp::Max);
  expect(m.item() == float(n - 1), "all_reduce max", r);
  Tensor mn = on.full(1, float(r) + 3.0f);
  c.all_reduce(mn, ReduceOp::Min);
  expect(mn.item() == 3.0f, "all_reduce min", r);
  // bf16 and fp16 reductions (NCCL natively, MPI through its user operations), values exact in
  // both: sums, max and min; and a sum that rounds (1 + 2^-9 per rank is not a bf16 value).
  for (DType h : {DType::BF16, DType::F16}) {
    const std::string hn = dtype_name(h);
    Tensor s = on.vec({float(r), 1.0f, -2.0f * float(r)}).to(h);
    c.all_reduce(s);
    expect(s.to(DType::F32).to_vector() ==
               std::vector<float>{float(n * (n - 1) / 2), float(n), -float(n * (n - 1))},
           "all_reduce " + hn, r);
    Tensor hm = on.full(2, float(r)).to(h);
    c.all_reduce(hm, ReduceOp::Max);
    expect(hm.to(DType::F32).to_vector() == std::vector<float>(2, float(n - 1)),
           "all_reduce max " + hn, r);
    Tensor hr = on.full(1, 1.0f + 1.0f / 512).to(h);  // bf16 rounds it to 1; fp16 keeps it
    c.all_reduce(hr);
    const float one = h == DType::BF16 ? 1.0f : 1.0f + 1.0f / 512;
    expect(std::abs(hr.to(DType::F32).item() - float(n) * one) <= 0.02f * n,
           "all_reduce rounding " + hn, r);
  }
  // Uneven: rank i gets i + 1 elements; then counts with a zero (rank 0 gets none).
  std::vector<int64_t> counts, with_zero;
  for (int i = 0; i < n; ++i) counts.push_back(i + 1), with_zero.push_back(i == 0 ? 0 : 2 * i + 1);
  check_uneven(c, on, counts, "counts i+1");
  check_uneven(c, on, with_zero, "with a zero count");
  check_uneven(c, on, std::vector<int64_t>(n, 3), "even counts");
  Tensor b = on.full(3, float(r));
  c.broadcast(b, n - 1);
  expect(b.to_vector() == std::vector<float>(3, float(n - 1)), "broadcast", r);
  // Two collectives in flight, waited in reverse order.
  Tensor x = on.full(5, 1.0f), y = on.full(5, 2.0f);
  auto wx = c.all_reduce_async(x, ReduceOp::Sum);
  auto wy = c.all_reduce_async(y, ReduceOp::Sum);
  wy->wait();
  wx->wait();
  expect(x.to_vector() == std::vector<float>(5, float(n)) &&
             y.to_vector() == std::vector<float>(5, float(2 * n)),
         "async all_reduce", r);
  // test() reaches true without wait().
  Tensor z = on.full(7, 1.0f);
  auto wz = c.all_reduce_async(z, ReduceOp::Sum);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!wz->test() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  expect(wz->test() && z.to_vector() == std::vector<float>(7, float(n)), "test() completes", r);
  // Ring of point-to-point messages, both directions at once.
  std::vector<std::pair<int, int>> ring;
  for (int i = 0; i < n; ++i) ring.emplace_back(i, (i + 1) % n), ring.emplace_back((i + 1) % n, i);
  c.connect_p2p(ring);
  Tensor s = on.full(4, float(r)), recv = on.zeros(4);
  Tensor s2 = on.full(6, float(10 * r)), recv2 = on.zeros(6);
  auto ws = c.send_async(s, (r + 1) % n, 3);
  auto ws2 = c.send_async(s2, (r + n - 1) % n, 4);
  c.recv(recv, (r + n - 1) % n, 3);
  c.recv(recv2, (r + 1) % n, 4);
  ws->wait();
  ws2->wait();
  expect(recv.to_vector() == std::vector<float>(4, float((r + n - 1) % n)), "send/recv ring", r);
  expect(recv2.to_vector() == std::vector<float>(6, float(10 * ((r + 1) % n))),
         "send/recv reverse ring", r);
  {
    // The same ring over channels whose kernels take at most 2 thread blocks (NCCL's maxCTAs; MPI
    // ignores it), on a fresh group: a pair keeps the channel it was first declared with.
    auto capped = c.split(0, r, "capped");
    capped->connect_p2p(ring, P2POptions{2});
    Tensor big = on.full(1 << 20, float(r + 1)), into = on.zeros(1 << 20);
    auto w = capped->send_async(big, (r + 1) % n, 5);
    capped->recv(into, (r + n - 1) % n, 5);
    w->wait();
    expect(into.to_vector() == std::vector<float>(1 << 20, float((r + n - 1) % n + 1)),
           "send/recv ring, 2 thread blocks", r);
  }
  expect(std::abs(c.all_reduce_scalar(0.1) - 0.1 * n) < 1e-15, "scalar in double", r);
  expect(c.all_reduce_scalar(double(r), ReduceOp::Max) == double(n - 1), "scalar max", r);
  const double big = 16777217.0 + r;  // above 2^24: fp32 would round it
  expect(c.all_reduce_scalar(big) == 16777217.0 * n + n * (n - 1) / 2.0, "scalar exact", r);
  auto sub = c.split(r % 2, r, "parity");
  Tensor p = on.full(1, 1.0f);
  sub->all_reduce(p);
  expect(p.item() == float((n + (r % 2 == 0 ? 1 : 0)) / 2), "split", r);
  expect(sub->name() == "parity" && sub->rank() == r / 2, "split rank and name", r);
  c.barrier();
}

// Inexact sums through `reduce` (in place): every rank ends with the same bits, within rounding
// of NCCL's sum.
void check_inexact(Communicator& c, const On& on, const std::string& what,
                   const std::function<void(Tensor&)>& reduce) {
  const int r = c.rank(), n = c.size();
  std::vector<float> noise(5000);
  for (size_t i = 0; i < noise.size(); ++i) noise[i] = std::sin(0.37f * float(i) + 1.3f * float(r));
  Tensor a = Tensor::from_vector(noise, {5000}).to(on.dev), b = a.clone();
  reduce(a);
  c.all_reduce(b);
  const auto av = a.to_vector(), bv = b.to_vector();
  double checksum = 0, worst = 0;
  for (size_t i = 0; i < av.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &av[i], 4);
    checksum = std::fmod(checksum * 3.0 + double(bits % 65521), 1e9);
    worst = std::max(worst, double(std::abs(av[i] - bv[i])));
  }
  expect(
      c.all_reduce_scalar(checksum, ReduceOp::Max) == c.all_reduce_scalar(checksum, ReduceOp::Min),
      what + ": the same bits on every rank", r);
  expect(worst <= 1e-6 * n,
         fmt::format("{}: within rounding of NCCL's sum (worst {})", what, worst), r);
}

// The copy-engine all-reduce against its definition: sizes around the chunking (fewer elements
// than ranks, 64-element chunk boundaries, odd tails), many operations in flight at once and in
// sequence (the staging region and flags are reused), NCCL operations between them, the
// ordering after the compute stream, the same bits on every rank, and misuse.
void check_copy_engine(Communicator& c, const On& on) {
  const int r = c.rank(), n = c.size();
  const int64_t most = (1 << 20) + 37;
  expect(c.enable_copy_engine_all_reduce(most), "copy-engine all-reduce enabled", r);
  expect(c.enable_copy_engine_all_reduce(most / 2), "enabling again for fewer elements", r);
  // x[i] = (r + 1) / 2 + i % 7: sums exact in fp32.
  auto input = [&](int64_t numel) {
    std::vector<float> v(numel);
    for (int64_t i = 0; i < numel; ++i) v[i] = 0.5f * float(r + 1) + float(i % 7);
    return Tensor::from_vector(v, {numel}).to(on.dev);
  };
  auto exact = [&](const Tensor& t) {
    const auto v = t.to_vector();
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i] != 0.25f * float(n * (n + 1)) + float(n * int64_t(i % 7))) return false;
    return true;
  };
  for (int64_t numel : {int64_t{1}, int64_t{n - 1}, int64_t{63}, int64_t{64 * n},
                        int64_t{64 * n + 1}, int64_t{4097}, most}) {
    if (numel < 1) continue;
    Tensor t = input(numel);
    c.copy_engine_all_reduce_async(t)->wait();
    expect(exact(t), fmt::format("copy-engine all_reduce of {} elements", numel), r);
  }
  // 40 in flight, an NCCL all-reduce among them, waited in reverse order.
  std::vector<Tensor> ts;
  std::vector<std::unique_ptr<Work>> ws;
  Tensor mid = on.full(9, 1.0f);
  for (int k = 0; k < 40; ++k) {
    ts.push_back(input(1000 + 257 * k));
    ws.push_back(c.copy_engine_all_reduce_async(ts.back()));
    if (k == 20) ws.push_back(c.all_reduce_async(mid, ReduceOp::Sum));
  }
  for (auto it = ws.rbegin(); it != ws.rend(); ++it) (*it)->wait();
  bool all = true;
  for (const Tensor& t : ts) all = all && exact(t);
  expect(all && mid.to_vector() == std::vector<float>(9, float(n)),
         "40 copy-engine all_reduces in flight with an NCCL one among them", r);
  // After the compute stream's last write, as the NCCL path.
  Tensor big = on.full(most, 1.0f);
  for (int i = 0; i < 30; ++i) ops::scale_(big, 1.0f);
  ops::fill_(big, float(r + 1));
  auto w = c.copy_engine_all_reduce_async(big);
  w->wait_on_device();
  ops::scale_(big, 2.0f);  // ordered after the reduction on the device
  w->wait();
  const auto v = big.to_vector();
  bool ordered = true;
  for (int64_t i = 0; i < most; i += 4099) ordered = ordered && v[i] == float(n * (n + 1));
  expect(ordered && v[most - 1] == float(n * (n + 1)),
         "copy-engine all_reduce ordered after and before the compute stream", r);
  check_inexact(c, on, "copy-engine all_reduce",
                [&](Tensor& a) { c.copy_engine_all_reduce_async(a)->wait(); });
  // Misuse names the limit.
  Tensor huge = on.zeros(most + 1);
  bool threw = false;
  try {
    c.copy_engine_all_reduce_async(huge);
  } catch (const Error& e) {
    threw = std::string(e.what()).find("at most") != std::string::npos;
  }
  expect(threw, "a tensor over max_numel is refused, naming the limit", r);
}

// The copy-engine gradient exchange against its definition: several rounds of pushes of ranges
// of assorted sizes (odd, unaligned offsets, an empty one), each round's sums exact and in
// place; a rank whose compute stream is busy before its sum while the others already push the
// next round (the round's first push waits for it); the same bits on every rank for inexact
// sums, within rounding of NCCL's; and misuse.
void check_exchange(Communicator& c, const On& on) {
  const int r = c.rank(), n = c.size();
  const std::vector<int64_t> sizes = {4096, 1, 0, 63, 100003, 1 << 20, 5};
  int64_t total = 0;
  std::vector<int64_t> offsets;
  for (int64_t k : sizes) offsets.push_back(total), total += k;
  expect(c.enable_copy_engine_exchange(total), "copy-engine exchange enabled", r);
  expect(c.enable_copy_engine_exchange(total), "enabling again for the same space", r);
  // Round q, range k, element i: (r + 1) / 2 + (i + k + q) % 7, exact in fp32.
  auto input = [&](int64_t numel, int k, int q, int rank) {
    std::vector<float> v(numel);
    for (int64_t i = 0; i < numel; ++i) v[i] = 0.5f * float(rank + 1) + float((i + k + q) % 7);
    return Tensor::from_vector(v, {numel}).to(on.dev);
  };
  auto exact = [&](const Tensor& t, int k, int q) {
    const auto v = t.to_vector();
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i] != 0.25f * float(n * (n + 1)) + float(n * int64_t((i + k + q) % 7))) return false;
    return true;
  };
  bool all = true;
  for (int q = 0; q < 4; ++q) {
    std::vector<Tensor> ts;
    std::vector<std::unique_ptr<Work>> pushes;
    for (size_t k = 0; k < sizes.size(); ++k) {
      ts.push_back(input(sizes[k], int(k), q, r));
      pushes.push_back(c.exchange_push_async(ts.back(), offsets[k]));
    }
    // Rank 0's sum waits behind a long compute stream; the others go on to the next round.
    if (r == 0) {
      Tensor busy = on.full(1 << 26, 1.0f);
      for (int i = 0; i < 60; ++i) ops::scale_(busy, 1.0f);
    }
    auto sum = c.exchange_sum_async(ts, offsets);
    for (auto& w : pushes) w->wait();
    sum->wait();
    for (size_t k = 0; k < sizes.size(); ++k) all = all && exact(ts[k], int(k), q);
  }
  expect(all, "four rounds of exchange sums, one rank late to each", r);
  // A round whose reader sums as it reads (the DDP step's clip and optimizer): the arrivals, the
  // copies where exchange_received() says (the statistics of the gradients read as their sum,
  // Optimizer::sum_replicas's offsets), the end; then a summed round again.
  {
    Tensor own = input(total, 0, 9, r);
    auto push = c.exchange_push_async(own, 0);
    c.exchange_wait_async()->wait();
    push->wait();
    const auto received = c.exchange_received();
    std::vector<int64_t> delta;
    bool where = received.size() == size_t(n);
    for (int q = 0; q < n && where; ++q) {
      where = (q == r) == (received[q] == nullptr);
      const auto bytes = q == r ? 0
                                : reinterpret_cast<intptr_t>(received[q]) -
                                      reinterpret_cast<intptr_t>(own.data<float>());
      delta.push_back(bytes / 4);
      where = where && bytes % 16 == 0;
    }
    expect(where, "exchange_received: every other rank's copy, 16-byte aligned", r);
    nn::Parameter p;
    p.grad = own;
    const auto got = optim::grad_stats({&p}, nullptr, 1.0f, &delta).to_vector();
    c.exchange_end_async()->wait();
    double want = 0;
    for (int64_t i = 0; i < total; ++i) {
      const double v = 0.25 * n * (n + 1) + double(n * ((i + 9) % 7));
      want += v * v;
    }
    expect(std::abs(got[0] - want) <= 1e-5 * want && got[1] == 0.0f,
           fmt::format("the sum read where it lies: Σx² {} against {}", got[0], want), r);
    Tensor again = input(4096, 0, 11, r);
    c.exchange_push_async(again, 0)->wait();
    c.exchange_sum_async({again}, {0})->wait();
    expect(exact(again, 0, 11) && own.to_vector() == input(total, 0, 9, r).to_vector(),
           "a summed round after it; the reader's own copy untouched", r);
  }
  check_inexact(c, on, "exchange (an unaligned range)", [&](Tensor& a) {
    c.exchange_push_async(a, 17)->wait();
    c.exchange_sum_async({a}, {17})->wait();
  });
  // Misuse names the limits.
  Tensor tail = on.zeros(2);
  bool threw = false;
  try {
    c.exchange_push_async(tail, total - 1);
  } catch (const Error& e) {
    threw = std::string(e.what()).find("within the") != std::string::npos;
  }
  expect(threw, "a push past the enabled space is refused, naming it", r);
  threw = false;
  try {
    c.enable_copy_engine_exchange(total + 1);
  } catch (const Error& e) {
    threw = std::string(e.what()).find("asked again") != std::string::npos;
  }
  expect(threw, "enabling again for another space is refused", r);
}

// NCCL only: bf16 reductions, CPU tensors through the host communicator, ordering against the
// compute stream, and errors for misuse.
void check_nccl(Communicator& c, const On& on) {
  const int r = c.rank(), n = c.size();
  Tensor h = Tensor::from_vector(std::vector<float>{float(r), 2.0f, -1.0f}, {3});
  Tensor hb = h.to(DType::BF16).to(on.dev);
  c.all_reduce(hb);
  expect(hb.to_vector() == std::vector<float>{float(n * (n - 1) / 2), 2.0f * n, -1.0f * n},
         "bf16 all_reduce", r);
  Tensor cpu = Tensor::full({2}, 1.0f);
  c.all_reduce(cpu);  // a CPU tensor goes through the CPU communicator
  expect(cpu.to_vector() == std::vector<float>(2, float(n)), "CPU tensor via the host", r);
  // The reduction must see the last kernel written before it on the compute stream: many
  // passes over a large tensor, then the value, then at once the all-reduce.
  const int64_t big = 1 << 24;
  Tensor t = on.full(big, 1.0f);
  for (int i = 0; i < 30; ++i) ops::scale_(t, 1.0f);
  ops::fill_(t, float(r + 1));
  auto w = c.all_reduce_async(t, ReduceOp::Sum);
  w->wait();
  const auto v = t.to_vector();
  const float want = float(n * (n + 1) / 2);
  bool ok = true;
  for (int64_t i = 0; i < big; i += 4099) ok = ok && v[i] == want;
  ok = ok && v[big - 1] == want;
  expect(ok, "all_reduce ordered after the compute stream", r);
  // Misuse is an error naming the problem.
  Tensor lone = on.full(2, 1.0f);
  bool threw = false;
  try {
    auto sub = c.split(0, r, "fresh");
    sub->send_async(lone, (r + 1) % n, 0);
  } catch (const Error& e) {
    threw = std::string(e.what()).find("connect_p2p") != std::string::npos;
  }
  expect(threw, "send on an undeclared pair names connect_p2p", r);
  check_copy_engine(c, on);
  check_exchange(c, on);
}
// This process holds a CUDA context on its own GPU only. The communicator's watchdog queries
// the events of the operations above on a thread of its own, which needs that GPU made current
// (a thread starts on device 0: ranks 1-3 of a 4-GPU job each held 1.1 GiB on GPU 0). Every
// operation stays listed until the watchdog has seen it complete, and it polls every 100 ms:
// after 300 ms it has queried them.
void check_own_device_only(int gpu) {
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int n = kernels::cuda::device_count();
  CAI_CHECK(kernels::cuda::has_primary_context(gpu), "no CUDA context on this rank's GPU {}", gpu);
  for (int d = 0; d < n; ++d)
    CAI_CHECK(d == gpu || !kernels::cuda::has_primary_context(d),
              "this rank uses GPU {} but holds a CUDA context on GPU {} as well", gpu, d);
}

}  // namespace

int main(int argc, char** argv) {
  MpiEnvironment env(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "--check";
  std::string backend = "mpi";
  for (int i = 2; i + 1 < argc; i += 2)
    if (std::string(argv[i]) == "--backend") backend = argv[i + 1];
  auto world = env.world(30.0);
  std::unique_ptr<Communicator> nccl;
  On on{Device::cpu()};
  const bool copy_engine = backend == "nccl-ce";
  if (copy_engine) backend = "nccl";
  if (backend == "nccl") {
    const std::string why = test::gpu_skip_reason();
    if (!why.empty()) {
      if (world->rank() == 0) std::printf("skipped: %s\n", why.c_str());
      return test::kSkip;
    }
    const int gpu = test::select_gpu();
    nccl = make_nccl(*world, gpu);
    on.dev = Device::cuda(gpu);
  } else if (backend != "mpi") {
    std::fprintf(stderr, "unknown backend %s (mpi | nccl)\n", backend.c_str());
    return 2;
  }
  Communicator& comm = nccl ? *nccl : *world;
  if (mode == "--check") {
    try {
      check(comm, on);
      if (nccl) {
        // Before check_nccl: its copy-engine all-reduce maps the peers' memory (CUDA IPC, lazy
        // peer access), which this check does not cover.
        check_own_device_only(on.dev.index);
        check_nccl(comm, on);
      }
    } catch (const Error& e) {
      std::fprintf(stderr, "rank %d: %s\n", world->rank(), e.what());
      MpiEnvironment::abort(1);
    }
    const double all = world->all_reduce_scalar(failures, ReduceOp::Max);
    if (world->rank() == 0)
      std::printf("%s collectives on %d ranks: %s\n", backend.c_str(), world->size(),
                  all == 0 ? "ok" : "FAILED");
    return all == 0 ? 0 : 1;
  }
  if (mode == "--hang") {
    try {
      // Both ranks take part once (NCCL builds its communicator at the first collective),
      // with room for CUDA and NCCL start-up; then the short limit applies.
      const double limit = world->timeout();
      world->set_timeout(120), comm.set_timeout(120);
      Tensor warm = Tensor::full({16}, 1.0f).to(on.dev);
      comm.all_reduce(warm);
      if (copy_engine) {
        if (!comm.enable_copy_engine_all_reduce(1024)) {
          if (world->rank() == 0) std::printf("skipped: no peer access between the GPUs\n");
          return test::kSkip;
        }
        comm.copy_engine_all_reduce_async(warm)->wait();
      }
      world->set_timeout(limit), comm.set_timeout(limit);
      if (world->rank() == 1) {
        std::this_thread::sleep_for(std::chrono::seconds(120));  // never joins again
        return 0;
      }
      Tensor t = Tensor::full({16}, 1.0f).to(on.dev);
      if (copy_engine)
        comm.copy_engine_all_reduce_async(t)->wait();
      else
        comm.all_reduce(t);
      std::printf("all_reduce completed unexpectedly\n");
      return 0;
    } catch (const Error& e) {
      std::fprintf(stderr, "rank %d: %s\n", world->rank(), e.what());
      MpiEnvironment::abort(3);
    }
  }
  std::fprintf(stderr, "usage: %s --check|--hang [--backend mpi|nccl|nccl-ce]\n", argv[0]);
  return 2;
}
