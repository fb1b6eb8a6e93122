// Launch environment, the process mesh, and the Communicator semantics on the in-process fake
// (the MPI backend runs the same operations in the mpi.* tests).
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "cai/core/error.h"
#include "cai/dist/communicator.h"
#include "cai/dist/launch.h"
#include "cai/dist/mesh.h"

using namespace cai;
using namespace cai::dist;

namespace {
// Runs fn(rank, comm) on n threads over a fake group.
void on_group(int n, const std::function<void(int, Communicator&)>& fn, double timeout = 10) {
  auto comms = make_fake_group(n, timeout);
  std::vector<std::thread> ts;
  std::vector<std::string> errors(n);
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      try {
        fn(r, *comms[r]);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

struct EnvGuard {
  std::vector<std::string> names;
  void set(const char* n, const char* v) {
    names.push_back(n);
    setenv(n, v, 1);
  }
  ~EnvGuard() {
    for (auto& n : names) unsetenv(n.c_str());
  }
};
}  // namespace

TEST(Launch, ReadsOpenMpiSlurmAndTorchrunVariables) {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "RANK", "MASTER_ADDR"}) unsetenv(v);
  EXPECT_EQ(launch_from_env().source, "single");
  {
    EnvGuard g;
    g.set("RANK", "3"), g.set("WORLD_SIZE", "4"), g.set("LOCAL_RANK", "1");
    g.set("MASTER_ADDR", "10.1.2.3"), g.set("MASTER_PORT", "1234");
    const auto li = launch_from_env();
    EXPECT_EQ(li.source, "torchrun");
    EXPECT_EQ(li.rank, 3);
    EXPECT_EQ(li.world_size, 4);
    EXPECT_EQ(li.local_rank, 1);
    EXPECT_EQ(li.master_addr, "10.1.2.3");
    EXPECT_EQ(li.master_port, 1234);
  }
  {
    EnvGuard g;
    g.set("SLURM_PROCID", "5"), g.set("SLURM_NTASKS", "8"), g.set("SLURM_LOCALID", "1");
    EXPECT_EQ(launch_from_env().source, "slurm");
    EXPECT_EQ(launch_from_env().rank, 5);
  }
  {
    EnvGuard g;
    g.set("OMPI_COMM_WORLD_RANK", "1"), g.set("OMPI_COMM_WORLD_SIZE", "2");
    g.set("SLURM_PROCID", "0");  // OpenMPI wins: mpirun inside an allocation
    EXPECT_EQ(launch_from_env().source, "openmpi");
    EXPECT_EQ(launch_from_env().rank, 1);
  }
  {
    EnvGuard g;
    g.set("RANK", "4"), g.set("WORLD_SIZE", "4");
    EXPECT_THROW(launch_from_env(), Error);
    g.set("RANK", "x");
    EXPECT_THROW(launch_from_env(), Error);
  }
}

TEST(Launch, SeveralGpuProcessesLoadCudaModulesEagerly) {
  const char* saved = std::getenv("CUDA_MODULE_LOADING");
  const std::string before = saved ? saved : "";
  unsetenv("CUDA_MODULE_LOADING");
  LaunchInfo one;
  EXPECT_FALSE(prefer_eager_cuda_module_loading(one));
  EXPECT_EQ(std::getenv("CUDA_MODULE_LOADING"), nullptr);
  LaunchInfo two;
  two.world_size = 2;
  EXPECT_TRUE(prefer_eager_cuda_module_loading(two));
  ASSERT_NE(std::getenv("CUDA_MODULE_LOADING"), nullptr);
  EXPECT_STREQ(std::getenv("CUDA_MODULE_LOADING"), "EAGER");
  setenv("CUDA_MODULE_LOADING", "LAZY", 1);  // the user's choice stays
  EXPECT_FALSE(prefer_eager_cuda_module_loading(two));
  EXPECT_STREQ(std::getenv("CUDA_MODULE_LOADING"), "LAZY");
  if (saved)
    setenv("CUDA_MODULE_LOADING", before.c_str(), 1);
  else
    unsetenv("CUDA_MODULE_LOADING");
}

TEST(Mesh, ColossalAiRankOrder) {
  ProcessMesh m(16, 2, 2);  // dp 4 × pp 2 × tp 2
  EXPECT_EQ(m.dp_size(), 4);
  EXPECT_EQ(m.coord(0), (MeshCoord{0, 0, 0}));
  EXPECT_EQ(m.coord(1), (MeshCoord{0, 0, 1}));  // tp contiguous
  EXPECT_EQ(m.coord(2), (MeshCoord{0, 1, 0}));  // then pp
  EXPECT_EQ(m.coord(4), (MeshCoord{1, 0, 0}));  // dp outermost
  for (int r = 0; r < 16; ++r) EXPECT_EQ(m.rank_of(m.coord(r)), r);
  EXPECT_EQ(m.tp_group(5), (std::vector<int>{4, 5}));
  EXPECT_EQ(m.pp_group(5), (std::vector<int>{5, 7}));
  EXPECT_EQ(m.dp_group(5), (std::vector<int>{1, 5, 9, 13}));
  try {
    ProcessMesh bad(6, 2, 2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("world size 6 is not divisible by tensor size 2 × "
                                         "pipeline size 2 = 4"),
              std::string::npos)
        << e.what();
  }
}

