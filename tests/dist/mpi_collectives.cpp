// Run under mpirun. --check: every MPI Communicator operation against its definition (uneven
// counts, non-blocking overlap, point to point, split). --hang: rank 1 never joins; rank 0's
// all-reduce must fail within CAI_COLLECTIVE_TIMEOUT, naming the operation and the group.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "cai/core/error.h"
#include "cai/dist/communicator.h"

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

void check(Communicator& c) {
  const int r = c.rank(), n = c.size();
  Tensor t = Tensor::from_vector(std::vector<float>{float(r), 1.0f}, {2});
  c.all_reduce(t);
  expect(t.to_vector() == std::vector<float>{float(n * (n - 1) / 2), float(n)}, "all_reduce", r);
  Tensor m = Tensor::full({1}, float(r));
  c.all_reduce(m, ReduceOp::Max);
  expect(m.item() == float(n - 1), "all_reduce max", r);
  // Uneven reduce-scatter / all-gather: rank i gets i+1 elements.
  std::vector<int64_t> counts;
  int64_t total = 0;
  for (int i = 0; i < n; ++i) counts.push_back(i + 1), total += i + 1;
  std::vector<float> in(total);
  for (int64_t i = 0; i < total; ++i) in[i] = float(i);
  Tensor out = Tensor::zeros({counts[r]});
  c.reduce_scatter(Tensor::from_vector(in, {total}), out, counts);
  int64_t off = 0;
  for (int i = 0; i < r; ++i) off += counts[i];
  bool ok = true;
  for (int64_t i = 0; i < counts[r]; ++i) ok = ok && out.to_vector()[i] == float(n * (off + i));
  expect(ok, "reduce_scatter", r);
  Tensor all = Tensor::zeros({total});
  c.all_gather(Tensor::full({counts[r]}, float(r)), all, counts);
  ok = true;
  for (int i = 0, k = 0; i < n; ++i)
    for (int j = 0; j < counts[i]; ++j, ++k) ok = ok && all.to_vector()[k] == float(i);
  expect(ok, "all_gather", r);
  Tensor b = Tensor::full({3}, float(r));
  c.broadcast(b, n - 1);
  expect(b.to_vector() == std::vector<float>(3, float(n - 1)), "broadcast", r);
  // Two collectives in flight, waited in reverse order.
  Tensor x = Tensor::full({5}, 1.0f), y = Tensor::full({5}, 2.0f);
  auto wx = c.all_reduce_async(x, ReduceOp::Sum);
  auto wy = c.all_reduce_async(y, ReduceOp::Sum);
  wy->wait();
  wx->wait();
  expect(x.to_vector() == std::vector<float>(5, float(n)) &&
             y.to_vector() == std::vector<float>(5, float(2 * n)),
         "async all_reduce", r);
  // Ring of point-to-point messages.
  Tensor s = Tensor::full({4}, float(r)), recv = Tensor::zeros({4});
  auto ws = c.send_async(s, (r + 1) % n, 3);
  c.recv(recv, (r + n - 1) % n, 3);
  ws->wait();
  expect(recv.to_vector() == std::vector<float>(4, float((r + n - 1) % n)), "send/recv ring", r);
  expect(std::abs(c.all_reduce_scalar(0.1) - 0.1 * n) < 1e-15, "scalar in double", r);
  auto sub = c.split(r % 2, r, "parity");
  Tensor p = Tensor::full({1}, 1.0f);
  sub->all_reduce(p);
  expect(p.item() == float((n + (r % 2 == 0 ? 1 : 0)) / 2), "split", r);
  c.barrier();
}
}  // namespace

int main(int argc, char** argv) {
  MpiEnvironment env(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "--check";
  auto world = env.world(30.0);
  if (mode == "--check") {
    try {
      check(*world);
    } catch (const Error& e) {
      std::fprintf(stderr, "rank %d: %s\n", world->rank(), e.what());
      MpiEnvironment::abort(1);
    }
    const double all = world->all_reduce_scalar(failures, ReduceOp::Max);
    if (world->rank() == 0)
      std::printf("mpi collectives on %d ranks: %s\n", world->size(), all == 0 ? "ok" : "FAILED");
    return all == 0 ? 0 : 1;
  }
  if (mode == "--hang") {
    if (world->rank() == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(120));  // never joins
      return 0;
    }
    try {
      Tensor t = Tensor::full({16}, 1.0f);
      world->all_reduce(t);
      std::printf("all_reduce completed unexpectedly\n");
      return 0;
    } catch (const Error& e) {
      std::fprintf(stderr, "rank %d: %s\n", world->rank(), e.what());
      MpiEnvironment::abort(3);
    }
  }
  std::fprintf(stderr, "usage: %s --check|--hang\n", argv[0]);
  return 2;
}
