// MPI backend of the Communicator (CPU tensors). Non-blocking MPI calls; waits poll MPI_Testall
// against a deadline so a dead or hung peer becomes an error naming the operation and group.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <thread>

#include "cai/core/error.h"
#include "cai/dist/communicator.h"
#include "cai/dist/launch.h"
#include "kernels/cpu/parallel.h"

namespace cai::dist {

namespace {

// Whether this machine runs more of the job's processes than there are cores for them (the
// launcher's local world size against the cores this process may run on, or the machine's when
// the launcher bound it to one). A fact of the process, read once.
bool oversubscribed() {
  static const bool v = [] {
    int local = 1;
    try {
      local = launch_from_env().local_world_size;
    } catch (const Error&) {  // an inconsistent environment is reported where it is used
    }
    return local > kernels::cpu::job_cores();
  }();
  return v;
}

}  // namespace

WaitPolicy mpi_wait_policy(bool oversubscribed) {
  WaitPolicy p;
  if (oversubscribed) p.yield_seconds = 0;
  return p;
}

namespace {

MPI_Datatype mpi_type(const Tensor& t) {
  switch (t.dtype()) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::I32:
      return MPI_INT;
    default:
      return MPI_UINT16_T;  // bf16/fp16 move as raw 16-bit words (reductions: half_reduce)
  }
}

// 16-bit floats (bf16, fp16): MPI has no such types, so their reductions are user operations on
// the raw 16-bit words that decode, combine in fp32 and round back (to nearest even) at every
// step of MPI's reduction, as NCCL's bf16/fp16 reductions round.
template <bool Bf16, ReduceOp Op>
void half_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = Bf16 ? bf16_to_float(a[i]) : fp16_to_float(a[i]);
    const float y = Bf16 ? bf16_to_float(b[i]) : fp16_to_float(b[i]);
    const float r = Op == ReduceOp::Sum   ? x + y
                    : Op == ReduceOp::Max ? std::max(x, y)
                                          : std::min(x, y);
    b[i] = Bf16 ? float_to_bf16(r) : float_to_fp16(r);
  }
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return MPI_SUM;
    case ReduceOp::Max:
      return MPI_MAX;
    case ReduceOp::Min:
      return MPI_MIN;
  }
  return MPI_SUM;
}

void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  fail("[mpi] {} failed: {}", call, std::string(msg, len));
}

int to_int(int64_t n, const char* op) {
  CAI_CHECK(n >= 0 && n <= INT32_MAX, "[mpi] {} of {} elements exceeds MPI's int count", op, n);
  return static_cast<int>(n);
}

void host_only(const Tensor& t, const char* op) {
  CAI_CHECK(!t.is_cuda(), "[mpi] {} needs CPU tensors (got {}); use the NCCL communicator", op,
            t.str());
}