TEST(FakeCommunicator, Collectives) {
  const int n = 3;
  on_group(n, [&](int r, Communicator& c) {
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.size(), n);
    Tensor t = Tensor::from_vector(std::vector<float>{float(r), float(10 * r)}, {2});
    c.all_reduce(t);
    EXPECT_EQ(t.to_vector(), (std::vector<float>{3, 30}));
    Tensor m = Tensor::from_vector(std::vector<float>{float(r)}, {1});
    c.all_reduce(m, ReduceOp::Max);
    EXPECT_EQ(m.item(), 2.0f);
    // reduce_scatter with uneven counts {1, 2, 0}.
    Tensor in = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3});
    std::vector<int64_t> counts{1, 2, 0};
    Tensor out = Tensor::zeros({counts[r]});
    c.reduce_scatter(in, out, counts);
    if (r == 0) {
      EXPECT_EQ(out.to_vector(), (std::vector<float>{3}));
    } else if (r == 1) {
      EXPECT_EQ(out.to_vector(), (std::vector<float>{6, 9}));
    }
    // all_gather with uneven counts.
    Tensor mine = Tensor::full({counts[r]}, float(r + 1));
    Tensor all = Tensor::zeros({3});
    c.all_gather(mine, all, counts);
    EXPECT_EQ(all.to_vector(), (std::vector<float>{1, 2, 2}));
    Tensor b = Tensor::full({2}, float(r));
    c.broadcast(b, 2);
    EXPECT_EQ(b.to_vector(), (std::vector<float>{2, 2}));
    EXPECT_NEAR(c.all_reduce_scalar(0.1 * r), 0.3, 1e-15);
    c.barrier();
  });
}

TEST(FakeCommunicator, NonBlockingOperationsOverlap) {
  on_group(2, [&](int r, Communicator& c) {
    // Two collectives in flight before either wait; completion in any order.
    Tensor a = Tensor::full({4}, 1.0f), b = Tensor::full({4}, float(r));
    auto wa = c.all_reduce_async(a, ReduceOp::Sum);
    auto wb = c.all_reduce_async(b, ReduceOp::Sum);
    wb->wait();
    wa->wait();
    EXPECT_EQ(a.to_vector(), std::vector<float>(4, 2.0f));
    EXPECT_EQ(b.to_vector(), std::vector<float>(4, 1.0f));
    // Point to point, both directions, tags kept apart.
    Tensor s = Tensor::full({3}, float(r + 5)), x = Tensor::zeros({3}), y = Tensor::zeros({3});
    auto w1 = c.send_async(s, 1 - r, 7);
    auto w2 = c.send_async(Tensor::full({3}, float(r + 50)), 1 - r, 8);
    c.recv(y, 1 - r, 8);
    c.recv(x, 1 - r, 7);
    w1->wait();
    w2->wait();
    EXPECT_EQ(x.to_vector(), std::vector<float>(3, float(1 - r + 5)));
    EXPECT_EQ(y.to_vector(), std::vector<float>(3, float(1 - r + 50)));
  });
}

TEST(FakeCommunicator, SplitMakesSubGroups) {
  on_group(4, [&](int r, Communicator& c) {
    auto sub = c.split(r % 2, -r, "parity");  // key -r: reversed order
    EXPECT_EQ(sub->size(), 2);
    EXPECT_EQ(sub->rank(), r < 2 ? 1 : 0);
    Tensor t = Tensor::full({1}, float(r));
    sub->all_reduce(t);
    EXPECT_EQ(t.item(), r % 2 == 0 ? 2.0f : 4.0f);
  });
}

TEST(FakeCommunicator, AMissingPeerTimesOutWithANamedError) {
  auto comms = make_fake_group(2, 0.3);
  Tensor t = Tensor::full({8}, 1.0f);
  try {
    comms[0]->all_reduce(t);  // rank 1 never joins
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("all_reduce on group 'fake'"), std::string::npos) << m;
    EXPECT_NE(m.find("did not complete within 0.3 s"), std::string::npos) << m;
  }
  Tensor r = Tensor::zeros({1});
  EXPECT_THROW(comms[1]->recv(r, 0, 3), Error);
}

// The copy-engine all-reduce is a GPU-to-GPU path (NCCL communicator; tests/dist/
// mpi_collectives.cpp checks it on GPUs): host backends decline to enable it, and using it
// without enabling it is an error that says so.
TEST(FakeCommunicator, DeclinesTheCopyEngineAllReduce) {
  on_group(2, [&](int, Communicator& c) {
    EXPECT_FALSE(c.enable_copy_engine_all_reduce(1024));
    Tensor t = Tensor::full({4}, 1.0f);
    try {
      c.copy_engine_all_reduce_async(t);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not enabled"), std::string::npos) << e.what();
    }
  });
}

TEST(FakeCommunicator, DeclinesTheCopyEngineExchange) {
  on_group(2, [&](int, Communicator& c) {
    EXPECT_FALSE(c.enable_copy_engine_exchange(1024));
    Tensor t = Tensor::full({4}, 1.0f);
    for (int op = 0; op < 2; ++op) try {
        if (op == 0)
          c.exchange_push_async(t, 0);
        else
          c.exchange_sum_async({t}, {0});
        ADD_FAILURE() << "no error";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("not enabled"), std::string::npos) << e.what();
      }
  });
}

TEST(SingleCommunicator, IsTheIdentity) {
  auto c = make_single();
  Tensor t = Tensor::full({3}, 2.0f);
  c->all_reduce(t);
  EXPECT_EQ(t.to_vector(), std::vector<float>(3, 2.0f));
  Tensor out = Tensor::zeros({3});
  c->all_gather(t, out, {3});
  EXPECT_EQ(out.to_vector(), std::vector<float>(3, 2.0f));
  EXPECT_THROW(c->send(t, 1), Error);
}