class MpiWork : public Work {
 public:
  MpiWork(std::string what, double timeout) : what_(std::move(what)), timeout_(timeout) {}
  ~MpiWork() override {
    if (done_ || requests.empty()) return;
    int finalized = 0, flag = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag,
                    MPI_STATUSES_IGNORE) == MPI_SUCCESS &&
        flag)
      return;
    // Timed out (the caller threw) or dropped unfinished: MPI may still write into the buffers
    // and read the counts, and a collective request cannot be cancelled. They stay allocated for
    // the life of the process instead of being freed under MPI.
    struct Leftover {
      std::vector<MPI_Request> requests;
      std::vector<Tensor> keep;
      std::vector<int> counts, displs;
    };
    (void)new Leftover{std::move(requests), std::move(keep), std::move(counts), std::move(displs)};
  }
  std::vector<MPI_Request> requests;
  std::vector<Tensor> keep;  // buffers alive until completion
  std::vector<int> counts, displs;

  bool test() override {
    if (done_) return true;
    int flag = 0;
    check_mpi(
        MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag, MPI_STATUSES_IGNORE),
        "MPI_Testall");
    done_ = flag != 0;
    return done_;
  }
  void wait() override {
    // mpi_wait_policy: with a core per process it polls for the first 2 ms (napping after
    // 1,000 polls, ~0.1 ms, made a wait for a peer slightly behind cost a nap that a 2-vCPU VM
    // stretched to 0.3-0.6 ms: 2 processes on 2 cores, tensor 1d 18.2 -> 14.8 ms a step,
    // pipeline 2 14.9 -> 11.9); with more processes than cores it naps after its busy polls
    // (polling longer made 4 processes on 2 cores slower).
    static const WaitPolicy policy = mpi_wait_policy(oversubscribed());
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + std::chrono::duration<double>(timeout_);
    const auto spin_until = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                        std::chrono::duration<double>(policy.yield_seconds));
    const auto nap = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(policy.nap_seconds));
    int spins = 0;
    while (!test()) {
      const auto now = std::chrono::steady_clock::now();
      if (now > deadline)
        fail(
            "[mpi] {} did not complete within {} s: a peer has died or hung (set "
            "CAI_COLLECTIVE_TIMEOUT to change the limit)",
            what_, timeout_);
      if (++spins <= policy.busy_polls) continue;
      if (now < spin_until)
        std::this_thread::yield();  // a core shared after all (other jobs) goes to who needs it
      else
        std::this_thread::sleep_for(nap);
    }
  }

 private:
  std::string what_;
  double timeout_;
  bool done_ = false;
};

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, std::string name, bool owned, double timeout)
      : comm_(comm), name_(std::move(name)), owned_(owned) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    timeout_ = timeout;
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (auto& ops : half_ops_)
      for (MPI_Op& o : ops)
        if (o != MPI_OP_NULL) MPI_Op_free(&o);
    if (owned_) MPI_Comm_free(&comm_);
  }

  // The MPI operation reducing t's elements: MPI's own for fp32 and int32, a user operation of
  // this communicator (created on first use) for bf16 and fp16.
  MPI_Op reduce_op(const Tensor& t, ReduceOp op) {
    if (t.dtype() == DType::F32 || t.dtype() == DType::I32) return mpi_op(op);
    CAI_CHECK(t.dtype() == DType::BF16 || t.dtype() == DType::F16,
              "[mpi] cannot reduce {} tensors ({})", dtype_name(t.dtype()), t.str());
    const bool bf16 = t.dtype() == DType::BF16;
    MPI_Op& o = half_ops_[bf16 ? 0 : 1][static_cast<int>(op)];
    if (o == MPI_OP_NULL) {
      MPI_User_function* fn = nullptr;
      switch (op) {
        case ReduceOp::Sum:
          fn = bf16 ? half_reduce<true, ReduceOp::Sum> : half_reduce<false, ReduceOp::Sum>;
          break;
        case ReduceOp::Max:
          fn = bf16 ? half_reduce<true, ReduceOp::Max> : half_reduce<false, ReduceOp::Max>;
          break;
        case ReduceOp::Min:
          fn = bf16 ? half_reduce<true, ReduceOp::Min> : half_reduce<false, ReduceOp::Min>;
          break;
      }
      check_mpi(MPI_Op_create(fn, 1, &o), "MPI_Op_create");
    }
    return o;
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }

  std::unique_ptr<MpiWork> work(const char* op, int64_t n) {
    return std::make_unique<MpiWork>(
        fmt::format("{} of {} elements on group '{}' ({} ranks, rank {})", op, n, name_, size_,
                    rank_),
        timeout_);
  }

  std::unique_ptr<Work> all_reduce_async(Tensor& t, ReduceOp op) override {
    host_only(t, "all_reduce");
    auto w = work("all_reduce", t.numel());
    w->requests.resize(1);
    w->keep.push_back(t);
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, t.raw(), to_int(t.numel(), "all_reduce"), mpi_type(t),
                             reduce_op(t, op), comm_, &w->requests[0]),
              "MPI_Iallreduce");
    return w;
  }

  std::unique_ptr<Work> reduce_scatter_async(const Tensor& in, Tensor& out,
                                             const std::vector<int64_t>& counts,
                                             ReduceOp op) override {
    host_only(in, "reduce_scatter");
    check_counts("reduce_scatter", in, out, counts);
    auto w = work("reduce_scatter", in.numel());
    for (int64_t c : counts) w->counts.push_back(to_int(c, "reduce_scatter"));
    w->requests.resize(1);
    w->keep = {in, out};
    check_mpi(MPI_Ireduce_scatter(in.raw(), out.raw(), w->counts.data(), mpi_type(in),
                                  reduce_op(in, op), comm_, &w->requests[0]),
              "MPI_Ireduce_scatter");
    return w;
  }

  std::unique_ptr<Work> all_gather_async(const Tensor& in, Tensor& out,
                                         const std::vector<int64_t>& counts) override {
    host_only(in, "all_gather");
    check_counts("all_gather", out, in, counts);
    auto w = work("all_gather", out.numel());
    int64_t off = 0;
    for (int64_t c : counts) {
      w->counts.push_back(to_int(c, "all_gather"));
      w->displs.push_back(to_int(off, "all_gather"));
      off += c;
    }
    w->requests.resize(1);
    w->keep = {in, out};
    check_mpi(MPI_Iallgatherv(in.raw(), w->counts[rank_], mpi_type(in), out.raw(), w->counts.data(),
                              w->displs.data(), mpi_type(out), comm_, &w->requests[0]),
              "MPI_Iallgatherv");
    return w;
  }

  std::unique_ptr<Work> broadcast_async(Tensor& t, int root) override {
    host_only(t, "broadcast");
    CAI_CHECK(root >= 0 && root < size_, "[mpi] broadcast root {} outside group '{}' of {}", root,
              name_, size_);
    auto w = work("broadcast", t.numel());
    w->requests.resize(1);
    w->keep.push_back(t);
    check_mpi(MPI_Ibcast(t.raw(), to_int(t.numel(), "broadcast"), mpi_type(t), root, comm_,
                         &w->requests[0]),
              "MPI_Ibcast");
    return w;
  }

  std::unique_ptr<Work> send_async(const Tensor& t, int peer, int tag) override {
    host_only(t, "send");
    check_peer("send", peer);
    auto w = work(fmt::format("send to {} (tag {})", peer, tag).c_str(), t.numel());
    w->requests.resize(1);
    w->keep.push_back(t);
    check_mpi(MPI_Isend(t.raw(), to_int(t.numel(), "send"), mpi_type(t), peer, tag, comm_,
                        &w->requests[0]),
              "MPI_Isend");
    return w;
  }

  std::unique_ptr<Work> recv_async(Tensor& t, int peer, int tag) override {
    host_only(t, "recv");
    check_peer("recv", peer);
    auto w = work(fmt::format("recv from {} (tag {})", peer, tag).c_str(), t.numel());
    w->requests.resize(1);
    w->keep.push_back(t);
    check_mpi(MPI_Irecv(t.raw(), to_int(t.numel(), "recv"), mpi_type(t), peer, tag, comm_,
                        &w->requests[0]),
              "MPI_Irecv");
    return w;
  }

  void barrier() override {
    auto w = work("barrier", 0);
    w->requests.resize(1);
    check_mpi(MPI_Ibarrier(comm_, &w->requests[0]), "MPI_Ibarrier");
    w->wait();
  }

  double all_reduce_scalar(double v, ReduceOp op) override {
    auto w = work("all_reduce(scalar)", 1);
    w->requests.resize(1);
    double out = v;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, &out, 1, MPI_DOUBLE, mpi_op(op), comm_, &w->requests[0]),
              "MPI_Iallreduce");
    w->wait();
    return out;
  }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    MPI_Comm sub;
    check_mpi(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
    return std::make_unique<MpiCommunicator>(sub, name, true, timeout_);
  }

 private:
  void check_peer(const char* op, int peer) const {
    CAI_CHECK(peer >= 0 && peer < size_ && peer != rank_,
              "[mpi] {} peer {} is not another rank of group '{}' ({} ranks, this is rank {})", op,
              peer, name_, size_, rank_);
  }
  void check_counts(const char* op, const Tensor& whole, const Tensor& part,
                    const std::vector<int64_t>& counts) const {
    CAI_CHECK(static_cast<int>(counts.size()) == size_,
              "[mpi] {} needs {} counts for group '{}', got {}", op, size_, name_, counts.size());
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    CAI_CHECK(
        whole.numel() == total && part.numel() == counts[rank_] && whole.dtype() == part.dtype(),
        "[mpi] {} on group '{}': buffers of {} and {} elements do not match counts summing "
        "to {} with {} for rank {}",
        op, name_, whole.numel(), part.numel(), total, counts[rank_], rank_);
  }

  MPI_Comm comm_;
  MPI_Op half_ops_[2][3] = {{MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL},
                            {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}};  // [bf16, fp16][ReduceOp]
  std::string name_;
  bool owned_;
  int rank_ = 0, size_ = 1;
};

}  // namespace

MpiEnvironment::MpiEnvironment(int* argc, char*** argv) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    initialized_here_ = true;
  }
}

MpiEnvironment::~MpiEnvironment() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (initialized_here_ && !finalized) MPI_Finalize();
}

bool MpiEnvironment::initialized() {
  int inited = 0;
  MPI_Initialized(&inited);
  return inited != 0;
}

std::unique_ptr<Communicator> MpiEnvironment::world(double timeout_seconds) {
  if (const char* t = std::getenv("CAI_COLLECTIVE_TIMEOUT")) timeout_seconds = std::atof(t);
  CAI_CHECK(timeout_seconds > 0, "[mpi] collective timeout {} s must be positive", timeout_seconds);
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, "world", false, timeout_seconds);
}

void MpiEnvironment::abort(int code) {
  std::cerr.flush();
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

double Communicator::all_reduce_scalar(double v, ReduceOp op) {
  // fp32 transport would lose integer counts above 2^24: reduce (hi, lo) halves of the double.
  if (size() == 1) return v;
  if (op == ReduceOp::Sum) {
    const float hi = static_cast<float>(v);
    const float lo = static_cast<float>(v - static_cast<double>(hi));
    Tensor t = Tensor::from_vector(std::vector<float>{hi, lo}, {2});
    all_reduce(t, op);
    const auto r = t.to_vector();
    return static_cast<double>(r[0]) + static_cast<double>(r[1]);
  }
  Tensor t = Tensor::from_vector(std::vector<float>{static_cast<float>(v)}, {1});
  all_reduce(t, op);
  return t.item();
}

std::unique_ptr<Work> Communicator::copy_engine_all_reduce_async(Tensor&) {
  fail(
      "[dist] copy_engine_all_reduce_async on group '{}': the copy-engine all-reduce is not "
      "enabled (enable_copy_engine_all_reduce() returned false or was not called)",
      name());
}

namespace {
[[noreturn]] void exchange_not_enabled(const char* op, const std::string& group) {
  fail(
      "[dist] {} on group '{}': the copy-engine gradient exchange is not enabled "
      "(enable_copy_engine_exchange() returned false or was not called)",
      op, group);
}
}  // namespace

std::unique_ptr<Work> Communicator::exchange_sum_async(const std::vector<Tensor>&,
                                                       const std::vector<int64_t>&) {
  exchange_not_enabled("exchange_sum_async", name());
}
std::unique_ptr<Work> Communicator::exchange_push_async(const Tensor&, int64_t) {
  exchange_not_enabled("exchange_push_async", name());
}
std::unique_ptr<Work> Communicator::exchange_wait_async() {
  exchange_not_enabled("exchange_wait_async", name());
}
std::unique_ptr<Work> Communicator::exchange_end_async() {
  exchange_not_enabled("exchange_end_async", name());
}
std::vector<const float*> Communicator::exchange_received() {
  exchange_not_enabled("exchange_received", name());
}

}  // namespace cai::dist
